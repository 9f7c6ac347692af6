#pragma once
/// \file memory.hpp
/// Memory resources and allocator statistics (DESIGN.md, principle 5).
///
/// Every backend allocates through a `memory_resource` that reports
/// allocated bytes (live allocations as requested), reserved bytes (what the
/// resource holds from the system, including cached blocks) and the peak of
/// each. Tests hold the planner's predictions against these figures.

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <new>
#include <string>

#include "tessera/core/error.hpp"

namespace tessera {

/// Allocator figures, in bytes.
struct memory_stats {
  std::size_t allocated = 0;       ///< bytes in live allocations (as requested)
  std::size_t reserved = 0;        ///< bytes held from the system (>= allocated)
  std::size_t peak_allocated = 0;  ///< high-water mark of `allocated` since the last reset
  std::size_t peak_reserved = 0;   ///< high-water mark of `reserved` since the last reset
  std::size_t num_allocs = 0;      ///< allocations made since construction
};

/// Abstract memory resource. Thread-safe. Implementations: host_memory_resource
/// (aligned host memory), and in the cuda backend a caching device allocator.
class memory_resource {
public:
  virtual ~memory_resource() = default;
  /// Allocates `bytes` (may be 0) aligned to `alignment` (a power of two).
  /// Throws tessera::error naming the size if the system refuses.
  virtual void* allocate(std::size_t bytes, std::size_t alignment = 64) = 0;
  /// Returns memory from allocate(); `bytes` must match the request.
  virtual void deallocate(void* p, std::size_t bytes) noexcept = 0;
  /// Current figures.
  virtual memory_stats stats() const = 0;
  /// Resets the peaks to the current values (as torch.cuda.reset_peak_memory_stats).
  virtual void reset_peak() = 0;
  /// "host" or "cuda:N".
  virtual std::string name() const = 0;
};

/// Host memory from aligned_alloc, counted. reserved == allocated rounded up
/// to the alignment (the host resource keeps no cache).
class host_memory_resource final : public memory_resource {
public:
  void* allocate(std::size_t bytes, std::size_t alignment = 64) override {
    TESSERA_THROW_IF(alignment < sizeof(void*) || alignment > 4096 || (alignment & (alignment - 1)),
                     config_error, "alignment ", alignment,
                     " must be a power of two between ", sizeof(void*), " and 4096");
    TESSERA_THROW_IF(bytes > (std::size_t{1} << 62), out_of_memory, "host allocation of ", bytes,
                     " bytes refused: above 2^62 bytes (", allocated_.load(),
                     " bytes already allocated)");
    std::size_t rounded = round_up(std::max<std::size_t>(bytes, 1), alignment);
    void* p = std::aligned_alloc(alignment, rounded);
    TESSERA_THROW_IF(p == nullptr, out_of_memory, "host allocation of ", bytes, " bytes failed (",
                     allocated_.load(), " bytes already allocated)");
    (void)rounded;
    add(bytes);
    return p;
  }
  void deallocate(void* p, std::size_t bytes) noexcept override {
    if (!p) return;
    std::free(p);
    allocated_ -= bytes;
    reserved_ -= round_up(std::max<std::size_t>(bytes, 1), 64);
  }
  memory_stats stats() const override {
    memory_stats s;
    s.allocated = allocated_.load();
    s.reserved = reserved_.load();
    s.peak_allocated = peak_allocated_.load();
    s.peak_reserved = peak_reserved_.load();
    s.num_allocs = num_allocs_.load();
    return s;
  }
  void reset_peak() override {
    peak_allocated_ = allocated_.load();
    peak_reserved_ = reserved_.load();
  }
  std::string name() const override { return "host"; }

  static std::size_t round_up(std::size_t n, std::size_t a) { return (n + a - 1) / a * a; }

private:
  void add(std::size_t bytes) {
    std::size_t a = (allocated_ += bytes);
    // reserved is tracked with 64-byte rounding so deallocate can undo it exactly
    std::size_t r = (reserved_ += round_up(std::max<std::size_t>(bytes, 1), 64));
    ++num_allocs_;
    std::size_t p = peak_allocated_.load();
    while (a > p && !peak_allocated_.compare_exchange_weak(p, a)) {
    }
    p = peak_reserved_.load();
    while (r > p && !peak_reserved_.compare_exchange_weak(p, r)) {
    }
  }
  std::atomic<std::size_t> allocated_{0}, reserved_{0}, peak_allocated_{0}, peak_reserved_{0},
      num_allocs_{0};
};

}  // namespace tessera
