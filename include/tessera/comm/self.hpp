#pragma once
/// \file comm/self.hpp
/// `self_communicator<Ctx>`: a group of one rank (MPI_COMM_SELF's role), in
/// the memory of execution context `Ctx` (host memory for
/// kernels::host_context, device memory for kernels::cuda_context, ordered
/// on its stream). It is what a single-rank trainer runs its data-parallel
/// engine over: every collective of one rank is the identity (all_reduce,
/// broadcast, barrier touch nothing; reduce_scatter and all_gather copy
/// their one chunk), sends nothing and counts zero bytes (the ring formulas
/// at N = 1).
///
/// It has no peer: send and recv throw config_error naming the operation
/// (rank 0 of a one-rank group cannot send to or receive from itself).
/// Every operation completes when it returns (a device copy is ordered on
/// the context's stream, before any later work there), so a request's
/// wait() and test() have nothing left to do.
///
/// Ctx needs `copy(dst, src, bytes)` and `static constexpr bool
/// host_accessible` (kernels/context.hpp); its `stream()`, if it has one, is
/// the communicator's. The context is not owned and must outlive it.

#include <chrono>
#include <cstddef>
#include <cstdint>

#include "tessera/comm/communicator.hpp"
#include "tessera/core/error.hpp"

namespace tessera::comm {

/// The request of a self_communicator operation: already complete.
struct self_request {
  void wait() {}
  [[nodiscard]] bool test() { return true; }
};

/// A one-rank communicator over the memory of context `Ctx` (file comment).
template <class Ctx>
class self_communicator {
 public:
  /// Host memory for host contexts, device memory otherwise.
  static constexpr buffer_space buffers =
      Ctx::host_accessible ? buffer_space::host : buffer_space::device;

  /// A one-rank group whose copies go through `ctx` (not owned).
  explicit self_communicator(const Ctx& ctx) : ctx_(&ctx) {}
  /// A temporary context would dangle: refused.
  explicit self_communicator(const Ctx&&) = delete;

  [[nodiscard]] int rank() const { return 0; }
  [[nodiscard]] int size() const { return 1; }
  [[nodiscard]] comm_stats stats() const { return stats_; }
  [[nodiscard]] std::uint64_t bytes_sent() const { return 0; }
  void reset_stats() { stats_ = {}; }
  void set_timeout(std::chrono::milliseconds t) { timeout_ = t; }
  [[nodiscard]] std::chrono::milliseconds timeout() const { return timeout_; }
  void set_debug(bool) {}
  /// One rank issues the same collectives as itself: nothing to verify.
  void verify_collective_hash() {}
  /// The context's stream (device contexts).
  auto stream() const
    requires requires(const Ctx& c) { c.stream(); }
  {
    return ctx_->stream();
  }

  /// In place: the sum (or max) over one rank is the buffer itself.
  template <class T>
  void all_reduce(T*, std::size_t, reduce_op) {
    ++stats_.all_reduce.calls;
  }
  /// recv[0, chunk) = send[0, chunk).
  template <class T>
  void reduce_scatter(const T* send, T* recv, std::size_t chunk, reduce_op) {
    ++stats_.reduce_scatter.calls;
    if (send != recv) ctx_->copy(recv, send, chunk * sizeof(T));
  }
  /// recv[0, chunk) = send[0, chunk).
  template <class T>
  void all_gather(const T* send, T* recv, std::size_t chunk) {
    ++stats_.all_gather.calls;
    if (send != recv) ctx_->copy(recv, send, chunk * sizeof(T));
  }
  /// The root is rank 0, which holds the data. Throws config_error for another root.
  template <class T>
  void broadcast(T*, std::size_t, int root) {
    TESSERA_THROW_IF(root != 0, config_error, "self_communicator: broadcast root ", root,
                     " is not in [0, 1)");
    ++stats_.broadcast.calls;
  }
  /// Throws config_error: a one-rank group has no peer.
  template <class T>
  void send(const T*, std::size_t, int peer, int) {
    no_peer("send", peer);
  }
  /// Throws config_error: a one-rank group has no peer.
  template <class T>
  void recv(T*, std::size_t, int peer, int) {
    no_peer("recv", peer);
  }
  void barrier() { ++stats_.barrier.calls; }

  template <class T>
  self_request iall_reduce(T* p, std::size_t n, reduce_op op) {
    all_reduce(p, n, op);
    return {};
  }
  template <class T>
  self_request ireduce_scatter(const T* send, T* recv, std::size_t chunk, reduce_op op) {
    reduce_scatter(send, recv, chunk, op);
    return {};
  }
  template <class T>
  self_request iall_gather(const T* send, T* recv, std::size_t chunk) {
    all_gather(send, recv, chunk);
    return {};
  }
  template <class T>
  self_request ibroadcast(T* p, std::size_t n, int root) {
    broadcast(p, n, root);
    return {};
  }
  template <class T>
  self_request isend(const T* p, std::size_t n, int peer, int tag) {
    send(p, n, peer, tag);
    return {};
  }
  template <class T>
  self_request irecv(T* p, std::size_t n, int peer, int tag) {
    recv(p, n, peer, tag);
    return {};
  }
  self_request ibarrier() {
    barrier();
    return {};
  }
  /// Every color of one rank is a one-rank group: itself.
  self_communicator split(int, int) { return *this; }

 private:
  [[noreturn]] static void no_peer(const char* op, int peer) {
    throw config_error(detail::str("self_communicator: ", op, " to rank ", peer,
                                   ": a one-rank group has no peer (rank 0 cannot ", op,
                                   " to itself)"));
  }

  const Ctx* ctx_;
  comm_stats stats_{};
  std::chrono::milliseconds timeout_{std::chrono::seconds(300)};
};

}  // namespace tessera::comm
