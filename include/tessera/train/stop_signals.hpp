#pragma once
/// \file train/stop_signals.hpp
/// A clean stop on SIGINT and SIGTERM, what a preempted or interrupted job
/// needs (Megatron-LM's exit-signal handler does the same): while a
/// stop_signals object lives, either signal only records itself, and
/// train::fit, which polls stop_signals::requested() before each step,
/// agrees on it across ranks (a signal that reached one rank stops them
/// all after the same step), saves a checkpoint of the step it ended and
/// returns with run_end::stopped_by set. The handler writes one line to
/// stderr when the signal arrives:
///
///   tessera: SIGTERM: stopping after this step with a checkpoint (send it again to stop at once)
///
/// A second SIGINT or SIGTERM while the stop is pending ends the process at
/// once with the signal's default action, as a second Ctrl-C does. A
/// SIGTERM that arrives while a rank of this node has died is an MPI
/// launcher ending a failed job, not a request: it goes on to the
/// launcher's note (comm/detail/launcher_note.hpp), which names the lost
/// rank and ends the process.
///
///   train::stop_signals guard;        // on every process, before train::fit
///   const train::run_end e = train::fit(tr, opt);
///   if (e.stopped_by) return 128 + e.stopped_by;

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <string>

#include "tessera/comm/detail/launcher_note.hpp"

namespace tessera::train {

namespace detail {

/// The signal that asked to stop (0: none), and how many stop_signals live.
inline std::atomic<int>& stop_signal_received() {
  static std::atomic<int> s{0};
  return s;
}
inline std::atomic<int>& stop_signal_guards() {
  static std::atomic<int> n{0};
  return n;
}

/// True when mpirun's SIGTERM note is installed (comm/mpi.hpp) and a rank
/// of this node is no longer running: a SIGTERM then is the launcher
/// ending a failed job, not a request to stop. Async-signal-safe (kill
/// with signal 0).
inline bool launcher_peer_lost() noexcept {
  const auto& t = comm::detail::launcher_peer_table();
  const int saved = errno;
  bool lost = false;
  for (std::size_t i = 0; i < t.pid.size() && !lost; ++i)
    lost = static_cast<int>(i) != t.world_rank && t.same_node[i] &&
           kill(static_cast<pid_t>(t.pid[i]), 0) != 0 && errno == ESRCH;
  errno = saved;
  return lost;
}

/// The handler: only async-signal-safe calls (atomics, kill, sigaction,
/// write, raise).
inline void on_stop_signal(int sig) {
  const int saved = errno;
  if (sig == SIGTERM && launcher_peer_lost()) comm::detail::on_launcher_sigterm(sig);
  int none = 0;
  if (!stop_signal_received().compare_exchange_strong(none, sig)) {
    struct sigaction dfl {};  // the second signal: its default action, now
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, nullptr);
    raise(sig);
    errno = saved;
    return;
  }
  comm::detail::signal_text m;
  m << "tessera: " << (sig == SIGINT ? "SIGINT" : "SIGTERM")
    << ": stopping after this step with a checkpoint (send it again to stop at once)";
  m.end_line();
  for (std::size_t off = 0; off < m.len;) {
    const ssize_t w = write(STDERR_FILENO, m.buf + off, m.len - off);
    if (w <= 0) break;
    off += static_cast<std::size_t>(w);
  }
  errno = saved;
}

}  // namespace detail

/// "SIGINT", "SIGTERM", or "signal N".
inline std::string signal_name(int sig) {
  if (sig == SIGINT) return "SIGINT";
  if (sig == SIGTERM) return "SIGTERM";
  return "signal " + std::to_string(sig);
}

/// While alive, SIGINT and SIGTERM request a stop (file comment) instead of
/// ending the process; the dispositions found are restored when the last
/// one is destroyed. Construct it on every process of a job before
/// train::fit (fit's agreement on the stop is a collective it issues only
/// while one lives). Not copyable.
class stop_signals {
 public:
  stop_signals() {
    if (detail::stop_signal_guards().fetch_add(1) != 0) return;
    detail::stop_signal_received().store(0);
    struct sigaction sa {};
    sa.sa_handler = detail::on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
    owner_ = true;
  }
  ~stop_signals() {
    detail::stop_signal_guards().fetch_sub(1);
    if (!owner_) return;
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }
  stop_signals(const stop_signals&) = delete;
  stop_signals& operator=(const stop_signals&) = delete;

  /// The signal that requested a stop since the first guard was built (0:
  /// none). Async-signal-safe.
  static int requested() noexcept { return detail::stop_signal_received().load(); }
  /// Marks the request handled (train::fit, once every rank has read it):
  /// the next signal asks again instead of ending the process.
  static void consume() noexcept { detail::stop_signal_received().store(0); }
  /// True while a stop_signals lives in this process.
  static bool installed() noexcept { return detail::stop_signal_guards().load() > 0; }

 private:
  struct sigaction old_int_ {}, old_term_ {};
  bool owner_ = false;
};

}  // namespace tessera::train
