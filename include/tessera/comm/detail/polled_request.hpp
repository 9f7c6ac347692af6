#pragma once
/// \file comm/detail/polled_request.hpp
/// The handle of an operation that completes by polling (MPI_Test,
/// cudaEventQuery), written once for mpi_communicator and
/// nccl_communicator: the wait loop with its deadline and back-off, the
/// check of the job's error path between polls, the note for a launcher's
/// signal, and the handle's move and drain rules.

#include <chrono>
#include <concepts>
#include <memory>
#include <string>
#include <thread>

#include "tessera/comm/communicator.hpp"
#include "tessera/comm/detail/launcher_note.hpp"

namespace tessera::comm::detail {

/// What a polled operation provides: its op_ctx `c` (timeout included),
/// `done` and `err` (set together when it ends, err empty on success),
/// the rank and size of its group for the launcher note, and three hooks:
/// poll() tests once and returns done; peer_failed() ends the operation
/// and returns true when another rank of the job failed (asked every
/// peer_check_every polls); timed_out() ends it when the deadline passed.
template <class P>
concept polled_pending = requires(P& p) {
  { p.c } -> std::convertible_to<op_ctx>;
  { p.done } -> std::convertible_to<bool>;
  { p.err } -> std::convertible_to<std::string>;
  { p.group_rank() } -> std::same_as<int>;
  { p.group_size() } -> std::same_as<int>;
  { p.poll() } -> std::same_as<bool>;
  { p.peer_failed() } -> std::same_as<bool>;
  p.timed_out();
  { P::peer_check_every } -> std::convertible_to<unsigned>;
};

/// The part of a pending operation every transport shares: the
/// communicator's state `st` (its group's rank and size), the operation's
/// op_ctx, and how it ended. A transport's pending type derives from it
/// and adds its handle and the three hooks of polled_pending.
template <class State>
struct pending_core {
  State* st = nullptr;
  op_ctx c;
  bool done = false;
  std::string err;  ///< empty on success
  [[nodiscard]] int group_rank() const { return st->rank; }
  [[nodiscard]] int group_size() const { return st->size; }
};

/// Handle of an asynchronous operation of a polling communicator (a
/// `comm_request`). wait() polls until completion, another rank's failure
/// or the timeout (comm_error); test() polls once. The buffers must stay
/// alive until wait() returns; a handle destroyed or assigned to before
/// completion waits for it (errors are dropped). A handle must not outlive
/// its communicator.
template <polled_pending Pending>
class polled_request {
 public:
  polled_request() = default;
  /// Takes ownership of a pending operation (its communicator makes these).
  explicit polled_request(std::unique_ptr<Pending> p) : p_(std::move(p)) {}
  polled_request(polled_request&&) noexcept = default;
  /// Waits for the operation held (errors dropped), then takes o's.
  polled_request& operator=(polled_request&& o) noexcept {
    if (this != &o) {
      drain();
      p_ = std::move(o.p_);
    }
    return *this;
  }
  ~polled_request() { drain(); }

  /// Blocks until the operation completed; throws comm_error on timeout,
  /// another rank's failure or the transport's error. Calling it again
  /// returns (or rethrows) at once.
  void wait() {
    if (!p_) return;
    Pending& p = *p_;
    if (!p.done) {
      waiting_note note(p.c, p.group_rank(), p.group_size());
      const auto deadline = std::chrono::steady_clock::now() + p.c.timeout;
      for (unsigned spins = 0;; ++spins) {
        if (p.poll()) break;
        if (spins % Pending::peer_check_every == 0 && p.peer_failed()) break;
        if (std::chrono::steady_clock::now() >= deadline) {
          p.timed_out();
          break;
        }
        if (spins > 1000)
          std::this_thread::sleep_for(std::chrono::microseconds(20));
        else
          std::this_thread::yield();
      }
    }
    if (!p.err.empty()) throw comm_error(p.err);
  }
  /// True once the operation finished (successfully or not); never blocks.
  [[nodiscard]] bool test() {
    if (!p_) return true;
    if (!p_->done) p_->poll();
    return p_->done;
  }

 protected:
  std::unique_ptr<Pending> p_;

 private:
  void drain() noexcept {
    if (p_ && !p_->done) {
      try {
        wait();
      } catch (...) {
      }
    }
  }
};

}  // namespace tessera::comm::detail
