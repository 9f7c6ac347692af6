#pragma once
/// \file launcher_note.hpp
/// The SIGTERM note of a multi-process job (POSIX, no MPI calls): when a
/// launcher (mpirun) ends a job because one process died, it stops the
/// others with SIGTERM; with the note installed each of them first writes
/// one line to stderr naming itself, the training step (`note_step`), the
/// communicator operation it was waiting in (`waiting_note`) and the
/// processes of its node that are no longer running, e.g.
///
///   tessera: world rank 3 of 4 (pid 11710) stopped by SIGTERM from its
///   launcher at step 34, waiting in all_reduce #150 (n=34976 float) as rank
///   3 of 4: lost world rank 2 (pid 11709), no longer running on this node
///
/// then ends by the signal as it would have without the note. mpi.hpp
/// installs it when the first communicator on the world is built, after
/// exchanging pids and processor names.

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "tessera/comm/communicator.hpp"

namespace tessera::comm::detail {

/// The world's processes as the installer saw them, by world rank. Never
/// freed (a SIGTERM may arrive while the process exits), written once
/// before the handler is installed, read only by it.
struct launcher_peers {
  std::vector<long> pid;        ///< pid of each world rank
  std::vector<char> same_node;  ///< 1 where that rank runs on this node
  int world_rank = 0;           ///< this process's world rank
  int world_size = 1;           ///< ranks in the world
};
inline launcher_peers& launcher_peer_table() {
  static auto* t = new launcher_peers;  // leaked on purpose: read by a signal handler at exit
  return *t;
}

/// Text built without allocation, for a signal handler: a fixed buffer that
/// keeps its last byte for the newline.
struct signal_text {
  char buf[1024];
  std::size_t len = 0;
  signal_text& operator<<(const char* s) noexcept {
    while (*s && len + 2 < sizeof buf) buf[len++] = *s++;
    return *this;
  }
  signal_text& operator<<(std::uint64_t v) noexcept {
    char d[24];
    int k = 0;
    do {
      d[k++] = static_cast<char>('0' + v % 10);
      v /= 10;
    } while (v != 0);
    while (k > 0 && len + 2 < sizeof buf) buf[len++] = d[--k];
    return *this;
  }
  void end_line() noexcept { buf[len++] = '\n'; }
};

/// The SIGTERM handler: the line above, then the default action (set back
/// with sigaction here, so a handler that chains to this one cannot loop),
/// and raise(). Only async-signal-safe calls: atomics, getpid, kill,
/// sigaction, write, raise.
inline void on_launcher_sigterm(int sig) {
  const int saved = errno;
  const auto& t = launcher_peer_table();
  const auto& a = activity();
  signal_text m;
  m << "tessera: world rank " << static_cast<std::uint64_t>(t.world_rank) << " of "
    << static_cast<std::uint64_t>(t.world_size) << " (pid " << static_cast<std::uint64_t>(getpid())
    << ") stopped by SIGTERM from its launcher ";
  const std::int64_t step = a.step.load(std::memory_order_relaxed);
  if (step < 0)
    m << "before the first step";
  else
    m << "at step " << static_cast<std::uint64_t>(step);
  const int kind = a.kind.load(std::memory_order_acquire);
  if (kind < 0) {
    m << ", computing (in no communicator operation)";
  } else {
    m << ", waiting in " << to_string(static_cast<op_kind>(kind)) << " #"
      << a.seq.load(std::memory_order_relaxed) << " (n=" << a.n.load(std::memory_order_relaxed)
      << " " << to_string(static_cast<dtype>(a.dt.load(std::memory_order_relaxed)))
      << ") as rank " << static_cast<std::uint64_t>(a.rank.load(std::memory_order_relaxed))
      << " of " << static_cast<std::uint64_t>(a.size.load(std::memory_order_relaxed));
  }
  std::uint64_t lost = 0, elsewhere = 0;
  const auto n = static_cast<int>(t.pid.size());
  for (int r = 0; r < n; ++r) {
    if (r == t.world_rank) continue;
    const auto i = static_cast<std::size_t>(r);
    if (!t.same_node[i]) {
      ++elsewhere;
      continue;
    }
    // mpirun has reaped a dead rank before it stops the others: ESRCH.
    if (kill(static_cast<pid_t>(t.pid[i]), 0) == 0 || errno != ESRCH) continue;
    m << (lost++ == 0 ? ": lost " : ", ") << "world rank " << static_cast<std::uint64_t>(r)
      << " (pid " << static_cast<std::uint64_t>(t.pid[i]) << ")";
  }
  if (lost > 0)
    m << ", no longer running on this node";
  else
    m << ": every other rank on this node is still running";
  if (elsewhere > 0)
    m << " (" << elsewhere << (elsewhere == 1 ? " rank" : " ranks") << " on other nodes not checked)";
  m.end_line();
  for (std::size_t off = 0; off < m.len;) {
    const ssize_t w = write(STDERR_FILENO, m.buf + off, m.len - off);
    if (w <= 0) break;
    off += static_cast<std::size_t>(w);
  }
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, nullptr);
  errno = saved;
  raise(sig);
}

/// Installs on_launcher_sigterm for a world of `pid.size()` ranks (pids and
/// same-node flags by world rank), unless the world has one rank or the
/// program already handles SIGTERM (its disposition is not SIG_DFL). Call
/// once, before any other thread reads the table. If sigaction fails the
/// note is simply not installed. Never throws after the copies.
inline void install_launcher_note(int world_rank, std::vector<long> pid,
                                  std::vector<char> same_node) {
  if (pid.size() < 2 || same_node.size() != pid.size()) return;
  auto& t = launcher_peer_table();
  if (!t.pid.empty()) return;  // installed already
  t.world_rank = world_rank;
  t.world_size = static_cast<int>(pid.size());
  t.pid = std::move(pid);
  t.same_node = std::move(same_node);
  (void)activity();  // constructed before the handler can read it
  struct sigaction old {};
  if (sigaction(SIGTERM, nullptr, &old) != 0 || old.sa_handler != SIG_DFL ||
      (old.sa_flags & SA_SIGINFO) != 0)
    return;
  struct sigaction sa {};
  sa.sa_handler = on_launcher_sigterm;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
}

/// Marks, for its lifetime, the operation a wait() is blocked in (the
/// activity_note the SIGTERM note reads): op `c` on rank `rank` of a group
/// of `size`.
struct waiting_note {
  waiting_note(const op_ctx& c, int rank, int size) noexcept {
    auto& a = activity();
    a.seq.store(c.seq, std::memory_order_relaxed);
    a.n.store(c.n, std::memory_order_relaxed);
    a.dt.store(static_cast<int>(c.dt), std::memory_order_relaxed);
    a.rank.store(rank, std::memory_order_relaxed);
    a.size.store(size, std::memory_order_relaxed);
    a.kind.store(static_cast<int>(c.k), std::memory_order_release);
  }
  ~waiting_note() { activity().kind.store(-1, std::memory_order_relaxed); }
  waiting_note(const waiting_note&) = delete;
  waiting_note& operator=(const waiting_note&) = delete;
};

}  // namespace tessera::comm::detail
