#pragma once
/// \file core/cuda.hpp
/// The CUDA backend: status checks, `tessera::cuda` (satisfies `backend`),
/// RAII `cuda::stream` and `cuda::event`, the caching device allocator
/// `cuda_caching_resource` and the pinned host resource.
///
/// Needs the CUDA runtime headers and libcudart (link tessera::cuda). Plain
/// host code (g++) may include it; nothing here needs nvcc. Every CUDA,
/// cuBLASLt and NCCL status is checked and turned into tessera::error naming
/// the call, the code and its string (STYLE.md, "Errors", 4).

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "tessera/core/backend.hpp"
#include "tessera/core/caching_allocator.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/memory.hpp"

#if __has_include(<cublasLt.h>)
#include <cublasLt.h>
#define TESSERA_HAS_CUBLASLT 1
#endif
#if __has_include(<nccl.h>)
#include <nccl.h>
#define TESSERA_HAS_NCCL_HEADER 1
#endif

namespace tessera {

/// A failed CUDA runtime, cuBLASLt or NCCL call. `code()` is the library's
/// status as an integer.
class cuda_error : public error {
 public:
  cuda_error(const std::string& msg, int code) : error(msg), code_(code) {}
  int code() const { return code_; }

 private:
  int code_;
};

namespace detail {

[[noreturn]] inline void throw_cuda_error(cudaError_t e, const char* call, const char* file,
                                          int line) {
  (void)cudaGetLastError();  // clear a sticky-free error so later calls are not blamed
  throw cuda_error(str(call, " failed: ", cudaGetErrorName(e), " (", static_cast<int>(e),
                       "): ", cudaGetErrorString(e), " at ", file, ":", line),
                   static_cast<int>(e));
}

#if defined(TESSERA_HAS_CUBLASLT)
/// cublasStatus_t -> its enumerator name. (cublasGetStatusString lives in
/// libcublas, which tessera::cuda does not link.)
inline const char* cublas_status_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "CUBLAS_STATUS_LICENSE_ERROR";
    default:
      return "unknown cublasStatus_t";
  }
}
/// A readable hint for the statuses a misconfigured matmul returns.
inline const char* cublas_status_hint(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "no algorithm for this type, layout or alignment combination";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "an argument is out of range";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "the cuBLASLt handle was not created";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "cuBLASLt could not allocate memory";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "the GPU lacks a required feature";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "the kernel failed to launch or run";
    default:
      return "see the cuBLASLt documentation";
  }
}
[[noreturn]] inline void throw_cublas_error(cublasStatus_t s, const char* call, const char* file,
                                            int line) {
  throw cuda_error(str(call, " failed: ", cublas_status_name(s), " (", static_cast<int>(s),
                       "): ", cublas_status_hint(s), " at ", file, ":", line),
                   static_cast<int>(s));
}
#endif

#if defined(TESSERA_HAS_NCCL_HEADER)
/// Needs libnccl at link time (only code that uses TESSERA_NCCL_CHECK).
[[noreturn]] inline void throw_nccl_error(ncclResult_t r, const char* call, const char* file,
                                          int line) {
  throw cuda_error(str(call, " failed: ncclResult_t ", static_cast<int>(r), ": ",
                       ncclGetErrorString(r), " at ", file, ":", line),
                   static_cast<int>(r));
}
#endif

}  // namespace detail
}  // namespace tessera

/// Evaluates a CUDA runtime call; on failure throws tessera::cuda_error
/// naming the call, the error's name, number and string, and the location.
#define TESSERA_CUDA_CHECK(call)                                                            \
  do {                                                                                      \
    const cudaError_t tessera_cuda_status_ = (call);                                        \
    if (tessera_cuda_status_ != cudaSuccess)                                                \
      ::tessera::detail::throw_cuda_error(tessera_cuda_status_, #call, __FILE__, __LINE__); \
  } while (0)

/// Checks the launch just made (cudaGetLastError): a bad configuration is
/// reported at the launch site, not at the next synchronisation.
/// `what` is a string literal naming the kernel.
#define TESSERA_CUDA_CHECK_LAUNCH(what)                                                      \
  do {                                                                                       \
    const cudaError_t tessera_cuda_status_ = cudaGetLastError();                             \
    if (tessera_cuda_status_ != cudaSuccess)                                                 \
      ::tessera::detail::throw_cuda_error(tessera_cuda_status_, "launch of " what, __FILE__, \
                                          __LINE__);                                         \
  } while (0)

#if defined(TESSERA_HAS_CUBLASLT)
/// Evaluates a cuBLAS/cuBLASLt call; throws tessera::cuda_error on failure.
#define TESSERA_CUBLAS_CHECK(call)                                                              \
  do {                                                                                          \
    const cublasStatus_t tessera_cublas_status_ = (call);                                       \
    if (tessera_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                        \
      ::tessera::detail::throw_cublas_error(tessera_cublas_status_, #call, __FILE__, __LINE__); \
  } while (0)
#endif

#if defined(TESSERA_HAS_NCCL_HEADER)
/// Evaluates an NCCL call; throws tessera::cuda_error on failure.
#define TESSERA_NCCL_CHECK(call)                                                            \
  do {                                                                                      \
    const ncclResult_t tessera_nccl_status_ = (call);                                       \
    if (tessera_nccl_status_ != ncclSuccess)                                                \
      ::tessera::detail::throw_nccl_error(tessera_nccl_status_, #call, __FILE__, __LINE__); \
  } while (0)
#endif

namespace tessera {

namespace detail {

/// The system below the CUDA caching allocator: cudaMalloc/cudaFree on one
/// device and CUDA events (system_allocator, caching_allocator.hpp).
struct cuda_device_system {
  using event_type = cudaEvent_t;
  /// cudaMalloc returns at least 256-byte aligned memory.
  static constexpr std::size_t base_alignment = 256;
  int device = 0;

  /// A segment of `bytes`, or nullptr when the device is out of memory.
  /// Throws cuda_error for any other failure.
  void* allocate(std::size_t bytes) {
    device_guard g(device);
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return nullptr;
    }
    if (e != cudaSuccess) throw_cuda_error(e, "cudaMalloc(&p, bytes)", __FILE__, __LINE__);
    return p;
  }
  void deallocate(void* p, std::size_t) {
    device_guard g(device);
    TESSERA_CUDA_CHECK(cudaFree(p));
  }
  cudaEvent_t record_event(stream_id s) {
    device_guard g(device);
    cudaEvent_t e;
    TESSERA_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    TESSERA_CUDA_CHECK(cudaEventRecord(e, reinterpret_cast<cudaStream_t>(s)));
    return e;
  }
  bool event_done(cudaEvent_t e) {
    const cudaError_t r = cudaEventQuery(e);
    if (r == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    if (r != cudaSuccess) throw_cuda_error(r, "cudaEventQuery(e)", __FILE__, __LINE__);
    return true;
  }
  void wait_event(cudaEvent_t e) { TESSERA_CUDA_CHECK(cudaEventSynchronize(e)); }
  void destroy_event(cudaEvent_t e) { (void)cudaEventDestroy(e); }
  std::string name() const { return "cuda:" + std::to_string(device); }

  /// Makes `device` current for its lifetime, restoring the previous one.
  struct device_guard {
    int prev = -1;
    explicit device_guard(int d) {
      TESSERA_CUDA_CHECK(cudaGetDevice(&prev));
      if (prev != d) TESSERA_CUDA_CHECK(cudaSetDevice(d));
    }
    ~device_guard() {
      int cur = -1;
      if (cudaGetDevice(&cur) == cudaSuccess && cur != prev) (void)cudaSetDevice(prev);
    }
    device_guard(const device_guard&) = delete;
    device_guard& operator=(const device_guard&) = delete;
  };
};

}  // namespace detail

/// Caching device allocator for one GPU (caching_allocator.hpp gives the
/// rules): cudaMalloc'd segments of 2 MiB, 20 MiB or the rounded request,
/// blocks reused on the same stream without synchronisation, cross-stream
/// use tracked with events (record_stream), allocated/reserved/peak bytes,
/// empty_cache() and a JSON event log. Thread-safe. The memory_resource
/// interface allocates on the current stream (set_stream; the legacy
/// default stream at first). Source: PyTorch's CUDACachingAllocator.
class cuda_caching_resource final : public caching_allocator<detail::cuda_device_system> {
 public:
  /// An allocator for `device`; nothing is allocated until the first request.
  explicit cuda_caching_resource(int device = 0, caching_allocator_config cfg = {})
      : caching_allocator(detail::cuda_device_system{device}, cfg), device_(device) {}
  using caching_allocator::allocate_on;
  using caching_allocator::record_stream;
  using caching_allocator::set_stream;
  /// Allocates `bytes` for work on `s` (stream-ordered reuse).
  void* allocate_on(std::size_t bytes, cudaStream_t s, std::size_t alignment = 256) {
    return caching_allocator::allocate_on(bytes, reinterpret_cast<stream_id>(s), alignment);
  }
  /// Marks the live block at `p` as also used by work on `s`.
  void record_stream(void* p, cudaStream_t s) {
    caching_allocator::record_stream(p, reinterpret_cast<stream_id>(s));
  }
  /// Sets the stream that allocate() uses.
  void set_stream(cudaStream_t s) { caching_allocator::set_stream(reinterpret_cast<stream_id>(s)); }
  /// The device this allocator serves.
  int device() const { return device_; }

 private:
  int device_;
};

/// A view of a cuda_caching_resource that allocates every block on one
/// stream (allocate_on), so a model or optimizer can own tensors used on its
/// stream without changing the allocator's current stream for everyone
/// else. Statistics are the underlying allocator's. Neither the allocator
/// nor the stream is owned; both must outlive the view and its blocks.
class stream_bound_resource final : public memory_resource {
 public:
  stream_bound_resource(cuda_caching_resource& mr, cudaStream_t s) : mr_(&mr), stream_(s) {}
  void* allocate(std::size_t bytes, std::size_t alignment = 256) override {
    return mr_->allocate_on(bytes, stream_, std::max<std::size_t>(alignment, 256));
  }
  void deallocate(void* p, std::size_t bytes) noexcept override { mr_->deallocate(p, bytes); }
  memory_stats stats() const override { return mr_->stats(); }
  void reset_peak() override { mr_->reset_peak(); }
  std::string name() const override { return mr_->name(); }
  cuda_caching_resource& upstream() const { return *mr_; }
  cudaStream_t stream() const { return stream_; }

 private:
  cuda_caching_resource* mr_;
  cudaStream_t stream_;
};

/// Page-locked host memory (cudaHostAlloc), for asynchronous copies and the
/// data loader's double buffer. Counted like host_memory_resource (reserved
/// == allocated: no cache). Throws cuda_error if the runtime refuses.
class pinned_memory_resource final : public memory_resource {
 public:
  void* allocate(std::size_t bytes, std::size_t alignment = 64) override {
    TESSERA_THROW_IF(alignment > 4096 || (alignment & (alignment - 1)), config_error,
                     "pinned_memory_resource: alignment ", alignment,
                     " must be a power of two <= 4096 (cudaHostAlloc aligns to pages)");
    void* p = nullptr;
    TESSERA_CUDA_CHECK(cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault));
    std::lock_guard lock(mu_);
    s_.allocated += bytes;
    s_.reserved += bytes;
    s_.peak_allocated = std::max(s_.peak_allocated, s_.allocated);
    s_.peak_reserved = std::max(s_.peak_reserved, s_.reserved);
    ++s_.num_allocs;
    return p;
  }
  void deallocate(void* p, std::size_t bytes) noexcept override {
    if (!p) return;
    (void)cudaFreeHost(p);
    std::lock_guard lock(mu_);
    s_.allocated -= bytes;
    s_.reserved -= bytes;
  }
  memory_stats stats() const override {
    std::lock_guard lock(mu_);
    return s_;
  }
  void reset_peak() override {
    std::lock_guard lock(mu_);
    s_.peak_allocated = s_.allocated;
    s_.peak_reserved = s_.reserved;
  }
  std::string name() const override { return "cuda_pinned"; }

 private:
  mutable std::mutex mu_;
  memory_stats s_;
};

/// The CUDA backend (DESIGN.md, "Key types"): device memory from a caching
/// allocator per device, synchronous copies for the `backend` concept and
/// asynchronous ones on a stream, `stream` and `event` RAII types.
struct cuda {
  static constexpr const char* name = "cuda";

  /// Number of visible devices; 0 when there is none or the driver is
  /// missing (never throws: tests use it to skip).
  static int device_count() noexcept {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return n;
  }
  /// The current device (cudaGetDevice). Throws cuda_error.
  static int current_device() {
    int d = 0;
    TESSERA_CUDA_CHECK(cudaGetDevice(&d));
    return d;
  }
  /// The compute capability of `device` as 10 major + minor (90 for an
  /// H100, 80 for an A100). Throws cuda_error.
  static int compute_capability(int device) {
    int major = 0, minor = 0;
    TESSERA_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    TESSERA_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    return 10 * major + minor;
  }

  /// The process-wide caching allocator of device `device` (created on first
  /// use, never destroyed: it outlives static tensors). Throws config_error
  /// for a device index outside [0, 64).
  static cuda_caching_resource& resource(int device) {
    TESSERA_THROW_IF(device < 0 || device >= max_devices, config_error, "cuda::resource: device ",
                     device, " is outside [0, ", max_devices, ")");
    static std::once_flag flags[max_devices];
    static cuda_caching_resource* r[max_devices] = {};
    std::call_once(flags[device], [&] { r[device] = new cuda_caching_resource(device); });
    return *r[device];
  }
  /// The current device's caching allocator (the `backend` concept).
  static memory_resource& default_resource() { return resource(current_device()); }

  /// The datasheet's dense bf16 tensor-core rate of `device`, FLOP/s, from
  /// its name (NVIDIA's datasheets, without sparsity): H100 and H200 SXM
  /// 989.4 TFLOP/s, H100 PCIe 756, H100 NVL 835, A100 312, L40S 362.05,
  /// L4 121; 0 for a GPU not in this table (pass the rate instead: MFU is
  /// taken against a fixed peak, not a measured one). Throws cuda_error.
  static double datasheet_bf16_flops(int device) {
    cudaDeviceProp p{};
    TESSERA_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
    const std::string n = p.name;
    auto has = [&](const char* s) { return n.find(s) != std::string::npos; };
    if (has("H200")) return 989.4e12;
    if (has("H100")) return has("PCIe") ? 756e12 : has("NVL") ? 835e12 : 989.4e12;
    if (has("A100")) return 312e12;
    if (has("L40S")) return 362.05e12;
    if (has("L4")) return 121e12;
    return 0.0;
  }

  /// Device -> host copy of `bytes`, synchronous. Ordered with the legacy
  /// stream only: synchronise a non-blocking stream that writes `d_src`
  /// first. Throws cuda_error.
  static void copy_to_host(void* h_dst, const void* d_src, std::size_t bytes) {
    if (bytes) TESSERA_CUDA_CHECK(cudaMemcpy(h_dst, d_src, bytes, cudaMemcpyDeviceToHost));
  }
  /// Host -> device copy of `bytes`, synchronous: returns when the data is
  /// on the device (cudaMemcpy from pageable memory may return once the
  /// data is staged, so the legacy stream is synchronised too). Ordered with
  /// the legacy stream only: synchronise a non-blocking stream that still
  /// uses `d_dst` first. Throws cuda_error.
  static void copy_from_host(void* d_dst, const void* h_src, std::size_t bytes) {
    if (!bytes) return;
    TESSERA_CUDA_CHECK(cudaMemcpy(d_dst, h_src, bytes, cudaMemcpyHostToDevice));
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
  }
  /// Host -> device copy of `bytes` ordered on stream `s`, returning when
  /// it is done (for host data that is not pinned). Throws cuda_error.
  static void copy_from_host(void* d_dst, const void* h_src, std::size_t bytes, cudaStream_t s) {
    if (!bytes) return;
    TESSERA_CUDA_CHECK(cudaMemcpyAsync(d_dst, h_src, bytes, cudaMemcpyHostToDevice, s));
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(s));
  }
  /// Device -> host copy of `bytes` ordered on stream `s`, returning when
  /// it is done. Throws cuda_error.
  static void copy_to_host(void* h_dst, const void* d_src, std::size_t bytes, cudaStream_t s) {
    if (!bytes) return;
    TESSERA_CUDA_CHECK(cudaMemcpyAsync(h_dst, d_src, bytes, cudaMemcpyDeviceToHost, s));
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(s));
  }
  /// Asynchronous copy of `bytes` on stream `s` (any direction; pinned host
  /// memory for a truly asynchronous host transfer). Throws cuda_error.
  static void copy_async(void* dst, const void* src, std::size_t bytes, cudaStream_t s) {
    if (bytes) TESSERA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s));
  }
  /// Waits for all work on the current device. Throws cuda_error, which is
  /// where an asynchronous kernel fault surfaces.
  static void synchronize() { TESSERA_CUDA_CHECK(cudaDeviceSynchronize()); }

  class event;

  /// Owning CUDA stream (cudaStreamNonBlocking: no implicit sync with the
  /// legacy default stream). Move-only.
  class stream {
   public:
    /// Creates a stream on the current device. Throws cuda_error.
    stream() { TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
    stream(const stream&) = delete;
    stream& operator=(const stream&) = delete;
    stream(stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
    stream& operator=(stream&& o) noexcept {
      if (this != &o) {
        reset();
        s_ = std::exchange(o.s_, nullptr);
      }
      return *this;
    }
    ~stream() { reset(); }
    cudaStream_t get() const { return s_; }
    operator cudaStream_t() const { return s_; }
    /// Waits for the stream's work. Throws cuda_error.
    void synchronize() const { TESSERA_CUDA_CHECK(cudaStreamSynchronize(s_)); }
    /// Makes later work on this stream wait for `e` (no host block).
    void wait(const event& e) const;

   private:
    void reset() noexcept {
      if (s_) (void)cudaStreamDestroy(s_);
      s_ = nullptr;
    }
    cudaStream_t s_ = nullptr;
  };

  /// Owning CUDA event. Timing is on unless `timing` is false (a
  /// synchronisation-only event is cheaper). Move-only.
  class event {
   public:
    /// Creates an event on the current device. Throws cuda_error.
    explicit event(bool timing = true) {
      TESSERA_CUDA_CHECK(
          cudaEventCreateWithFlags(&e_, timing ? cudaEventDefault : cudaEventDisableTiming));
    }
    event(const event&) = delete;
    event& operator=(const event&) = delete;
    event(event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
    event& operator=(event&& o) noexcept {
      if (this != &o) {
        reset();
        e_ = std::exchange(o.e_, nullptr);
      }
      return *this;
    }
    ~event() { reset(); }
    cudaEvent_t get() const { return e_; }
    /// Records the event after the work queued on `s` so far.
    void record(cudaStream_t s) { TESSERA_CUDA_CHECK(cudaEventRecord(e_, s)); }
    /// Blocks the host until the recorded work is done. Throws cuda_error.
    void synchronize() const { TESSERA_CUDA_CHECK(cudaEventSynchronize(e_)); }
    /// True when the recorded work is done (never blocks). Throws cuda_error
    /// for a failure other than "not ready".
    bool query() const {
      const cudaError_t r = cudaEventQuery(e_);
      if (r == cudaErrorNotReady) {
        (void)cudaGetLastError();
        return false;
      }
      TESSERA_CUDA_CHECK(r);
      return true;
    }
    /// Milliseconds from `start` to this event (both recorded with timing on
    /// and completed). Throws cuda_error.
    float elapsed_ms_since(const event& start) const {
      float ms = 0;
      TESSERA_CUDA_CHECK(cudaEventElapsedTime(&ms, start.e_, e_));
      return ms;
    }

   private:
    void reset() noexcept {
      if (e_) (void)cudaEventDestroy(e_);
      e_ = nullptr;
    }
    cudaEvent_t e_ = nullptr;
  };

  /// A process-wide pinned host resource.
  static pinned_memory_resource& pinned_resource() {
    static pinned_memory_resource r;
    return r;
  }

  static constexpr int max_devices = 64;
};

inline void cuda::stream::wait(const event& e) const {
  TESSERA_CUDA_CHECK(cudaStreamWaitEvent(s_, e.get(), 0));
}

static_assert(backend<cuda>);

}  // namespace tessera
