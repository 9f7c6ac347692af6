#pragma once
/// \file nn/record_pool.hpp
/// Activation records from a pool (DESIGN.md, "Seams"): one record per
/// micro-batch in flight, so a schedule can run several forwards before
/// their backwards. A record is acquired by its micro-batch's forward and
/// given back by its backward; the pool never holds more than `capacity`
/// at once, the most micro-batches the schedule keeps in flight (1 without
/// a pipeline, up to the number of stages for 1F1B, all of them for GPipe).
///
/// The pool holds the record objects, not their memory: a record's tensors
/// are allocated by the model's forward (from the context's resource) and
/// freed by its backward, so the bytes in flight are the records' bytes.

#include <cstdint>
#include <vector>

#include "tessera/core/error.hpp"

namespace tessera::nn {

/// `capacity` records of type `Record` (e.g. llama<P, B>::record), handed
/// out by micro-batch index.
template <class Record>
class record_pool {
 public:
  /// Throws config_error if capacity < 1.
  explicit record_pool(std::int64_t capacity) {
    TESSERA_THROW_IF(capacity < 1, config_error, "record_pool: capacity ", capacity,
                     " must be >= 1");
    records_.resize(static_cast<std::size_t>(capacity));
    owner_.assign(static_cast<std::size_t>(capacity), -1);
  }

  /// The record of micro-batch `m`, taken from a free slot. Throws
  /// tessera::error if m already holds one, or if every slot is in use
  /// (naming the micro-batches that hold them: more in flight than the
  /// schedule said).
  Record& acquire(std::int64_t m) {
    TESSERA_THROW_IF(find(m) >= 0, error, "record_pool: micro-batch ", m,
                     " already holds a record (its backward has not run)");
    for (std::size_t i = 0; i < owner_.size(); ++i)
      if (owner_[i] < 0) {
        owner_[i] = m;
        ++in_flight_;
        if (in_flight_ > peak_) peak_ = in_flight_;
        return records_[i];
      }
    throw error(tessera::detail::str("record_pool: all ", owner_.size(),
                            " records are in flight; micro-batch ", m,
                            " needs one more (raise the capacity to the schedule's peak)"));
  }
  /// The record micro-batch `m` holds. Throws tessera::error if it holds none.
  Record& at(std::int64_t m) {
    const std::int64_t i = find(m);
    TESSERA_THROW_IF(i < 0, error, "record_pool: micro-batch ", m, " holds no record");
    return records_[static_cast<std::size_t>(i)];
  }
  /// Gives micro-batch m's record back (after its backward emptied it).
  void release(std::int64_t m) {
    const std::int64_t i = find(m);
    TESSERA_THROW_IF(i < 0, error, "record_pool: micro-batch ", m, " holds no record");
    owner_[static_cast<std::size_t>(i)] = -1;
    --in_flight_;
  }
  /// Drops every record (after a failed step): their tensors are freed.
  void clear() {
    for (std::size_t i = 0; i < records_.size(); ++i) {
      records_[i] = Record{};
      owner_[i] = -1;
    }
    in_flight_ = 0;
  }

  std::int64_t capacity() const { return static_cast<std::int64_t>(records_.size()); }
  /// Records held now.
  std::int64_t in_flight() const { return in_flight_; }
  /// The most records held at once since construction.
  std::int64_t peak_in_flight() const { return peak_; }

 private:
  std::int64_t find(std::int64_t m) const {
    for (std::size_t i = 0; i < owner_.size(); ++i)
      if (owner_[i] == m) return static_cast<std::int64_t>(i);
    return -1;
  }
  std::vector<Record> records_;
  std::vector<std::int64_t> owner_;  // the micro-batch holding slot i, or -1
  std::int64_t in_flight_ = 0, peak_ = 0;
};

}  // namespace tessera::nn
