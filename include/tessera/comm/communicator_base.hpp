#pragma once
/// \file comm/communicator_base.hpp
/// What every multi-rank communicator shares, written once: the per-rank
/// bookkeeping (`detail::rank_core`: settings, sequence numbers, the
/// counters, the debug log) and the public surface built on it
/// (`communicator_base`: the blocking operations as the asynchronous ones
/// waited for, the counters, the timeout, debug mode, peer checks).
/// local_communicator, mpi_communicator and nccl_communicator derive from
/// it (CRTP) and write only their transport: the i-forms, split, and how a
/// wait makes progress. self_communicator does not: its operations
/// complete as they are issued, so it has no timeout to apply, no sequence
/// to number and no peers to check.

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "tessera/comm/communicator.hpp"
#include "tessera/comm/detail/collective_log.hpp"

namespace tessera::comm {

/// One operation as a communicator issued it (its journal,
/// comm_options::journal): what the transport was asked to execute, in
/// its own terms.
struct op_record {
  op_kind k = op_kind::barrier;
  bool collective = true;  ///< false for send and recv
  std::uint64_t seq = 0;   ///< collective sequence number, or this rank's p2p number
  std::size_t n = 0;       ///< elements (reduce_scatter, all_gather: the per-rank chunk)
  dtype dt = dtype::none;
  /// Collectives: the reduction ("sum", "max"), the root ("root 2"), the
  /// split ("color 1, key 0") or empty; p2p: the peers ("peer 3").
  std::string param;
  int group = 0;  ///< collectives: ranks in the group
  int peer = -1;  ///< p2p: the peer
  int tag = 0;    ///< p2p: the tag
};

namespace detail {

/// One rank's calls and bytes per operation. Relaxed atomics: a helper
/// thread (local_communicator's) may count bytes while the issuing thread
/// counts calls or reads a snapshot.
class op_counters {
 public:
  /// Adds `calls` calls and `bytes` bytes to operation k (split counts as
  /// the parent's all_gather, as comm_stats::of says).
  void add(op_kind k, std::uint64_t calls, std::uint64_t bytes) {
    const std::size_t i = slot(k);
    calls_[i].fetch_add(calls, std::memory_order_relaxed);
    bytes_[i].fetch_add(bytes, std::memory_order_relaxed);
  }
  /// The counters now.
  [[nodiscard]] comm_stats snapshot() const {
    comm_stats s;
    for (op_kind k : kinds) {
      const std::size_t i = slot(k);
      s.of(k) = {calls_[i].load(std::memory_order_relaxed),
                 bytes_[i].load(std::memory_order_relaxed)};
    }
    return s;
  }
  /// Zeroes every counter.
  void reset() {
    for (std::size_t i = 0; i < kinds.size(); ++i) {
      calls_[i].store(0, std::memory_order_relaxed);
      bytes_[i].store(0, std::memory_order_relaxed);
    }
  }

 private:
  static constexpr std::array kinds = {
      op_kind::all_reduce, op_kind::reduce_scatter, op_kind::all_gather, op_kind::broadcast,
      op_kind::send,       op_kind::recv,           op_kind::barrier};
  static constexpr std::size_t slot(op_kind k) {
    for (std::size_t i = 0; i < kinds.size(); ++i)
      if (kinds[i] == k) return i;
    return 2;  // split: the parent's all_gather
  }
  std::array<std::atomic<std::uint64_t>, kinds.size()> calls_{}, bytes_{};
};

/// The bookkeeping of one rank of one communicator, whatever carries its
/// bytes: the settings, the collective and point-to-point sequence numbers,
/// the counters and the debug log. Lives in the communicator's heap state
/// (requests point at it); issued from one thread at a time.
struct rank_core {
  comm_options opt;
  std::uint64_t coll_seq = 0, p2p_seq = 0;
  op_counters counters;
  collective_log log;
  std::vector<op_record> journal;  // every operation issued while opt.journal

  /// Applies `o` (the debug log restarts when debug mode is on).
  void configure(const comm_options& o) {
    opt = o;
    log.configure(o.debug, o.history);
  }
  /// Numbers the next collective of a group of `group` ranks, records it
  /// in the debug log and counts one call and `bytes` bytes sent.
  [[nodiscard]] op_ctx collective(op_kind k, std::size_t n, dtype d, std::string extra, int group,
                                  std::uint64_t bytes) {
    op_ctx c{k, coll_seq++, n, d, std::move(extra), opt.timeout, true, 0};
    log.record(c.seq, k, group, n, d, c.extra);
    if (opt.journal) journal.push_back({k, true, c.seq, n, d, c.extra, group, -1, 0});
    counters.add(k, 1, bytes);
    return c;
  }
  /// Numbers this rank's next point-to-point operation with `peer` and
  /// counts one call and `bytes` bytes. `extra` names the peers in errors
  /// ("peer 3" when empty).
  [[nodiscard]] op_ctx p2p(op_kind k, std::size_t n, dtype d, int peer, int tag,
                           std::uint64_t bytes, std::string extra = {}) {
    if (extra.empty()) extra = str("peer ", peer);
    op_ctx c{k, p2p_seq++, n, d, std::move(extra), opt.timeout, false, tag};
    if (opt.journal) journal.push_back({k, false, c.seq, n, d, c.extra, 0, peer, tag});
    counters.add(k, 1, bytes);
    return c;
  }
};

/// A blocking operation that needs nothing around its wait.
struct no_scope {};

/// A communicator with grouped point-to-point operations (nccl_communicator).
template <class C>
concept issues_p2p_groups = requires(C& c, std::span<const p2p_op> ops) {
  c.igroup_p2p(ops);
};

}  // namespace detail

/// The surface every multi-rank communicator shares, over `Derived`'s
/// asynchronous operations (CRTP). Derived provides rank(), size(),
/// core() (its detail::rank_core), who() ("rank 2 of 4 (world rank 6)"),
/// the i-forms returning a comm_request, and optionally
/// blocking_scope(): an object alive while a blocking collective is issued
/// and waited for (local_communicator runs such a collective on the calling
/// thread).
template <class Derived>
class communicator_base {
 public:
  /// Bytes this rank sent (ring formulas, communicator.hpp) and calls it
  /// issued, per operation, since the last reset. Sub-communicators count
  /// apart.
  [[nodiscard]] comm_stats stats() const { return self().core().counters.snapshot(); }
  /// Total bytes this rank sent since the last reset.
  [[nodiscard]] std::uint64_t bytes_sent() const { return stats().bytes_sent(); }
  /// Zeroes the counters. Call when no asynchronous operation is pending.
  void reset_stats() { self().core().counters.reset(); }
  /// Sets the timeout of operations issued from now on.
  void set_timeout(std::chrono::milliseconds t) { self().core().opt.timeout = t; }
  /// The current timeout.
  [[nodiscard]] std::chrono::milliseconds timeout() const { return self().core().opt.timeout; }
  /// Turns the collective-hash debug mode on or off (every rank alike,
  /// before the collectives to be checked; verify_collective_hash()).
  void set_debug(bool on) {
    auto& c = self().core();
    c.opt.debug = on;
    c.log.configure(on, c.opt.history);
  }
  /// Turns the journal on or off (comm_options::journal; communicators
  /// split from this one later inherit it). What was recorded is kept.
  void set_journal(bool on) { self().core().opt.journal = on; }
  /// Every operation issued while the journal was on, in issue order (a
  /// group_p2p of nccl_communicator as one entry, sendrecv as its send).
  /// Read from the issuing thread.
  [[nodiscard]] const std::vector<op_record>& journal() const { return self().core().journal; }

  /// iall_reduce(buf, n, op), waited for: buf[0, n) becomes the reduction
  /// over the group, the same on every rank. Throws as wait() does.
  template <class T>
  requires communicator_async_ops<Derived, T>
  void all_reduce(T* buf, std::size_t n, reduce_op op) {
    [[maybe_unused]] auto scope = self().blocking_scope();
    self().iall_reduce(buf, n, op).wait();
  }
  /// ireduce_scatter(send, recv, chunk, op), waited for: recv[0, chunk) =
  /// op over ranks of send[rank*chunk, (rank+1)*chunk).
  template <class T>
  requires communicator_async_ops<Derived, T>
  void reduce_scatter(const T* send, T* recv, std::size_t chunk, reduce_op op) {
    [[maybe_unused]] auto scope = self().blocking_scope();
    self().ireduce_scatter(send, recv, chunk, op).wait();
  }
  /// iall_gather(send, recv, chunk), waited for: recv[r*chunk, (r+1)*chunk)
  /// = send of rank r.
  template <class T>
  requires communicator_async_ops<Derived, T>
  void all_gather(const T* send, T* recv, std::size_t chunk) {
    [[maybe_unused]] auto scope = self().blocking_scope();
    self().iall_gather(send, recv, chunk).wait();
  }
  /// ibroadcast(buf, n, root), waited for: every rank's buf[0, n) = root's.
  template <class T>
  requires communicator_async_ops<Derived, T>
  void broadcast(T* buf, std::size_t n, int root) {
    [[maybe_unused]] auto scope = self().blocking_scope();
    self().ibroadcast(buf, n, root).wait();
  }
  /// isend(buf, n, peer, tag), waited for.
  template <class T>
  requires communicator_async_ops<Derived, T>
  void send(const T* buf, std::size_t n, int peer, int tag) {
    self().isend(buf, n, peer, tag).wait();
  }
  /// irecv(buf, n, peer, tag), waited for.
  template <class T>
  requires communicator_async_ops<Derived, T>
  void recv(T* buf, std::size_t n, int peer, int tag) { self().irecv(buf, n, peer, tag).wait(); }
  /// isendrecv(...), waited for (communicators that have it).
  template <class T>
  requires requires(Derived& d, const T* s, T* r, std::size_t n, int p) {
    d.isendrecv(s, p, r, p, n, p);
  }
  void sendrecv(const T* send, int dst, T* recv, int src, std::size_t n, int tag) {
    self().isendrecv(send, dst, recv, src, n, tag).wait();
  }
  /// igroup_p2p(ops), waited for (communicators that have it).
  void group_p2p(std::span<const p2p_op> ops) requires detail::issues_p2p_groups<Derived> {
    self().igroup_p2p(ops).wait();
  }
  /// ibarrier(), waited for: returns once every rank entered.
  void barrier() {
    [[maybe_unused]] auto scope = self().blocking_scope();
    self().ibarrier().wait();
  }

 protected:
  /// Throws config_error naming `what` unless 0 <= peer < size().
  void check_peer(int peer, const char* what) const {
    TESSERA_THROW_IF(peer < 0 || peer >= self().size(), config_error, self().who(), ": ", what, " ",
                     peer, " is not in [0, ", self().size(), ")");
  }
  /// Nothing to hold around a blocking wait (the default).
  static detail::no_scope blocking_scope() { return {}; }

 private:
  Derived& self() { return static_cast<Derived&>(*this); }
  const Derived& self() const { return static_cast<const Derived&>(*this); }
};

}  // namespace tessera::comm
