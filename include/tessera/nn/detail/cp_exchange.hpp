#pragma once
/// \file nn/detail/cp_exchange.hpp
/// The point-to-point traffic of context parallelism (nn/context_parallel.hpp),
/// over any communicator: the element type a tensor travels in (its own, or
/// float for a 16-bit tensor on a host communicator, which moves float and
/// double), a batch of sends and receives issued together (one NCCL group
/// where the communicator has groups, so that ring shifts and all-to-alls
/// cannot deadlock on a stream; isend/irecv otherwise), the all-to-all
/// built on it, and the chunk-major copies of a rank's two token chunks.

#include <cstddef>
#include <cstdint>
#include <exception>
#include <type_traits>
#include <utility>
#include <vector>

#include "tessera/comm/communicator.hpp"
#include "tessera/comm/communicator_base.hpp"
#include "tessera/comm/tags.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/kernels/context.hpp"
#include "tessera/kernels/elementwise.hpp"

namespace tessera::nn::detail {

/// True when `Comm` sends and receives elements of type U as they are.
template <class Comm, class U>
inline constexpr bool cp_moves_natively = requires(Comm& c, const U* s, U* d, std::size_t n) {
  c.isend(s, n, 0, 0);
  c.irecv(d, n, 0, 0);
};

template <class Comm, class U>
consteval bool cp_check_wire() {
  static_assert(cp_moves_natively<Comm, U> ||
                    (sizeof(U) == 2 && comm::buffer_space_of<Comm> == comm::buffer_space::host),
                "context parallelism: this communicator cannot move the tensor's element type "
                "(16-bit tensors travel as float on host communicators; others must be native)");
  return true;
}

/// The element type a U travels in on `Comm`: U, or float for a 16-bit U
/// on a host communicator (widened exactly, narrowed exactly on arrival:
/// the values are the 16-bit ones; the bytes are those of floats).
template <class Comm, class U>
using cp_wire_t = std::conditional_t<cp_moves_natively<Comm, U>, U, float>;

/// The dtype tag of an element type (for a group's p2p_op).
template <class U>
constexpr comm::dtype cp_dtype() {
  if constexpr (std::is_same_v<U, float>)
    return comm::dtype::f32;
  else if constexpr (std::is_same_v<U, double>)
    return comm::dtype::f64;
  else if constexpr (std::is_same_v<U, std::int32_t>)
    return comm::dtype::i32;
  else if constexpr (std::is_same_v<U, bf16>)
    return comm::dtype::bf16;
  else if constexpr (std::is_same_v<U, fp16>)
    return comm::dtype::f16;
  else
    static_assert(sizeof(U) == 0, "context parallelism: no dtype for this element type");
}

/// Sends and receives issued together and waited for together: one
/// igroup_p2p (NCCL) at start(), or each isend/irecv as it is added.
/// Buffers must stay alive and untouched until wait() returns; the
/// destructor waits for what is pending (dropping errors) so that no
/// receive writes into freed memory when an exception unwinds.
template <class Comm>
class cp_batch {
  using request =
      decltype(std::declval<Comm&>().isend(std::declval<const float*>(), std::size_t{}, 0, 0));
  static constexpr bool grouped = comm::detail::issues_p2p_groups<Comm>;

 public:
  explicit cp_batch(Comm& c) : c_(c) {}
  cp_batch(const cp_batch&) = delete;
  cp_batch& operator=(const cp_batch&) = delete;
  ~cp_batch() {
    for (auto& r : reqs_) try {
        r.wait();
      } catch (...) {
      }
  }

  /// Adds a send of p[0, n) to `peer`.
  template <class U>
  void send(const U* p, std::int64_t n, int peer, int tag) {
    const auto un = static_cast<std::size_t>(n);
    if constexpr (grouped)
      ops_.push_back(comm::p2p_op::send(p, un, cp_dtype<U>(), peer, tag));
    else
      reqs_.push_back(c_.isend(p, un, peer, tag));
  }
  /// Adds a receive of n elements from `peer` into p.
  template <class U>
  void recv(U* p, std::int64_t n, int peer, int tag) {
    const auto un = static_cast<std::size_t>(n);
    if constexpr (grouped)
      ops_.push_back(comm::p2p_op::recv(p, un, cp_dtype<U>(), peer, tag));
    else
      reqs_.push_back(c_.irecv(p, un, peer, tag));
  }
  /// Issues what was added (a group issues here; isend/irecv already did).
  void start() {
    if constexpr (grouped) {
      if (!ops_.empty()) reqs_.push_back(c_.igroup_p2p(ops_));
      ops_.clear();
    }
  }
  /// Waits for everything issued; rethrows the first error.
  void wait() {
    std::vector<request> reqs = std::move(reqs_);
    reqs_.clear();
    std::exception_ptr first;
    for (auto& r : reqs) try {
        r.wait();
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    if (first) std::rethrow_exception(first);
  }

 private:
  Comm& c_;
  std::vector<comm::p2p_op> ops_;
  std::vector<request> reqs_;
};

/// Bytes of one slot of an all-to-all of n elements of U on Comm (the
/// staging holds 2 cp of them: cp to send, cp to receive).
template <class Comm, class U>
constexpr std::int64_t cp_slot_bytes(std::int64_t n) {
  return n * static_cast<std::int64_t>(sizeof(cp_wire_t<Comm, U>));
}

/// All-to-all of n elements of U per pair over `g`, through `staging`
/// (2 cp slots of cp_slot_bytes<Comm, U>(n) bytes, context memory):
/// pack(j, U* dst) writes the n elements for rank j (this rank's own
/// included), then unpack(slot) runs with slot(j) -> U* the n elements
/// rank j sent (the own ones for j = rank), writable. On a host
/// communicator a 16-bit U travels as float (widened after packing,
/// narrowed before unpacking). Sends (cp - 1) n wire elements.
template <class U, class Ctx, class Comm, class Pack, class Unpack>
void cp_all_to_all(const Ctx& ctx, Comm& g, std::uint8_t* staging, std::int64_t n, Pack&& pack,
                   Unpack&& unpack) {
  static_assert(cp_check_wire<Comm, U>());
  using W = cp_wire_t<Comm, U>;
  const int cp = g.size(), r = g.rank();
  const std::int64_t slot = cp_slot_bytes<Comm, U>(n);
  std::uint8_t* const send = staging;
  std::uint8_t* const recv = staging + cp * slot;
  auto at = [&](std::uint8_t* area, int j) { return area + j * slot; };
  cp_batch<Comm> x(g);
  if constexpr (std::is_same_v<W, U>) {
    for (int j = 0; j < cp; ++j) pack(j, reinterpret_cast<U*>(j == r ? at(recv, r) : at(send, j)));
    for (int j = 0; j < cp; ++j) {
      if (j == r) continue;
      x.send(reinterpret_cast<const W*>(at(send, j)), n, j, comm::cp_tag_a2a);
      x.recv(reinterpret_cast<W*>(at(recv, j)), n, j, comm::cp_tag_a2a);
    }
    x.start();
    x.wait();
    unpack([&](int j) { return reinterpret_cast<U*>(at(recv, j)); });
  } else {
    // Packed as U into the receive slots (free until the receives are
    // posted), widened into the send slots; arrivals narrowed into the
    // send slots (free once the sends completed).
    for (int j = 0; j < cp; ++j) {
      pack(j, reinterpret_cast<U*>(at(recv, j)));
      if (j != r)
        cast(ctx, reinterpret_cast<W*>(at(send, j)), reinterpret_cast<const U*>(at(recv, j)), n);
    }
    for (int j = 0; j < cp; ++j) {
      if (j == r) continue;
      x.send(reinterpret_cast<const W*>(at(send, j)), n, j, comm::cp_tag_a2a);
      x.recv(reinterpret_cast<W*>(at(recv, j)), n, j, comm::cp_tag_a2a);
    }
    x.start();
    x.wait();
    for (int j = 0; j < cp; ++j)
      if (j != r)
        cast(ctx, reinterpret_cast<U*>(at(send, j)), reinterpret_cast<const W*>(at(recv, j)), n);
    unpack([&](int j) { return reinterpret_cast<U*>(j == r ? at(recv, r) : at(send, j)); });
  }
}

/// (outer, 2c, X) -> chunk-major (2, outer, c, X): a rank's two token
/// chunks, each dense, for the attention kernels (whose batch stride is
/// the rows they are given).
template <class U, class Ctx>
void cp_to_chunks(const Ctx& ctx, U* dst, const U* src, std::int64_t outer, std::int64_t c,
                  std::int64_t X) {
  for (std::int64_t j = 0; j < 2; ++j)
    kernels::copy_rows(ctx, dst + j * outer * c * X, c * X, src + j * c * X, 2 * c * X, c * X,
                       outer);
}
/// Chunk-major (2, outer, c, X) -> (outer, 2c, X): cp_to_chunks undone.
template <class U, class Ctx>
void cp_from_chunks(const Ctx& ctx, U* dst, const U* src, std::int64_t outer, std::int64_t c,
                    std::int64_t X) {
  for (std::int64_t j = 0; j < 2; ++j)
    kernels::copy_rows(ctx, dst + j * c * X, 2 * c * X, src + j * outer * c * X, c * X, c * X,
                       outer);
}

}  // namespace tessera::nn::detail
