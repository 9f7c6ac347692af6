#pragma once
/// \file comm/detail/nccl_state.hpp
/// Internals of nccl_communicator (comm/nccl.hpp): checked CUDA and NCCL
/// calls that throw comm_error, the element-type mapping, the shared state
/// of one communicator, and the deadline-bounded polling of a nonblocking
/// NCCL communicator. Included only from comm/nccl.hpp, after its guards.

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <concepts>
#include <string>
#include <thread>

#include "tessera/comm/communicator.hpp"
#include "tessera/comm/communicator_base.hpp"
#include "tessera/comm/detail/collective_log.hpp"
#include "tessera/core/numeric.hpp"

namespace tessera::comm {

/// `nccl_element<T>`: the element types nccl_communicator moves: float,
/// double, std::int32_t, std::int64_t, std::uint64_t (the `comm_element`
/// types), tessera::bf16 (ncclBfloat16) and tessera::fp16 (ncclFloat16).
template <class T>
concept nccl_element =
    comm_element<T> || std::same_as<T, tessera::bf16> || std::same_as<T, tessera::fp16>;

namespace detail {

/// The NCCL datatype of `d` (none is refused before: ncclInt8 is never
/// issued).
constexpr ncclDataType_t nccl_type(dtype d) {
  switch (d) {
    case dtype::f32:
      return ncclFloat32;
    case dtype::f64:
      return ncclFloat64;
    case dtype::i32:
      return ncclInt32;
    case dtype::i64:
      return ncclInt64;
    case dtype::u64:
      return ncclUint64;
    case dtype::bf16:
      return ncclBfloat16;
    case dtype::f16:
      return ncclFloat16;
    case dtype::none:
      break;
  }
  return ncclInt8;
}

/// The dtype tag of T (error messages, the debug hash).
template <nccl_element T>
constexpr dtype nccl_dtype() {
  if constexpr (std::same_as<T, tessera::bf16>)
    return dtype::bf16;
  else if constexpr (std::same_as<T, tessera::fp16>)
    return dtype::f16;
  else
    return dtype_of<T>();
}
constexpr ncclRedOp_t nccl_op(reduce_op op) {
  return op == reduce_op::sum ? ncclSum : ncclMax;
}

/// Throws comm_error "<context>: <call> failed with <name> (<code>): <string>"
/// unless e is cudaSuccess (and clears the runtime's last error).
inline void cuda_comm_check(cudaError_t e, const char* call, const std::string& context) {
  if (e == cudaSuccess) return;
  (void)cudaGetLastError();
  throw comm_error(str(context, ": ", call, " failed with ", cudaGetErrorName(e), " (",
                       static_cast<int>(e), "): ", cudaGetErrorString(e)));
}

/// "ncclResult_t 3 (internal error - please report this issue to the NCCL
/// developers); NCCL's last error: ..." (ncclGetErrorString, ncclGetLastError).
inline std::string nccl_result_text(ncclResult_t r, ncclComm_t comm) {
  std::string s = str("ncclResult_t ", static_cast<int>(r), " (", ncclGetErrorString(r), ")");
  const char* last = ncclGetLastError(comm);
  if (last && *last) s += str("; NCCL's last error: ", last);
  return s;
}

/// The state of one nccl_communicator, on the heap so requests can point at
/// it and the communicator can move. Its destructor releases everything
/// (also after a constructor that threw half-way).
struct nccl_comm_state : rank_core {
  ncclComm_t comm = nullptr;  // null once aborted or destroyed
  int rank = 0, size = 1, world_rank = 0, device = 0;
  cudaStream_t stream = nullptr;
  cudaStream_t owned_stream = nullptr;  // created by the communicator, destroyed with it
  cudaStream_t follows = nullptr;       // follow(): every operation waits for this stream's work
  cudaEvent_t follow_event = nullptr;   // recorded on `follows` at each issue, waited on `stream`
  int* d_barrier = nullptr;             // one int32 on the device: barrier's all-reduce
  std::string broken;                   // the first error; later operations throw it at once
  bool aborted = false;

  nccl_comm_state() = default;
  nccl_comm_state(const nccl_comm_state&) = delete;
  nccl_comm_state& operator=(const nccl_comm_state&) = delete;

  /// Finalizes (flushing pending work) and destroys the NCCL communicator,
  /// waiting at most opt.timeout, then aborts it instead; frees the barrier
  /// word, the follow event and an owned stream. Never throws.
  ~nccl_comm_state() {
    int prev = -1;
    const bool have_prev = cudaGetDevice(&prev) == cudaSuccess;
    if (have_prev && prev != device) (void)cudaSetDevice(device);
    if (comm && !aborted) {
      bool clean = false;
      const ncclResult_t r = ncclCommFinalize(comm);
      if (r == ncclSuccess || r == ncclInProgress)
        clean = poll_async(std::chrono::steady_clock::now() + opt.timeout) == ncclSuccess;
      if (clean)
        (void)ncclCommDestroy(comm);
      else
        (void)ncclCommAbort(comm);
      comm = nullptr;
    }
    if (d_barrier) (void)cudaFree(d_barrier);
    if (follow_event) (void)cudaEventDestroy(follow_event);
    if (owned_stream) (void)cudaStreamDestroy(owned_stream);
    (void)cudaGetLastError();
    if (have_prev && prev != device) (void)cudaSetDevice(prev);
  }

  [[nodiscard]] std::string who() const {
    std::string s = str("rank ", rank, " of ", size);
    if (world_rank != rank) s += str(" (world rank ", world_rank, ")");
    return s + str(", cuda:", device);
  }
  [[nodiscard]] std::string context(const op_ctx& c) const { return who() + ": " + describe(c); }

  /// ncclCommAbort (frees the communicator, ends its kernels); later
  /// operations throw `broken`. Never throws.
  void abort(const std::string& why) noexcept {
    if (broken.empty()) broken = why;
    if (comm && !aborted) (void)ncclCommAbort(comm);
    comm = nullptr;
    aborted = true;
  }

  /// Polls ncclCommGetAsyncError until the communicator's state is no
  /// longer ncclInProgress or `deadline` passes (then returns ncclInProgress).
  ncclResult_t poll_async(std::chrono::steady_clock::time_point deadline) const noexcept {
    for (unsigned spins = 0;; ++spins) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
      if (r != ncclSuccess) return r;
      if (state != ncclInProgress) return state;
      if (std::chrono::steady_clock::now() >= deadline) return ncclInProgress;
      if (spins > 1000)
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      else
        std::this_thread::yield();
    }
  }

  /// After an NCCL call `call` that returned r on this (nonblocking)
  /// communicator: waits until NCCL finished enqueueing (or initialising,
  /// splitting, connecting) or `timeout` passed. Throws comm_error naming
  /// the context, the call and the code (ncclGetErrorString); on timeout it
  /// aborts the communicator first. Either way the communicator is broken.
  void settle(ncclResult_t r, const char* call, const std::string& ctx,
              std::chrono::milliseconds timeout) {
    if (r == ncclSuccess || r == ncclInProgress)
      r = poll_async(std::chrono::steady_clock::now() + timeout);
    if (r == ncclSuccess) return;
    std::string msg =
        r == ncclInProgress
            ? str(ctx, ": ", call, " did not complete within ", timeout.count(),
                  " ms (a rank has not entered it, or NCCL could not connect); the NCCL "
                  "communicator was aborted (ncclCommAbort)")
            : str(ctx, ": ", call, " failed with ", nccl_result_text(r, comm),
                  "; the NCCL communicator was aborted (ncclCommAbort)");
    abort(msg);
    throw comm_error(msg);
  }

  /// Throws comm_error naming `ctx` if an earlier error broke the communicator.
  void check_usable(const std::string& ctx) const {
    TESSERA_THROW_IF(!broken.empty(), comm_error, ctx,
                     ": this communicator is broken by an earlier error: ", broken.substr(0, 400));
  }
};

/// Makes `device` current for its lifetime, restoring the previous device.
/// Throws comm_error (naming `ctx`) if the runtime refuses.
class nccl_device_scope {
 public:
  nccl_device_scope(int device, const std::string& ctx) {
    cuda_comm_check(cudaGetDevice(&prev_), "cudaGetDevice", ctx);
    if (prev_ != device) cuda_comm_check(cudaSetDevice(device), "cudaSetDevice", ctx);
  }
  ~nccl_device_scope() {
    int cur = -1;
    if (cudaGetDevice(&cur) == cudaSuccess && cur != prev_) (void)cudaSetDevice(prev_);
  }
  nccl_device_scope(const nccl_device_scope&) = delete;
  nccl_device_scope& operator=(const nccl_device_scope&) = delete;

 private:
  int prev_ = 0;
};

}  // namespace detail
}  // namespace tessera::comm
