#pragma once
/// \file train/stop_signals.hpp
/// A clean stop on SIGINT and SIGTERM, what a preempted or interrupted job
/// needs (Megatron-LM's exit-signal handler does the same): while a
/// stop_signals object lives, either signal only records itself, and
/// train::fit under run_options::stop_on_signals, which reads
/// stop_signals::requested() as every rank agrees before each step (a
/// signal that reached one rank stops them all after the same step: the
/// current one, or the next where that rank was already waiting to agree),
/// saves a checkpoint of the step it ended and returns with
/// run_end::stopped_by set. The handler writes one line to
/// stderr when the signal arrives:
///
///   tessera: SIGTERM: stopping after this step with a checkpoint (send it again to stop at once)
///
/// A second SIGINT or SIGTERM while the stop is pending ends the process at
/// once with the signal's default action, as a second Ctrl-C does, unless
/// it comes within a second of the first: that one is the same request
/// delivered twice (`timeout -s INT` signals the process and then its
/// process group; a launcher may forward what the terminal sent too). A
/// SIGTERM that arrives while a rank of this node has died is an MPI
/// launcher ending a failed job, not a request: it goes on to the
/// launcher's note (comm/detail/launcher_note.hpp), which names the lost
/// rank and ends the process.
///
///   train::stop_signals guard;        // on every process, before its ranks start
///   opt.stop_on_signals = true;       // on every rank
///   const train::run_end e = train::fit(tr, opt);
///   if (e.stopped_by) return 128 + e.stopped_by;

#include <signal.h>
#include <time.h>
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
/// CLOCK_MONOTONIC nanoseconds of the signal that asked to stop.
inline std::atomic<long long>& stop_signal_time() {
  static std::atomic<long long> t{0};
  return t;
}
/// CLOCK_MONOTONIC now, in nanoseconds (async-signal-safe).
inline long long monotonic_ns() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<long long>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}
/// A repeat of the stop signal within this many nanoseconds is the same request.
inline constexpr long long stop_signal_repeat_ns = 1000000000LL;
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
/// write, raise, clock_gettime; the launcher's tables were built before it
/// was installed).
inline void on_stop_signal(int sig) {
  const int saved = errno;
  if (sig == SIGTERM && launcher_peer_lost()) {
    comm::detail::on_launcher_sigterm(sig);  // the default action, pending until this returns
    errno = saved;
    return;
  }
  int none = 0;
  const long long now = monotonic_ns();
  if (!stop_signal_received().compare_exchange_strong(none, sig)) {
    if (now - stop_signal_time().load() < stop_signal_repeat_ns) {  // the same request again
      errno = saved;
      return;
    }
    struct sigaction dfl {};  // the second signal: its default action, now
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, nullptr);
    raise(sig);
    errno = saved;
    return;
  }
  stop_signal_time().store(now);
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
/// ending the process; the dispositions found by the first are restored
/// when the last is destroyed. Precondition: built and destroyed on one
/// thread, outside train::fit (a program holds one around its ranks: on
/// every process, before its rank threads start). Not copyable.
class stop_signals {
 public:
  stop_signals() {
    if (detail::stop_signal_guards().fetch_add(1) != 0) return;
    detail::stop_signal_received().store(0);
    (void)comm::detail::launcher_peer_table();  // built here, not in the handler
    (void)comm::detail::activity();
    struct sigaction sa {};
    sa.sa_handler = detail::on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, &old()[0]);
    sigaction(SIGTERM, &sa, &old()[1]);
  }
  ~stop_signals() {
    if (detail::stop_signal_guards().fetch_sub(1) != 1) return;
    sigaction(SIGINT, &old()[0], nullptr);
    sigaction(SIGTERM, &old()[1], nullptr);
  }
  stop_signals(const stop_signals&) = delete;
  stop_signals& operator=(const stop_signals&) = delete;

  /// The signal that requested a stop since the first guard was built (0:
  /// none). Async-signal-safe.
  static int requested() noexcept { return detail::stop_signal_received().load(); }
  /// Marks the request handled (train::fit, once every rank has read it
  /// and the stop's checkpoint is saved): the next signal asks again
  /// instead of ending the process.
  static void consume() noexcept { detail::stop_signal_received().store(0); }
  /// True while a stop_signals lives in this process.
  static bool installed() noexcept { return detail::stop_signal_guards().load() > 0; }

 private:
  // SIGINT's and SIGTERM's dispositions before the first guard.
  static struct sigaction* old() {
    static struct sigaction o[2]{};
    return o;
  }
};

}  // namespace tessera::train
