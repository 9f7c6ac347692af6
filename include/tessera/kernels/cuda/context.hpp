#pragma once
/// \file kernels/cuda/context.hpp
/// The CUDA execution context (kernels/context.hpp): one device, one
/// stream every kernel, copy and collective of its users is ordered on, a
/// cuBLASLt handle with its workspace and plan cache, and the device's
/// caching allocator bound to that stream. `context_t<cuda>` is this type.
///
/// Plain C++ (g++ with the CUDA runtime headers); the kernel entry points
/// over it are in kernels/cuda/ops.hpp (link tessera::cuda_kernels).

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>

#include "tessera/core/cuda.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/tensor.hpp"
#include "tessera/kernels/context.hpp"
#include "tessera/kernels/cuda/gemm.cuh"

namespace tessera::kernels {

/// Settings of a cuda_context.
struct cuda_context_options {
  /// cuBLASLt workspace bytes (NVIDIA's recommendation for Hopper: 32 MiB).
  std::size_t cublaslt_workspace = std::size_t(32) << 20;
};

/// The CUDA execution context: device, stream, cuBLASLt, caching allocator.
/// Not copyable or movable (the allocator view and the cuBLASLt plans refer
/// to it); pass it by reference. Every operation is enqueued on stream();
/// only to_host, from_host and synchronize wait for the device.
class cuda_context {
 public:
  using backend_type = tessera::cuda;
  /// Host code cannot dereference this context's memory.
  static constexpr bool host_accessible = false;

  /// A context on the current device over `stream` (not owned; it must
  /// outlive the context), or, when `stream` is null, over a new
  /// non-blocking stream the context owns. Throws cuda_error if the runtime
  /// or cuBLASLt fails, tessera::error if the workspace cannot be allocated.
  explicit cuda_context(cudaStream_t stream = nullptr, cuda_context_options opt = {})
      : device_(tessera::cuda::current_device()) {
    if (stream == nullptr) {
      own_.emplace();
      stream = own_->get();
    }
    stream_ = stream;
    mr_ = std::make_unique<stream_bound_resource>(tessera::cuda::resource(device_), stream_);
    blas_ = std::make_unique<cuda::cublaslt_context>(opt.cublaslt_workspace, *mr_);
  }
  /// Waits for the stream, so no queued kernel still uses memory that goes
  /// back to the allocator (whose cache is keyed by stream).
  ~cuda_context() {
    if (stream_) (void)cudaStreamSynchronize(stream_);
  }
  cuda_context(const cuda_context&) = delete;
  cuda_context& operator=(const cuda_context&) = delete;

  /// The device, fixed at construction (the methods do not call
  /// cudaSetDevice: use the context from a thread whose current device it is).
  int device() const { return device_; }
  /// The stream every operation of this context is enqueued on.
  cudaStream_t stream() const { return stream_; }
  /// The device's caching allocator, allocating on stream() (stream-ordered reuse).
  memory_resource& resource() const { return *mr_; }
  /// The cuBLASLt handle, workspace and plan cache of stream(). Mutable
  /// through a const context (the plan cache fills on first use): like the
  /// context, use it from one thread.
  cuda::cublaslt_context& blas() const { return *blas_; }

  /// Sets `bytes` bytes at device address `p` to zero (enqueued).
  void zero(void* p, std::size_t bytes) const {
    if (bytes) TESSERA_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream_));
  }
  /// Device-to-device copy of `bytes` (enqueued; no overlap).
  void copy(void* dst, const void* src, std::size_t bytes) const {
    if (bytes)
      TESSERA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  }
  /// Device-to-device copy of `rows` rows of `width` bytes, row i from
  /// `src` + i `src_pitch` to `dst` + i `dst_pitch` (enqueued; pitches >=
  /// width; no overlap): one cudaMemcpy2DAsync, or a copy per row when a
  /// pitch exceeds what it takes (2^31 - 1 bytes).
  void copy_2d(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
               std::size_t width, std::size_t rows) const {
    if (!width || !rows) return;
    constexpr std::size_t max_pitch = (std::size_t{1} << 31) - 1;
    if (dst_pitch <= max_pitch && src_pitch <= max_pitch) {
      TESSERA_CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows,
                                           cudaMemcpyDeviceToDevice, stream_));
      return;
    }
    for (std::size_t i = 0; i < rows; ++i)
      TESSERA_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(dst) + i * dst_pitch,
                                         static_cast<const char*>(src) + i * src_pitch, width,
                                         cudaMemcpyDeviceToDevice, stream_));
  }
  /// Device to host, after the work queued so far; returns when the bytes are there.
  void to_host(void* h_dst, const void* src, std::size_t bytes) const {
    tessera::cuda::copy_to_host(h_dst, src, bytes, stream_);
  }
  /// Host to device, ordered on the stream; returns when the copy is done
  /// (the host memory may be pageable and reused at once).
  void from_host(void* dst, const void* h_src, std::size_t bytes) const {
    tessera::cuda::copy_from_host(dst, h_src, bytes, stream_);
  }
  /// Nothing to set: the kernels' parallelism is the device's.
  void apply_threads() const {}
  /// Waits for the work queued on stream(). Throws cuda_error: where an
  /// asynchronous kernel fault surfaces.
  void synchronize() const { TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  /// Device scratch of `bytes` bytes from the caching allocator, on stream()
  /// (freed to the cache when the tensor goes: no cudaMalloc in a steady state).
  tensor<std::uint8_t, tessera::cuda> scratch(std::size_t bytes) const {
    return tensor<std::uint8_t, tessera::cuda>(shape{static_cast<std::int64_t>(bytes)}, *mr_);
  }

 private:
  int device_;
  std::optional<tessera::cuda::stream> own_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<stream_bound_resource> mr_;
  std::unique_ptr<cuda::cublaslt_context> blas_;
};

template <>
struct context_of<tessera::cuda> {
  using type = cuda_context;
};

/// A cuda_context a component builds for itself (kernels/context.hpp): on
/// a new stream of the current device, or on `stream` (not owned).
template <>
struct owned_context<cuda_context> {
  cuda_context ctx;
  owned_context() = default;
  explicit owned_context(cudaStream_t stream) : ctx(stream) {}
  owned_context(const owned_context&) = delete;
  owned_context& operator=(const owned_context&) = delete;
};

static_assert(execution_context<cuda_context>);

}  // namespace tessera::kernels
