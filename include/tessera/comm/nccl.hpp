#pragma once
/// \file nccl.hpp
/// `nccl_communicator`: one process per GPU, ranks are the processes of an
/// MPI job; collectives and point-to-point operations run on the GPU through
/// NCCL, ordered on a CUDA stream, over DEVICE buffers. Link `tessera::nccl`
/// (CUDA runtime, libnccl, MPI); the header refuses to compile without them.
///
/// Bootstrap: rank 0 of the given mpi_communicator calls ncclGetUniqueId and
/// broadcasts the 128-byte id over it (counted in the MPI communicator's
/// stats, not this one's); every rank then calls ncclCommInitRankConfig on
/// its device with `blocking = 0`.
///
/// How it differs from the host communicators (local, mpi), which the
/// `communicator` concept cannot express because it checks signatures only:
/// - Buffers are device memory of this rank's device (`buffers ==
///   buffer_space::device`; models `device_communicator`, not
///   `host_communicator`). Passing host memory is undefined (NCCL reads it
///   as a device address).
/// - Every operation is enqueued on `stream()`, after the work already
///   queued there. The i-form returns an `nccl_request` whose wait() polls a
///   CUDA event recorded after the operation; the blocking form is the
///   i-form plus wait(), so it returns when the GPU has finished it.
/// - Its own stream beside the kernels' (what lets a bucket's reduction
///   overlap the rest of the backward): after follow(compute), every
///   operation is enqueued after the work queued on `compute` at its issue
///   (an event recorded there that the communicator's stream waits for:
///   its inputs are written), and `nccl_request::order_before(compute)`
///   makes the work queued on `compute` later wait for the operation
///   (before reading its output or reusing its buffers), without blocking
///   the host; PyTorch's ProcessGroupNCCL orders its stream the same way.
///   The caching allocator reuses a freed block on the stream it was
///   allocated on, so a buffer an operation used may be freed once the
///   compute stream has been ordered after it.
/// - send/recv have no tags (NCCL matches the sends and receives between two
///   ranks in issue order; `tag` only appears in error messages) and do not
///   check counts (a receive of another count than was sent is undefined).
///   A send blocks the stream until the peer receives, so a ring exchange in
///   which every rank receives first, or sends first, deadlocks on one
///   stream: use `sendrecv` (one ncclGroupStart/End pair) for it.
/// - barrier is an all-reduce of one int32 on a device word the
///   communicator owns (NCCL has no barrier); like the others it counts 0
///   bytes.
///
/// Timeouts: the communicator is nonblocking (ncclConfig_t.blocking = 0, so
/// a missing peer can never block the host inside NCCL). Initialisation,
/// split and every enqueue poll ncclCommGetAsyncError until NCCL is done or
/// `timeout` passed; wait() polls cudaEventQuery and ncclCommGetAsyncError
/// until the event completes or `timeout` has passed since wait() was
/// called. On expiry (or an asynchronous NCCL error) it calls ncclCommAbort,
/// which ends this rank's NCCL kernels, and throws comm_error naming the
/// rank, the operation, its sequence number, the count, the bytes and the
/// peer (for send/recv). The communicator is then broken: later operations
/// throw at once; create a new one (over MPI) to continue. NCCL does not
/// report which rank is missing from a collective (use set_debug(true) and
/// verify_collective_hash() to find a rank that issued other collectives).
///
/// Errors: every CUDA and NCCL status is checked and turned into comm_error
/// naming the call and the code (cudaGetErrorName / ncclGetErrorString, and
/// ncclGetLastError's detail). config_error for a bad root, peer, color or
/// device index.
///
/// Calls: each operation is translated into its list of NCCL calls by
/// comm/nccl_calls.hpp (`nccl_translate`: the function, NCCL's count, the
/// datatype, the reduction, the peer or root), and that list is what is
/// issued, call by call (detail::nccl_issue), so a host test can record the
/// NCCL sequence of a training step without a GPU.
///
/// Bytes are counted with the ring formulas of communicator.hpp, whatever
/// algorithm NCCL picks (ring, tree, NVLS, CollNet).
///
/// Determinism: for the same ranks, devices, topology, NCCL version and
/// NCCL_* environment, NCCL picks the same algorithm and protocol and
/// results repeat bit for bit; every rank gets the same bits. Sums are not
/// in the local ring's order (compare with a tolerance); bf16 sums round to
/// bf16 at each reduction step inside NCCL, so expect about log2(N) bf16
/// roundings, not one.
///
/// Source: NCCL User Guide (docs.nvidia.com/deeplearning/nccl), "Creating a
/// communicator", "Fault tolerance" (nonblocking communicators,
/// ncclCommGetAsyncError, ncclCommAbort), "Point-to-point communication",
/// "Group calls", and the API pages of each call named above.

#if !defined(TESSERA_HAS_MPI) || !TESSERA_HAS_MPI
#error \
    "tessera/comm/nccl.hpp: nccl_communicator is bootstrapped over MPI (rank 0 broadcasts the ncclUniqueId); compile with MPI: link tessera::nccl, which brings tessera::mpi and defines TESSERA_HAS_MPI=1"
#endif
#if !__has_include(<cuda_runtime_api.h>)
#error \
    "tessera/comm/nccl.hpp needs the CUDA runtime (cuda_runtime_api.h from CUDA Toolkit 12 or 13): link tessera::nccl, configured with -DTESSERA_ENABLE_CUDA=ON (the cuda preset)"
#endif
#if !__has_include(<nccl.h>)
#error \
    "tessera/comm/nccl.hpp needs NCCL >= 2.18 (nccl.h and libnccl; under the CUDA toolkit prefix on our machines, or set CMAKE_PREFIX_PATH): link tessera::nccl"
#endif

#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>

#if !defined(NCCL_VERSION_CODE) || NCCL_VERSION_CODE < NCCL_VERSION(2, 14, 0)
#error \
    "tessera/comm/nccl.hpp needs NCCL >= 2.14 for nonblocking communicators (ncclConfig_t, used for timeouts) and >= 2.18 for split (ncclCommSplit); DESIGN.md asks for 2.18 or newer"
#endif
/// 1 when ncclCommSplit exists (NCCL >= 2.18); otherwise split() throws.
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0)
#define TESSERA_NCCL_HAS_SPLIT 1
#else
#define TESSERA_NCCL_HAS_SPLIT 0
#endif

#include <chrono>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tessera/comm/communicator.hpp"
#include "tessera/comm/communicator_base.hpp"
#include "tessera/comm/detail/nccl_state.hpp"
#include "tessera/comm/detail/polled_request.hpp"
#include "tessera/comm/mpi.hpp"
#include "tessera/comm/nccl_calls.hpp"

namespace tessera::comm {

namespace detail {

/// One operation in flight (a detail::polled_pending): its description and
/// the CUDA event recorded after it on the communicator's stream. Every
/// way it fails aborts the communicator (ncclCommAbort): the GPU may
/// otherwise wait for a peer forever.
struct nccl_pending : pending_core<nccl_comm_state> {
  static constexpr unsigned peer_check_every = 1024;  // polls between looks at the error path
  cudaEvent_t ev = nullptr;
  nccl_pending() = default;
  nccl_pending(const nccl_pending&) = delete;
  nccl_pending& operator=(const nccl_pending&) = delete;
  ~nccl_pending() {
    if (ev) (void)cudaEventDestroy(ev);
  }

  /// One cudaEventQuery and ncclCommGetAsyncError. Returns done.
  bool poll() {
    if (st->aborted) {
      finish(str(st->context(c), ": the NCCL communicator was aborted before it completed: ",
                 st->broken.substr(0, 400)));
      return true;
    }
    const cudaError_t e = cudaEventQuery(ev);
    if (e == cudaSuccess) {
      done = true;
      return true;
    }
    if (e != cudaErrorNotReady) {
      (void)cudaGetLastError();
      abort(str(st->context(c), ": cudaEventQuery failed with ", cudaGetErrorName(e), " (",
                static_cast<int>(e), "): ", cudaGetErrorString(e)));
      return true;
    }
    (void)cudaGetLastError();
    ncclResult_t state = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(st->comm, &state);
    if (r == ncclSuccess) r = state;
    if (r != ncclSuccess && r != ncclInProgress) {
      abort(str(st->context(c), ": ncclCommGetAsyncError reports ", nccl_result_text(r, st->comm),
                "; the NCCL communicator was aborted (ncclCommAbort)"));
      return true;
    }
    return false;
  }
  /// Another rank failed (mpi_notify_failure): aborts the communicator.
  bool peer_failed() {
    if (!error_channel().poll()) return false;
    abort(str(st->context(c), ": ", error_channel().notice,
              "; the NCCL communicator was aborted (ncclCommAbort)"));
    return true;
  }
  /// The deadline passed: aborts the communicator.
  void timed_out() {
    abort(str(st->context(c), " timed out after ", c.timeout.count(), " ms",
              c.collective ? "; NCCL does not report which of the other ranks has not entered "
                             "it (use set_debug(true) and verify_collective_hash())"
                           : "; its peer has not posted the matching operation",
              "; the NCCL communicator was aborted (ncclCommAbort)"));
  }

 private:
  void finish(std::string msg) {
    done = true;
    err = std::move(msg);
  }
  void abort(const std::string& msg) {
    st->abort(msg);
    finish(msg);
  }
};

/// Issues `calls` (an nccl_translate list) on `comm` and `stream`, in
/// order: the one place nccl_communicator calls NCCL's data functions.
/// After a call fails no further data call is issued, but every group
/// opened is still closed (ncclGroupEnd); returns the first failure, else
/// the last call's result (on a nonblocking communicator ncclInProgress
/// until NCCL finished enqueueing; the caller settles it).
inline ncclResult_t nccl_issue(std::span<const nccl_call> calls, ncclComm_t comm,
                               cudaStream_t stream) {
  const auto ok = [](ncclResult_t r) { return r == ncclSuccess || r == ncclInProgress; };
  ncclResult_t failed = ncclSuccess, last = ncclSuccess;
  for (const nccl_call& c : calls) {
    if (failed != ncclSuccess && c.fn != nccl_fn::group_end) continue;
    const ncclDataType_t t = nccl_type(c.dt);
    switch (c.fn) {
      case nccl_fn::all_reduce:
        last = ncclAllReduce(c.sendbuff, c.recvbuff, c.count, t, nccl_op(c.op), comm, stream);
        break;
      case nccl_fn::reduce_scatter:
        last = ncclReduceScatter(c.sendbuff, c.recvbuff, c.count, t, nccl_op(c.op), comm, stream);
        break;
      case nccl_fn::all_gather:
        last = ncclAllGather(c.sendbuff, c.recvbuff, c.count, t, comm, stream);
        break;
      case nccl_fn::broadcast:
        last = ncclBroadcast(c.sendbuff, c.recvbuff, c.count, t, c.peer, comm, stream);
        break;
      case nccl_fn::send:
        last = ncclSend(c.sendbuff, c.count, t, c.peer, comm, stream);
        break;
      case nccl_fn::recv:
        last = ncclRecv(c.recvbuff, c.count, t, c.peer, comm, stream);
        break;
      case nccl_fn::group_start:
        last = ncclGroupStart();
        break;
      case nccl_fn::group_end:
        last = ncclGroupEnd();
        break;
    }
    if (failed == ncclSuccess && !ok(last)) failed = last;
  }
  return failed != ncclSuccess ? failed : last;
}

}  // namespace detail

/// Handle of an asynchronous nccl_communicator operation (`comm_request`,
/// detail::polled_request). wait() blocks until the GPU finished the
/// operation (cudaEventQuery, ncclCommGetAsyncError) and throws comm_error
/// if the timeout passes first or NCCL reports an error (both abort the
/// communicator), if the communicator was aborted meanwhile, or if another
/// rank of the job failed (the MPI error path, mpi_notify_failure: also an
/// abort). The buffers must stay allocated and untouched until wait()
/// returns (or until the stream has passed event()). A handle destroyed
/// before completion waits for it (errors are dropped). It must not
/// outlive its communicator.
class nccl_request : public detail::polled_request<detail::nccl_pending> {
 public:
  using polled_request::polled_request;
  /// The CUDA event recorded after the operation on the communicator's
  /// stream (cudaStreamWaitEvent(other, event()) orders work after it
  /// without blocking the host); null for an empty handle. Owned by the
  /// handle.
  [[nodiscard]] cudaEvent_t event() const { return p_ ? p_->ev : nullptr; }
  /// Makes the work queued on `s` after this call wait for the operation
  /// (cudaStreamWaitEvent on event(); the host does not block: wait() or
  /// the handle's destruction still reports a failure or the timeout).
  /// Nothing for an empty handle. Throws comm_error naming the operation if
  /// CUDA refuses the wait.
  void order_before(cudaStream_t s) const {
    if (!p_ || !p_->ev) return;
    detail::cuda_comm_check(cudaStreamWaitEvent(s, p_->ev, 0), "cudaStreamWaitEvent",
                            p_->st->context(p_->c));
  }
};

/// One rank of an NCCL communicator on one GPU: models `device_communicator`
/// (and so `communicator`) for float, double, int32, int64, uint64, bf16 and fp16
/// device buffers. Move-only; one thread at a time; the device is made
/// current around each call and restored after.
class nccl_communicator : public communicator_base<nccl_communicator> {
 public:
  /// Buffers are device memory (communicator.hpp, `buffer_space`).
  static constexpr buffer_space buffers = buffer_space::device;

  /// Collective over `boot` (every rank calls it): rank 0 makes the
  /// ncclUniqueId (ncclGetUniqueId) and broadcasts it over `boot`; each rank
  /// joins with rank boot.rank() of boot.size() on CUDA device `device`
  /// (ncclCommInitRankConfig, nonblocking, polled against opt.timeout).
  /// Operations go on `stream` (a stream of `device`); when it is null the
  /// communicator creates and owns a non-blocking one. Preconditions: MPI
  /// is initialised; one rank per device (NCCL refuses two ranks on one
  /// GPU). Throws config_error for a device outside [0, cudaGetDeviceCount),
  /// comm_error for any CUDA, MPI or NCCL failure or the timeout.
  nccl_communicator(mpi_communicator& boot, int device, cudaStream_t stream = nullptr,
                    comm_options opt = {})
      : s_(std::make_unique<detail::nccl_comm_state>()) {
    auto& s = *s_;
    s.rank = boot.rank();
    s.size = boot.size();
    s.device = device;
    s.configure(opt);
    MPI_Comm_rank(MPI_COMM_WORLD, &s.world_rank);
    const std::string ctx = s.who() + ": nccl_communicator";
    int n_dev = 0;
    detail::cuda_comm_check(cudaGetDeviceCount(&n_dev), "cudaGetDeviceCount", ctx);
    TESSERA_THROW_IF(device < 0 || device >= n_dev, config_error, ctx, ": device ", device,
                     " is not in [0, ", n_dev, ") (cudaGetDeviceCount)");
    detail::nccl_device_scope scope(device, ctx);
    setup_device_resources(stream, ctx);

    // 128 bytes, sent as 16 uint64 so that mpi_communicator's types suffice.
    static_assert(sizeof(ncclUniqueId) % sizeof(std::uint64_t) == 0);
    constexpr std::size_t id_words = sizeof(ncclUniqueId) / sizeof(std::uint64_t);
    std::uint64_t words[id_words] = {};
    if (s.rank == 0) {
      ncclUniqueId id;
      const ncclResult_t r = ncclGetUniqueId(&id);
      TESSERA_THROW_IF(r != ncclSuccess, comm_error, ctx, ": ncclGetUniqueId failed with ",
                       detail::nccl_result_text(r, nullptr));
      std::memcpy(words, &id, sizeof id);
    }
    boot.broadcast(words, id_words, 0);
    ncclUniqueId id;
    std::memcpy(&id, words, sizeof id);

    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    const ncclResult_t r = ncclCommInitRankConfig(&s.comm, s.size, id, s.rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
      s.comm = nullptr;  // nothing to finalize
      throw comm_error(init_error_message(ctx, r));
    }
    s.settle(r, "ncclCommInitRankConfig", ctx, s.opt.timeout);
  }
  nccl_communicator(nccl_communicator&&) noexcept = default;
  nccl_communicator& operator=(nccl_communicator&&) noexcept = default;
  /// Finalizes and destroys the NCCL communicator (waiting at most timeout()
  /// for pending work, then aborting); never throws.
  ~nccl_communicator() = default;

  [[nodiscard]] int rank() const { return s_->rank; }      ///< this rank in [0, size())
  [[nodiscard]] int size() const { return s_->size; }      ///< ranks in the group
  [[nodiscard]] int device() const { return s_->device; }  ///< this rank's CUDA device
  /// The stream operations are enqueued on.
  [[nodiscard]] cudaStream_t stream() const { return s_->stream; }
  /// Enqueues later operations on `s` (a stream of device(); null: the
  /// stream the communicator owns, or the legacy default stream if it owns
  /// none). Pending operations stay where they were issued.
  void set_stream(cudaStream_t s) { s_->stream = s ? s : s_->owned_stream; }
  /// Orders every later operation after the work queued on `s` (a stream
  /// of device(), typically the kernels') at the moment it is issued: an
  /// event recorded on `s` that stream() waits for, no host block. Nothing
  /// when `s` is stream() or null (the default: no ordering beyond
  /// stream()'s own; follow(nullptr) ends it). Preconditions: `s` is a
  /// stream of device() and outlives the operations issued while it is
  /// followed (parallel::context_follow restores the previous setting when
  /// its engine goes). Not inherited by split(). Throws comm_error if CUDA
  /// cannot create the event.
  void follow(cudaStream_t s) {
    s_->follows = s;
    if (s && !s_->follow_event) {
      const std::string ctx = s_->who() + ": follow";
      detail::nccl_device_scope scope(s_->device, ctx);
      detail::cuda_comm_check(cudaEventCreateWithFlags(&s_->follow_event, cudaEventDisableTiming),
                              "cudaEventCreateWithFlags", ctx);
    }
  }
  /// The stream follow() set (null: none).
  [[nodiscard]] cudaStream_t followed_stream() const { return s_->follows; }
  /// The NCCL communicator (null once aborted).
  [[nodiscard]] ncclComm_t native() const { return s_->comm; }
  /// In-place all-reduce of d_buf[0, n) with `op` (ncclAllReduce, sendbuff
  /// == recvbuff); counts ring_all_reduce_bytes(n, sizeof(T), N, rank). Any
  /// n (0: nothing is enqueued). Throws comm_error (timeout, NCCL, CUDA).
  template <nccl_element T>
  nccl_request iall_reduce(T* d_buf, std::size_t n, reduce_op op) {
    constexpr dtype dt = detail::nccl_dtype<T>();
    return issue(op_kind::all_reduce, n, dt, to_string(op),
                 ring_all_reduce_bytes(n, sizeof(T), size(), rank()),
                 nccl_translate::all_reduce(d_buf, n, dt, op));
  }

  /// d_recv[0, chunk) = op over ranks of d_send[rank*chunk, (rank+1)*chunk)
  /// (ncclReduceScatter); d_send holds size()*chunk elements. In place when
  /// d_recv == d_send + rank*chunk; no other overlap. Counts
  /// (N-1)*chunk*sizeof(T) bytes. Callers pad to equal chunks.
  template <nccl_element T>
  nccl_request ireduce_scatter(const T* d_send, T* d_recv, std::size_t chunk, reduce_op op) {
    constexpr dtype dt = detail::nccl_dtype<T>();
    return issue(op_kind::reduce_scatter, chunk, dt, to_string(op),
                 ring_scatter_gather_bytes(chunk, sizeof(T), size()),
                 nccl_translate::reduce_scatter(d_send, d_recv, chunk, dt, op));
  }

  /// d_recv[r*chunk, (r+1)*chunk) = d_send of rank r (ncclAllGather); in
  /// place when d_send == d_recv + rank*chunk. Counts (N-1)*chunk*sizeof(T).
  template <nccl_element T>
  nccl_request iall_gather(const T* d_send, T* d_recv, std::size_t chunk) {
    constexpr dtype dt = detail::nccl_dtype<T>();
    return issue(op_kind::all_gather, chunk, dt, {},
                 ring_scatter_gather_bytes(chunk, sizeof(T), size()),
                 nccl_translate::all_gather(d_send, d_recv, chunk, dt));
  }

  /// Copies root's d_buf[0, n) to every rank (ncclBroadcast, in place);
  /// counts chain_broadcast_bytes(n, sizeof(T), N, rank, root). Throws
  /// config_error for a root outside [0, size()).
  template <nccl_element T>
  nccl_request ibroadcast(T* d_buf, std::size_t n, int root) {
    check_peer(root, "broadcast root");
    constexpr dtype dt = detail::nccl_dtype<T>();
    return issue(op_kind::broadcast, n, dt, detail::str("root ", root),
                 chain_broadcast_bytes(n, sizeof(T), size(), rank(), root),
                 nccl_translate::broadcast(d_buf, n, dt, root));
  }

  /// Sends d_buf[0, n) to `peer` (ncclSend; blocks the stream until the
  /// peer's matching recv runs, so it can time out). `tag` is not sent (see
  /// the file comment). Counts n*sizeof(T) bytes.
  template <nccl_element T>
  nccl_request isend(const T* d_buf, std::size_t n, int peer, int tag) {
    check_peer(peer, "send peer");
    constexpr dtype dt = detail::nccl_dtype<T>();
    return issue_p2p(op_kind::send, n, dt, peer, tag, n * sizeof(T),
                     nccl_translate::send(d_buf, n, dt, peer));
  }
  /// Receives n elements from `peer` into d_buf (ncclRecv). Precondition:
  /// the peer sends exactly n elements (NCCL does not check). Counts 0 bytes.
  template <nccl_element T>
  nccl_request irecv(T* d_buf, std::size_t n, int peer, int tag) {
    check_peer(peer, "recv peer");
    constexpr dtype dt = detail::nccl_dtype<T>();
    return issue_p2p(op_kind::recv, n, dt, peer, tag, 0, nccl_translate::recv(d_buf, n, dt, peer));
  }

  /// Sends d_send[0, n) to `dst` and receives n elements from `src` into
  /// d_recv as one NCCL group (ncclGroupStart, ncclSend, ncclRecv,
  /// ncclGroupEnd), so a ring shift cannot deadlock. d_send and d_recv must
  /// not overlap. Counted as one send (n*sizeof(T) bytes) and one recv.
  template <nccl_element T>
  nccl_request isendrecv(const T* d_send, int dst, T* d_recv, int src, std::size_t n, int tag) {
    check_peer(dst, "sendrecv destination");
    check_peer(src, "sendrecv source");
    s_->counters.add(op_kind::recv, 1, 0);
    constexpr dtype dt = detail::nccl_dtype<T>();
    return issue_p2p(op_kind::send, n, dt, dst, tag, n * sizeof(T),
                     nccl_translate::sendrecv(d_send, dst, d_recv, src, n, dt),
                     detail::str("peer ", dst, ", from ", src));
  }

  /// The operations `ops` as one NCCL group (ncclGroupStart, an ncclSend or
  /// ncclRecv per operation in order, ncclGroupEnd): they progress
  /// together, so two ranks that send to each other in one group each do
  /// not wait on each other (a pipeline's send of an activation beside the
  /// receive of a gradient). Between two ranks NCCL matches sends and
  /// receives in issue order, whatever the tags. Counts each send (n times
  /// its element size bytes) and each receive. Throws config_error for a
  /// peer outside [0, size()), an operation that is neither send nor recv,
  /// or dtype none; comm_error as the others.
  nccl_request igroup_p2p(std::span<const p2p_op> ops) {
    std::size_t n = 0, sends = 0, recvs = 0;
    std::uint64_t bytes = 0;
    for (const p2p_op& o : ops) {
      check_peer(o.peer, o.kind == op_kind::send ? "group send peer" : "group recv peer");
      TESSERA_THROW_IF(o.kind != op_kind::send && o.kind != op_kind::recv, config_error, s_->who(),
                       ": group_p2p takes send and recv operations, not ", to_string(o.kind));
      TESSERA_THROW_IF(o.dt == dtype::none, config_error, s_->who(),
                       ": group_p2p operation of dtype none");
      n += o.n;
      if (o.kind == op_kind::send) {
        ++sends;
        bytes += o.n * dtype_bytes(o.dt);
      } else {
        ++recvs;
      }
    }
    if (ops.empty()) return nccl_request{};
    const op_kind k = sends > 0 ? op_kind::send : op_kind::recv;
    // issue_p2p counts one operation of kind k; the others here.
    s_->counters.add(op_kind::send, sends - (k == op_kind::send ? 1 : 0), 0);
    s_->counters.add(op_kind::recv, recvs - (k == op_kind::recv ? 1 : 0), 0);
    std::string extra = detail::str("group of ", sends, " sends and ", recvs, " receives:");
    for (const p2p_op& o : ops)
      extra += detail::str(" ", o.kind == op_kind::send ? "to " : "from ", o.peer, " (tag ", o.tag,
                           ", n=", o.n, ")");
    return issue_p2p(k, n, ops.front().dt, ops.front().peer, ops.front().tag, bytes,
                     nccl_translate::group_p2p(ops), std::move(extra));
  }

  /// Completes once every rank's stream reached it (an ncclAllReduce of
  /// one int32 on a device word the communicator owns). Counts 0.
  nccl_request ibarrier() {
    return issue(op_kind::barrier, 0, dtype::none, {}, 0, nccl_translate::barrier(s_->d_barrier));
  }

  /// Collective (every rank calls it): ranks with the same color (>= 0) form
  /// a new communicator ranked by (key, rank) (ncclCommSplit, NCCL >= 2.18,
  /// nonblocking, polled against timeout()). The child runs on its own new
  /// stream of the same device and inherits timeout and debug settings.
  /// Counts the ring all-gather of 2 int64 per rank, like the others.
  /// Throws config_error for color < 0 (or, built against NCCL < 2.18,
  /// always: ncclCommSplit is needed), comm_error for NCCL/CUDA failures.
  nccl_communicator split(int color, int key) {
    TESSERA_THROW_IF(color < 0, config_error, s_->who(), ": split color ", color, " must be >= 0");
    auto c = usable(s_->collective(op_kind::split, 2, dtype::i64,
                                   detail::str("color ", color, ", key ", key), size(),
                                   ring_scatter_gather_bytes(2, 8, size())));
    const std::string ctx = s_->context(c);
#if TESSERA_NCCL_HAS_SPLIT
    detail::nccl_device_scope scope(s_->device, ctx);
    nccl_communicator child(adopt_tag{}, *s_);
    child.setup_device_resources(nullptr, ctx);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    const ncclResult_t r = ncclCommSplit(s_->comm, color, key, &child.s_->comm, &cfg);
    auto& cs = *child.s_;
    if (r != ncclSuccess && r != ncclInProgress) cs.comm = nullptr;
    // Nonblocking split: both the parent and the child report progress.
    s_->settle(r, "ncclCommSplit", ctx, s_->opt.timeout);
    TESSERA_THROW_IF(!cs.comm, comm_error, ctx,
                     ": ncclCommSplit returned no communicator for color ", color);
    cs.settle(ncclInProgress, "ncclCommSplit (new communicator)", ctx, s_->opt.timeout);
    const ncclResult_t r1 = ncclCommUserRank(cs.comm, &cs.rank);
    const ncclResult_t r2 = ncclCommCount(cs.comm, &cs.size);
    TESSERA_THROW_IF(r1 != ncclSuccess || r2 != ncclSuccess, comm_error, ctx,
                     ": ncclCommUserRank/ncclCommCount failed with ",
                     detail::nccl_result_text(r1 != ncclSuccess ? r1 : r2, cs.comm));
    return child;
#else
    (void)key;
    throw config_error(detail::str(ctx,
                                   ": split needs ncclCommSplit, NCCL >= 2.18; this build "
                                   "has NCCL ",
                                   NCCL_MAJOR, ".", NCCL_MINOR, ".", NCCL_PATCH,
                                   ". Build a sub-communicator from an MPI split instead: "
                                   "nccl_communicator(mpi.split(color, key), device)"));
#endif
  }

  /// Debug mode: all-gathers every rank's (count, hash) of the collectives
  /// issued (through a temporary device buffer); throws comm_error naming
  /// the first divergent collective (sequence number, each rank's
  /// description); config_error if debug mode is off.
  void verify_collective_hash() {
    s_->log.verify(rank(), size(),
                   [this](const std::uint64_t* h_send, std::uint64_t* h_recv, std::size_t w) {
                     gather_host_words(h_send, h_recv, w);
                   });
  }

 private:
  struct adopt_tag {};
  /// A child of `parent` (split): same device, world rank, settings.
  nccl_communicator(adopt_tag, const detail::nccl_comm_state& parent)
      : s_(std::make_unique<detail::nccl_comm_state>()) {
    s_->device = parent.device;
    s_->world_rank = parent.world_rank;
    s_->configure(parent.opt);
  }
  /// The barrier word and, if `stream` is null, an owned stream. Current
  /// device must be s_->device.
  void setup_device_resources(cudaStream_t stream, const std::string& ctx) {
    auto& s = *s_;
    detail::cuda_comm_check(cudaMalloc(reinterpret_cast<void**>(&s.d_barrier), sizeof(int)),
                            "cudaMalloc", ctx);
    detail::cuda_comm_check(cudaMemset(s.d_barrier, 0, sizeof(int)), "cudaMemset", ctx);
    if (!stream) {
      detail::cuda_comm_check(cudaStreamCreateWithFlags(&s.owned_stream, cudaStreamNonBlocking),
                              "cudaStreamCreateWithFlags", ctx);
      stream = s.owned_stream;
    }
    s.stream = stream;
  }
  static std::string init_error_message(const std::string& ctx, ncclResult_t r) {
    return detail::str(ctx, ": ncclCommInitRankConfig failed with ",
                       detail::nccl_result_text(r, nullptr));
  }
  friend class communicator_base<nccl_communicator>;
  detail::rank_core& core() {
    return *s_;
  }
  const detail::rank_core& core() const {
    return *s_;
  }
  std::string who() const {
    return s_->who();
  }
  /// `c` (numbered and counted), refused on a broken communicator.
  detail::op_ctx usable(detail::op_ctx c) {
    s_->check_usable(s_->context(c));
    return c;
  }
  /// Issues `calls` (nccl_translate's list; empty when the operation moves
  /// nothing, which every rank of a collective shares) on the stream, after
  /// the followed stream's work (follow), waits for NCCL to finish
  /// enqueueing, and records the completion event.
  nccl_request launch(detail::op_ctx c, const nccl_translate::calls& calls) {
    auto& s = *s_;
    auto p = std::make_unique<detail::nccl_pending>();
    p->st = s_.get();
    p->c = std::move(c);
    const std::string ctx = s.context(p->c);
    detail::nccl_device_scope scope(s.device, ctx);
    detail::cuda_comm_check(cudaEventCreateWithFlags(&p->ev, cudaEventDisableTiming),
                            "cudaEventCreateWithFlags", ctx);
    if (s.follows && s.follows != s.stream) {  // after the kernels that wrote its inputs
      detail::cuda_comm_check(cudaEventRecord(s.follow_event, s.follows), "cudaEventRecord", ctx);
      detail::cuda_comm_check(cudaStreamWaitEvent(s.stream, s.follow_event, 0),
                              "cudaStreamWaitEvent", ctx);
    }
    if (!calls.empty())
      s.settle(detail::nccl_issue(calls, s.comm, s.stream), calls_name(calls).c_str(), ctx,
               p->c.timeout);
    detail::cuda_comm_check(cudaEventRecord(p->ev, s.stream), "cudaEventRecord", ctx);
    return nccl_request(std::move(p));
  }
  nccl_request issue(op_kind k, std::size_t n, dtype d, std::string extra, std::uint64_t bytes,
                     const nccl_translate::calls& calls) {
    return launch(usable(s_->collective(k, n, d, std::move(extra), size(), bytes)), calls);
  }
  nccl_request issue_p2p(op_kind k, std::size_t n, dtype d, int peer, int tag, std::uint64_t bytes,
                         const nccl_translate::calls& calls, std::string extra = {}) {
    return launch(usable(s_->p2p(k, n, d, peer, tag, bytes, std::move(extra))), calls);
  }
  /// all_gather of w host words per rank through a temporary device buffer
  /// (verify_collective_hash).
  void gather_host_words(const std::uint64_t* h_send, std::uint64_t* h_recv, std::size_t w) {
    const std::string ctx = s_->who() + ": verify_collective_hash";
    detail::nccl_device_scope scope(s_->device, ctx);
    const std::size_t N = static_cast<std::size_t>(size());
    std::uint64_t* d = nullptr;
    detail::cuda_comm_check(
        cudaMalloc(reinterpret_cast<void**>(&d), (N + 1) * w * sizeof(std::uint64_t)), "cudaMalloc",
        ctx);
    struct freer {
      std::uint64_t* p;
      ~freer() { (void)cudaFree(p); }
    } guard{d};
    std::uint64_t* d_send = d + N * w;
    detail::cuda_comm_check(
        cudaMemcpy(d_send, h_send, w * sizeof(std::uint64_t), cudaMemcpyHostToDevice), "cudaMemcpy",
        ctx);
    all_gather(d_send, d, w);
    detail::cuda_comm_check(
        cudaMemcpy(h_recv, d, N * w * sizeof(std::uint64_t), cudaMemcpyDeviceToHost), "cudaMemcpy",
        ctx);
  }

  std::unique_ptr<detail::nccl_comm_state> s_;
};

static_assert(check_communicator<nccl_communicator>());
static_assert(device_communicator<nccl_communicator> && !host_communicator<nccl_communicator>,
              "nccl_communicator takes DEVICE buffers: code written for host buffers (std::vector "
              "data, host tensors) must require host_communicator and cannot use it; stage "
              "through device memory or use mpi_communicator");

}  // namespace tessera::comm
