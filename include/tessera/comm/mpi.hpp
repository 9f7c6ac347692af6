#pragma once
/// \file mpi.hpp
/// `mpi_communicator`: ranks are MPI processes (one machine or many). Built
/// only with TESSERA_HAS_MPI (link `tessera::mpi`).
///
/// Collectives are MPI's nonblocking calls (MPI_Iallreduce,
/// MPI_Ireduce_scatter_block, MPI_Iallgather, MPI_Ibcast, MPI_Ibarrier,
/// MPI_Isend, MPI_Irecv); a blocking operation is its nonblocking form
/// followed by wait(), and wait() polls MPI_Test until the request completes
/// or `timeout` has passed since wait() was called. So every operation,
/// blocking or not, times out with comm_error naming the rank, the operation,
/// its sequence number, the count and the bytes. Every MPI return code is
/// checked (the communicator's error handler is MPI_ERRORS_RETURN) and turned
/// into comm_error naming the call and the code.
///
/// Bytes are counted with the ring formulas of communicator.hpp (what the
/// ring algorithm sends), whatever algorithm Open MPI picks underneath.
///
/// Failure under MPI: the job has an error path. A rank that fails (any
/// error it catches, a timeout of its own included) reports it with
/// `mpi_notify_failure(why)`, which sends a notice to every other rank;
/// their pending and later operations on every mpi_communicator throw
/// comm_error at once with "world rank R failed: why", so every rank ends
/// within moments with the cause instead of waiting for its timeout (a
/// timeout alone breaks only its communicator: the others stay usable). A
/// collective that failed is still pending inside MPI and cannot be
/// cancelled: the communicator is broken afterwards (later operations
/// throw at once), and after a notice mpi_environment does not call
/// MPI_Finalize (which would progress it); a program ends after reporting,
/// or calls `mpi_abort(message)`. A process that dies (kill -9) makes mpirun
/// end the whole job, naming it: it stops the others with SIGTERM, and each
/// of them (when SIGTERM had its default action as the first communicator on
/// the world was built) first writes one line naming itself, the step (from
/// `note_step`), the operation it was waiting in, and which ranks on its
/// node are no longer running (their pids were exchanged at start-up), then
/// ends by the signal as before. A timed-out collective with no notice names the
/// operation but not the absent rank (MPI does not say; use debug mode and
/// `verify_collective_hash()`); a timed-out receive names its peer.
///
/// Determinism: results are identical run to run for the same process
/// count, sizes and Open MPI configuration; summation order is MPI's, not the
/// local ring's, so `sum` of floats may differ from local_communicator in the
/// last bits.

#if defined(TESSERA_HAS_MPI) && TESSERA_HAS_MPI

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tessera/comm/communicator.hpp"
#include "tessera/comm/communicator_base.hpp"
#include "tessera/comm/detail/collective_log.hpp"
#include "tessera/comm/detail/launcher_note.hpp"
#include "tessera/comm/detail/polled_request.hpp"
#include "tessera/comm/tags.hpp"

namespace tessera::comm {

namespace detail {

template <comm_element T>
inline MPI_Datatype mpi_type() {
  if constexpr (std::same_as<T, float>)
    return MPI_FLOAT;
  else if constexpr (std::same_as<T, double>)
    return MPI_DOUBLE;
  else if constexpr (std::same_as<T, std::int32_t>)
    return MPI_INT32_T;
  else if constexpr (std::same_as<T, std::int64_t>)
    return MPI_INT64_T;
  else
    return MPI_UINT64_T;
}
inline MPI_Op mpi_op(reduce_op op) {
  return op == reduce_op::sum ? MPI_SUM : MPI_MAX;
}

/// "MPI_ERR_TRUNCATE: message truncated" for an MPI error code.
inline std::string mpi_error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) return "unknown MPI error";
  return std::string(buf, static_cast<std::size_t>(len));
}

/// Throws comm_error naming the MPI call and its code unless rc is MPI_SUCCESS.
inline void mpi_check(int rc, const char* call, const std::string& context) {
  if (rc != MPI_SUCCESS)
    throw comm_error(
        str(context, ": ", call, " failed with code ", rc, " (", mpi_error_string(rc), ")"));
}

/// The state of one mpi_communicator, on the heap so requests can point at it.
struct mpi_comm_state : rank_core {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0, size = 1, world_rank = 0, world_size = 1;
  std::string broken;

  [[nodiscard]] std::string who() const {
    std::string s = str("rank ", rank, " of ", size);
    if (world_size != size || world_rank != rank) s += str(" (world rank ", world_rank, ")");
    return s;
  }
  [[nodiscard]] std::string context(const op_ctx& c) const { return who() + ": " + describe(c); }
};

/// The job's error path: a duplicate of MPI_COMM_WORLD (made by the first
/// mpi_communicator built on the world) on which a failing rank sends a
/// notice to every other rank (mpi_notify_failure). Every wait() polls it,
/// so a rank that fails between or inside collectives ends its peers'
/// waits at once, with its message, instead of after their timeouts.
struct mpi_error_channel {
  static constexpr int tag = mpi_notice_tag;                 ///< comm/tags.hpp
  static constexpr int rendezvous_tag = mpi_rendezvous_tag;  ///< comm/tags.hpp
  MPI_Comm comm = MPI_COMM_NULL;
  int world_rank = 0, world_size = 1;
  std::string notice;  // "world rank R failed: why", once failed or told
  std::vector<std::unique_ptr<std::string>> sent;  // buffers of sends still in flight
  // An operation of this process was ended by a notice while MPI may
  // still progress it (over buffers its caller may free): from then on this
  // process makes no MPI call, and MPI_Finalize must not run.
  bool unfinished = false;
  // The channel is one per process, shared by every communicator (each
  // one thread at a time, possibly different threads).
  std::mutex mu;

  /// Receives a pending notice, if any (nonblocking: MPI_Improbe and
  /// MPI_Mrecv, so two threads cannot take the same message). True once
  /// there is one. Never throws.
  bool poll() {
    std::lock_guard<std::mutex> lock(mu);
    if (!notice.empty()) return true;
    // Once an operation was ended by a notice this process makes no MPI
    // call: any call may progress it over buffers already freed.
    if (comm == MPI_COMM_NULL || unfinished) return false;
    int flag = 0, n = 0;
    MPI_Message m = MPI_MESSAGE_NULL;
    MPI_Status st{};
    if (MPI_Improbe(MPI_ANY_SOURCE, tag, comm, &flag, &m, &st) != MPI_SUCCESS || !flag)
      return false;
    if (MPI_Get_count(&st, MPI_CHAR, &n) != MPI_SUCCESS || n == MPI_UNDEFINED || n < 0) n = 0;
    std::string msg(static_cast<std::size_t>(n), '\0');
    if (MPI_Mrecv(msg.data(), n, MPI_CHAR, &m, MPI_STATUS_IGNORE) != MPI_SUCCESS)
      msg = "world rank " + std::to_string(st.MPI_SOURCE) + " failed (its notice was unreadable)";
    notice = msg.empty() ? "world rank " + std::to_string(st.MPI_SOURCE) + " failed" : msg;
    return true;
  }
  /// After a failure: tells every rank this one is about to exit (and
  /// whether an operation of its is unfinished) and waits until all have
  /// said so, or `limit` passes. The first process to exit makes mpirun end
  /// the others; waiting lets each report its error first. Returns true if
  /// every rank arrived and none has an unfinished operation: MPI_Finalize
  /// may then run. With an unfinished operation of its own this process
  /// makes no MPI call: it waits a second and returns false.
  bool rendezvous(std::chrono::milliseconds limit) {
    std::lock_guard<std::mutex> lock(mu);
    if (comm == MPI_COMM_NULL) return !unfinished;
    if (unfinished) {  // no MPI call is safe now: a grace period for the others to report
      std::this_thread::sleep_for(std::min(limit, std::chrono::milliseconds(1000)));
      return false;
    }
    static char mine = 0;
    mine = unfinished ? 2 : 1;
    for (int r = 0; r < world_size; ++r) {
      MPI_Request req = MPI_REQUEST_NULL;
      if (r != world_rank &&
          MPI_Isend(&mine, 1, MPI_CHAR, r, rendezvous_tag, comm, &req) == MPI_SUCCESS)
        MPI_Request_free(&req);
    }
    const auto deadline = std::chrono::steady_clock::now() + limit;
    int seen = 0;
    bool clean = !unfinished;
    while (seen < world_size - 1 && std::chrono::steady_clock::now() < deadline) {
      int flag = 0;
      MPI_Message m = MPI_MESSAGE_NULL;
      MPI_Status st{};
      if (MPI_Improbe(MPI_ANY_SOURCE, rendezvous_tag, comm, &flag, &m, &st) != MPI_SUCCESS)
        return false;
      if (!flag) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
      char c = 0;
      if (MPI_Mrecv(&c, 1, MPI_CHAR, &m, MPI_STATUS_IGNORE) != MPI_SUCCESS) return false;
      if (c != 1) clean = false;
      ++seen;
    }
    return clean && seen == world_size - 1;
  }
};
inline mpi_error_channel& error_channel() {
  static mpi_error_channel c;
  return c;
}

/// Exchanges pids and processor names over `world` (collective: every
/// rank builds the first world communicator) and installs the SIGTERM note
/// (detail/launcher_note.hpp). Throws comm_error if an MPI call fails.
inline void exchange_pids_for_note(MPI_Comm world, int world_rank, int world_size) {
  const auto n = static_cast<std::size_t>(world_size);
  long mine = static_cast<long>(getpid());
  std::vector<long> pid(n, 0);
  mpi_check(MPI_Allgather(&mine, 1, MPI_LONG, pid.data(), 1, MPI_LONG, world), "MPI_Allgather",
            "mpi_communicator (pids)");
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  mpi_check(MPI_Get_processor_name(name, &len), "MPI_Get_processor_name", "mpi_communicator");
  std::vector<char> names(n * MPI_MAX_PROCESSOR_NAME);
  mpi_check(MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names.data(),
                          MPI_MAX_PROCESSOR_NAME, MPI_CHAR, world),
            "MPI_Allgather", "mpi_communicator (processor names)");
  std::vector<char> same(n, 0);
  for (std::size_t r = 0; r < n; ++r)
    same[r] =
        std::strncmp(name, names.data() + r * MPI_MAX_PROCESSOR_NAME, MPI_MAX_PROCESSOR_NAME) == 0;
  install_launcher_note(world_rank, std::move(pid), std::move(same));
}

}  // namespace detail

/// RAII MPI initialisation: calls MPI_Init_thread(required) unless MPI is
/// already initialised, and MPI_Finalize in the destructor if it did the
/// initialisation (and MPI is not finalised yet). Create one in main before
/// any mpi_communicator; destroy communicators first.
class mpi_environment {
 public:
  /// Throws comm_error if MPI_Init_thread fails or provides less than
  /// `required` (default MPI_THREAD_SERIALIZED: one thread calls MPI at a
  /// time, which is all mpi_communicator needs).
  explicit mpi_environment(int* argc = nullptr, char*** argv = nullptr,
                           int required = MPI_THREAD_SERIALIZED) {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
      detail::mpi_check(MPI_Init_thread(argc, argv, required, &provided_), "MPI_Init_thread",
                        "mpi_environment");
      owns_ = true;
    } else {
      MPI_Query_thread(&provided_);
    }
    TESSERA_THROW_IF(provided_ < required, comm_error,
                     "mpi_environment: MPI provides thread level ", provided_, " < required ",
                     required);
  }
  mpi_environment(const mpi_environment&) = delete;
  mpi_environment& operator=(const mpi_environment&) = delete;
  /// Finalises MPI. After a failure (a notice on the error path,
  /// mpi_notify_failure) the ranks first wait for each other (at most 10
  /// s, so each can report before mpirun ends the job at the first exit),
  /// and if any of them has an operation that failed while MPI may still
  /// progress it (a collective a failed rank never joined, over buffers
  /// already freed), or did not arrive, none calls MPI_Finalize (it would
  /// progress them): the processes exit without it and mpirun reports a
  /// non-zero status.
  ~mpi_environment() {
    int fin = 0;
    MPI_Finalized(&fin);
    if (!owns_ || fin) return;
    auto& ch = detail::error_channel();
    if (ch.poll() && !ch.rendezvous(std::chrono::seconds(10))) return;
    MPI_Finalize();
  }
  /// The thread level MPI provides.
  [[nodiscard]] int thread_level() const { return provided_; }
  /// True if this object initialised MPI (and will finalise it).
  [[nodiscard]] bool owns() const { return owns_; }

 private:
  int provided_ = 0;
  bool owns_ = false;
};

/// Prints `message` to stderr and ends the whole job with MPI_Abort(code).
/// For a program's main after an unrecoverable comm_error (library code
/// never calls it).
[[noreturn]] inline void mpi_abort(const std::string& message, int code = 1) noexcept {
  int rank = -1, inited = 0;
  MPI_Initialized(&inited);
  if (inited) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::fprintf(stderr, "tessera: aborting the MPI job from world rank %d: %s\n", rank,
               message.c_str());
  std::fflush(stderr);
  if (inited) MPI_Abort(MPI_COMM_WORLD, code);
  std::abort();
}

/// The job's error path (detail::mpi_error_channel): tells every other
/// rank of MPI_COMM_WORLD that this one failed with `why` (nonblocking
/// sends, never waited for). Their pending and later operations on any
/// mpi_communicator then throw comm_error "... world rank R failed: why"
/// at once, and so do this rank's, so unwinding does not wait for
/// timeouts. Call it where a rank catches an error its peers cannot see
/// (a failed write, a check, an exception mid-step) before rethrowing; a
/// notice already received is not sent again. No-op (false) before the
/// first mpi_communicator on the world exists; never throws.
inline bool mpi_notify_failure(const std::string& why) noexcept {
  auto& ch = detail::error_channel();
  std::lock_guard<std::mutex> lock(ch.mu);
  if (ch.comm == MPI_COMM_NULL || !ch.notice.empty()) return false;
  try {
    ch.notice = detail::str("world rank ", ch.world_rank, " failed: ", why);
    // With an operation ended by an earlier notice, an MPI call could
    // progress it over freed buffers (not reached: a notice was set then).
    if (ch.unfinished) return false;
    for (int r = 0; r < ch.world_size; ++r) {
      if (r == ch.world_rank) continue;
      auto& buf = ch.sent.emplace_back(std::make_unique<std::string>(ch.notice));
      MPI_Request req = MPI_REQUEST_NULL;
      if (MPI_Isend(buf->data(), static_cast<int>(std::min<std::size_t>(buf->size(), 1 << 20)),
                    MPI_CHAR, r, detail::mpi_error_channel::tag, ch.comm, &req) == MPI_SUCCESS)
        MPI_Request_free(&req);  // the buffer is kept: the send may still read it
    }
  } catch (...) {
    return false;
  }
  return true;
}

/// Runs `f()` (returning int) on this MPI rank. An exception it throws is
/// sent to every other rank first (mpi_notify_failure: their waits end at
/// once naming this rank and the cause, not at the timeout), then
/// `report()` is called inside the handler (it may rethrow with `throw;`
/// to inspect the exception) and its int returned: so the error is
/// reported here, before mpi_environment ends MPI (after a failure mpirun
/// may end the job as soon as one process exits).
template <class F, class Report>
int mpi_run_notifying(F&& f, Report&& report) {
  try {
    return f();
  } catch (...) {
    try {
      throw;
    } catch (const std::exception& e) {
      mpi_notify_failure(e.what());
    } catch (...) {
      mpi_notify_failure("unknown exception");
    }
    return report();
  }
}

/// The notice of the job's error path ("world rank R failed: why"), once
/// this rank failed or was told; empty otherwise. Never blocks.
inline std::string mpi_failure_notice() {
  auto& ch = detail::error_channel();
  ch.poll();
  std::lock_guard<std::mutex> lock(ch.mu);
  return ch.notice;
}

namespace detail {

/// One pending MPI operation (a detail::polled_pending).
struct mpi_pending : pending_core<mpi_comm_state> {
  static constexpr unsigned peer_check_every = 16;  // polls between looks at the error path
  MPI_Request req = MPI_REQUEST_NULL;
  std::vector<std::byte> tmp;         // staging for in-place reduce_scatter
  std::function<void()> on_complete;  // copies out of tmp; checks recv counts
  MPI_Status status{};

  /// One MPI_Test; on completion runs on_complete. Returns done.
  bool poll() {
    bool stopped = false;
    {
      auto& ch = error_channel();
      std::lock_guard<std::mutex> lock(ch.mu);
      stopped = ch.unfinished;
    }
    if (stopped) {  // no MPI call after an operation of this process failed (see fail)
      fail(str(st->context(c), ": not completed: the job failed: ", mpi_failure_notice()), true);
      return true;
    }
    int flag = 0;
    const int rc = MPI_Test(&req, &flag, &status);
    if (rc != MPI_SUCCESS) {
      fail(
          str(st->context(c), ": MPI_Test failed with code ", rc, " (", mpi_error_string(rc), ")"));
      return true;
    }
    if (!flag) return false;
    done = true;
    if (on_complete) {
      try {
        on_complete();
      } catch (const comm_error& e) {
        fail(e.what());
      }
    }
    return true;
  }
  /// Another rank failed (a notice on the error path): ends this one.
  bool peer_failed() {
    if (!error_channel().poll()) return false;
    fail(str(st->context(c), ": ", mpi_failure_notice()), true);
    return true;
  }
  /// Ends this one with the timeout's message, naming the peer or, for a
  /// collective, what MPI cannot tell.
  void timed_out() {
    const auto pos = c.extra.find("peer ");
    const int peer = pos == std::string::npos ? -1 : std::atoi(c.extra.c_str() + pos + 5);
    fail(str(st->context(c), " timed out after ", c.timeout.count(), " ms",
             c.collective ? "; missing: " : " waiting for rank ",
             c.collective ? str("MPI does not report which of the other ", st->size - 1,
                                " ranks has not entered it (use set_debug(true) and "
                                "verify_collective_hash(), or look for the rank whose log stops "
                                "before this operation)")
                          : std::to_string(peer)));
  }
  /// Ends this one with `msg`, which also breaks the communicator.
  /// `job_failed`: ended by a notice of the error path, so the operation
  /// will never complete and this process stops calling MPI (a timeout
  /// alone breaks only this communicator).
  void fail(std::string msg, bool job_failed = false) {
    done = true;
    err = msg;
    if (job_failed) {
      auto& ch = error_channel();
      std::lock_guard<std::mutex> lock(ch.mu);
      ch.unfinished = true;  // MPI may still progress this request
    }
    if (st->broken.empty()) st->broken = std::move(msg);
  }
};

}  // namespace detail

/// Handle of an asynchronous mpi_communicator operation (`comm_request`,
/// detail::polled_request): wait() polls MPI_Test until completion, another
/// rank's failure or the timeout (comm_error); test() calls MPI_Test once.
/// The buffers must stay alive until wait() returns; a handle destroyed
/// before completion waits for it (errors are dropped). A handle must not
/// outlive its communicator.
using mpi_request = detail::polled_request<detail::mpi_pending>;

/// One rank of an MPI communicator: models `communicator`. Owns a duplicate
/// of the MPI communicator it wraps (so its traffic never matches the
/// caller's), freed in the destructor. Move-only; one thread at a time.
class mpi_communicator : public communicator_base<mpi_communicator> {
 public:
  /// Wraps a duplicate of `comm` (collective over comm: MPI_Comm_dup).
  /// Precondition: MPI is initialised (mpi_environment). Throws comm_error.
  explicit mpi_communicator(MPI_Comm comm = MPI_COMM_WORLD, comm_options opt = {})
      : s_(std::make_unique<detail::mpi_comm_state>()) {
    MPI_Comm dup = MPI_COMM_NULL;
    detail::mpi_check(MPI_Comm_dup(comm, &dup), "MPI_Comm_dup", "mpi_communicator");
    adopt(dup, opt);
    auto& ch = detail::error_channel();
    int same = MPI_UNEQUAL;
    MPI_Comm_compare(comm, MPI_COMM_WORLD, &same);
    if (ch.comm == MPI_COMM_NULL && (same == MPI_IDENT || same == MPI_CONGRUENT)) {
      // Collective over the world, like the dup above: every rank builds it.
      detail::mpi_check(MPI_Comm_dup(MPI_COMM_WORLD, &ch.comm), "MPI_Comm_dup",
                        "mpi_communicator (error channel)");
      // Errors are return codes here too (a send to a dead peer must not abort).
      detail::mpi_check(MPI_Comm_set_errhandler(ch.comm, MPI_ERRORS_RETURN),
                        "MPI_Comm_set_errhandler", "mpi_communicator (error channel)");
      detail::mpi_check(MPI_Comm_rank(ch.comm, &ch.world_rank), "MPI_Comm_rank",
                        "mpi_communicator (error channel)");
      detail::mpi_check(MPI_Comm_size(ch.comm, &ch.world_size), "MPI_Comm_size",
                        "mpi_communicator (error channel)");
      detail::exchange_pids_for_note(ch.comm, ch.world_rank, ch.world_size);
    }
  }
  mpi_communicator(mpi_communicator&&) noexcept = default;
  mpi_communicator& operator=(mpi_communicator&&) noexcept = default;
  ~mpi_communicator() {
    if (!s_ || s_->comm == MPI_COMM_NULL) return;
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Comm_free(&s_->comm);  // pending operations complete first (MPI rule)
  }

  [[nodiscard]] int rank() const { return s_->rank; }         ///< this rank in [0, size())
  [[nodiscard]] int size() const { return s_->size; }         ///< ranks in the group
  [[nodiscard]] MPI_Comm native() const { return s_->comm; }  ///< the owned MPI_Comm
  /// In-place all-reduce of buf[0, n) with `op` (MPI_Iallreduce, MPI_IN_PLACE);
  /// counts ring_all_reduce_bytes(n, sizeof(T), N, rank). Any n <= INT_MAX.
  template <comm_element T>
  mpi_request iall_reduce(T* buf, std::size_t n, reduce_op op) {
    auto p = issue(op_kind::all_reduce, n, dtype_of<T>(), to_string(op),
                   ring_all_reduce_bytes(n, sizeof(T), size(), rank()));
    detail::mpi_check(MPI_Iallreduce(MPI_IN_PLACE, buf, count(n, p->c), detail::mpi_type<T>(),
                                     detail::mpi_op(op), s_->comm, &p->req),
                      "MPI_Iallreduce", s_->context(p->c));
    return mpi_request(std::move(p));
  }

  /// recv[0, chunk) = op over ranks of send[rank*chunk, (rank+1)*chunk)
  /// (MPI_Ireduce_scatter_block); send holds size()*chunk elements. recv may
  /// be send + rank*chunk (staged through a temporary); no other overlap.
  /// Counts (N-1)*chunk*sizeof(T) bytes. Callers pad to equal chunks.
  template <comm_element T>
  mpi_request ireduce_scatter(const T* send, T* recv, std::size_t chunk, reduce_op op) {
    auto p = issue(op_kind::reduce_scatter, chunk, dtype_of<T>(), to_string(op),
                   ring_scatter_gather_bytes(chunk, sizeof(T), size()));
    T* out = recv;
    if (recv == send + static_cast<std::size_t>(rank()) * chunk && chunk) {
      p->tmp.resize(chunk * sizeof(T));
      out = reinterpret_cast<T*>(p->tmp.data());
      p->on_complete = [recv, out, chunk] { std::memcpy(recv, out, chunk * sizeof(T)); };
    }
    detail::mpi_check(
        MPI_Ireduce_scatter_block(send, out, count(chunk, p->c), detail::mpi_type<T>(),
                                  detail::mpi_op(op), s_->comm, &p->req),
        "MPI_Ireduce_scatter_block", s_->context(p->c));
    return mpi_request(std::move(p));
  }

  /// recv[r*chunk, (r+1)*chunk) = send of rank r (MPI_Iallgather); send may be
  /// recv + rank*chunk (MPI_IN_PLACE). Counts (N-1)*chunk*sizeof(T) bytes.
  template <comm_element T>
  mpi_request iall_gather(const T* send, T* recv, std::size_t chunk) {
    auto p = issue(op_kind::all_gather, chunk, dtype_of<T>(), {},
                   ring_scatter_gather_bytes(chunk, sizeof(T), size()));
    const bool in_place = send == recv + static_cast<std::size_t>(rank()) * chunk;
    const int cnt = count(chunk, p->c);
    detail::mpi_check(MPI_Iallgather(in_place ? MPI_IN_PLACE : send, cnt, detail::mpi_type<T>(),
                                     recv, cnt, detail::mpi_type<T>(), s_->comm, &p->req),
                      "MPI_Iallgather", s_->context(p->c));
    return mpi_request(std::move(p));
  }

  /// Copies root's buf[0, n) to every rank (MPI_Ibcast); counts
  /// chain_broadcast_bytes(n, sizeof(T), N, rank, root).
  template <comm_element T>
  mpi_request ibroadcast(T* buf, std::size_t n, int root) {
    check_peer(root, "broadcast root");
    auto p = issue(op_kind::broadcast, n, dtype_of<T>(), detail::str("root ", root),
                   chain_broadcast_bytes(n, sizeof(T), size(), rank(), root));
    detail::mpi_check(
        MPI_Ibcast(buf, count(n, p->c), detail::mpi_type<T>(), root, s_->comm, &p->req),
        "MPI_Ibcast", s_->context(p->c));
    return mpi_request(std::move(p));
  }

  /// Sends buf[0, n) to `peer` with `tag` (MPI_Isend + wait: may wait for the
  /// receiver, so it can time out). Counts n*sizeof(T) bytes.
  template <comm_element T>
  mpi_request isend(const T* buf, std::size_t n, int peer, int tag) {
    check_peer(peer, "send peer");
    auto p = issue_p2p(op_kind::send, n, dtype_of<T>(), peer, tag, n * sizeof(T));
    detail::mpi_check(
        MPI_Isend(buf, count(n, p->c), detail::mpi_type<T>(), peer, tag, s_->comm, &p->req),
        "MPI_Isend", s_->context(p->c));
    return mpi_request(std::move(p));
  }
  /// Receives exactly n elements from `peer` with `tag`; comm_error if the
  /// message holds another count, on timeout, or on an MPI error.
  template <comm_element T>
  mpi_request irecv(T* buf, std::size_t n, int peer, int tag) {
    check_peer(peer, "recv peer");
    auto p = issue_p2p(op_kind::recv, n, dtype_of<T>(), peer, tag, 0);
    detail::mpi_pending* raw = p.get();
    p->on_complete = [raw, n] {
      int got = 0;
      MPI_Get_count(&raw->status, detail::mpi_type<T>(), &got);
      TESSERA_THROW_IF(static_cast<std::size_t>(got) != n, comm_error, raw->st->context(raw->c),
                       ": received ", got, " elements, expected ", n);
    };
    detail::mpi_check(
        MPI_Irecv(buf, count(n, p->c), detail::mpi_type<T>(), peer, tag, s_->comm, &p->req),
        "MPI_Irecv", s_->context(p->c));
    return mpi_request(std::move(p));
  }

  /// Completes once every rank entered (MPI_Ibarrier). Counts 0 bytes.
  mpi_request ibarrier() {
    auto p = issue(op_kind::barrier, 0, dtype::none, {}, 0);
    detail::mpi_check(MPI_Ibarrier(s_->comm, &p->req), "MPI_Ibarrier", s_->context(p->c));
    return mpi_request(std::move(p));
  }

  /// Collective (MPI_Comm_split, blocking, no timeout): ranks with the same
  /// color (>= 0) form a new communicator ranked by (key, rank). Counts the
  /// ring all-gather of 2 int64 per rank, like local_communicator. The new
  /// communicator inherits timeout and debug settings.
  mpi_communicator split(int color, int key) {
    TESSERA_THROW_IF(color < 0, config_error, s_->who(), ": split color ", color, " must be >= 0");
    auto p = issue(op_kind::split, 2, dtype::i64, detail::str("color ", color, ", key ", key),
                   ring_scatter_gather_bytes(2, 8, size()));
    p->done = true;
    MPI_Comm sub = MPI_COMM_NULL;
    detail::mpi_check(MPI_Comm_split(s_->comm, color, key, &sub), "MPI_Comm_split",
                      s_->context(p->c));
    return mpi_communicator(sub, s_->opt, adopt_tag{});
  }

  /// Debug mode: all-gathers every rank's (count, hash) of the collectives
  /// issued; throws comm_error naming the first divergent collective
  /// (sequence number, each rank's description); config_error if debug mode
  /// is off.
  void verify_collective_hash() {
    s_->log.verify(rank(), size(),
                   [this](const std::uint64_t* snd, std::uint64_t* rcv, std::size_t w) {
                     all_gather(snd, rcv, w);
                   });
  }

 private:
  struct adopt_tag {};
  mpi_communicator(MPI_Comm owned, comm_options opt, adopt_tag)
      : s_(std::make_unique<detail::mpi_comm_state>()) {
    adopt(owned, opt);
  }
  void adopt(MPI_Comm c, comm_options opt) {
    s_->comm = c;
    s_->configure(opt);
    detail::mpi_check(MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler",
                      "mpi_communicator");
    MPI_Comm_rank(c, &s_->rank);
    MPI_Comm_size(c, &s_->size);
    MPI_Comm_rank(MPI_COMM_WORLD, &s_->world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &s_->world_size);
  }
  friend class communicator_base<mpi_communicator>;
  detail::rank_core& core() { return *s_; }
  const detail::rank_core& core() const { return *s_; }
  std::string who() const { return s_->who(); }
  int count(std::size_t n, const detail::op_ctx& c) const {
    TESSERA_THROW_IF(n > static_cast<std::size_t>(INT_MAX), config_error, s_->context(c),
                     ": MPI counts are int; split the buffer into pieces of <= ", INT_MAX,
                     " elements");
    return static_cast<int>(n);
  }
  /// The pending operation `c` (numbered and counted), refused on a
  /// broken communicator or once another rank failed.
  std::unique_ptr<detail::mpi_pending> make(detail::op_ctx c) {
    TESSERA_THROW_IF(
        !s_->broken.empty(), comm_error, s_->context(c),
        ": this communicator is broken by an earlier error: ", s_->broken.substr(0, 400));
    TESSERA_THROW_IF(detail::error_channel().poll(), comm_error, s_->context(c), ": ",
                     mpi_failure_notice());
    auto p = std::make_unique<detail::mpi_pending>();
    p->st = s_.get();
    p->c = std::move(c);
    return p;
  }
  std::unique_ptr<detail::mpi_pending> issue(op_kind k, std::size_t n, dtype d, std::string extra,
                                             std::uint64_t bytes) {
    return make(s_->collective(k, n, d, std::move(extra), size(), bytes));
  }
  std::unique_ptr<detail::mpi_pending> issue_p2p(op_kind k, std::size_t n, dtype d, int peer,
                                                 int tag, std::uint64_t bytes) {
    return make(s_->p2p(k, n, d, peer, tag, bytes));
  }

  std::unique_ptr<detail::mpi_comm_state> s_;
};

static_assert(check_communicator<mpi_communicator>());

}  // namespace tessera::comm

#endif  // TESSERA_HAS_MPI
