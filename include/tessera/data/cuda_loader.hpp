#pragma once
/// \file data/cuda_loader.hpp
/// The CUDA instantiation of the double-buffered loader (data/device_loader.hpp):
/// its system of pinned host buffers, device buffers, events and a copy
/// stream beside the compute stream. Included by <tessera/cuda.hpp>.

#include <cstddef>

#include "tessera/core/cuda.hpp"
#include "tessera/core/error.hpp"
#include "tessera/data/device_loader.hpp"

namespace tessera::data {

/// The CUDA system of the loader: pinned buffers from
/// cuda::pinned_resource() (cudaHostAlloc, counted), device buffers from the
/// device's caching allocator (counted; allocated on the copy stream and
/// record_stream'ed on the compute stream, so freeing them never lets a
/// later allocation overwrite data a queued kernel still reads), events
/// without timing, and its own non-blocking copy stream.
/// Every CUDA status is checked (cuda_error naming the call).
class cuda_loader_system {
 public:
  using event_type = cudaEvent_t;

  /// `compute` is the stream the model's kernels run on (not owned; any
  /// stream, the legacy default one included), on `device` (default: the
  /// current one), which must be current when the system is built. Creates
  /// the copy stream there.
  explicit cuda_loader_system(cudaStream_t compute, int device = cuda::current_device())
      : compute_(compute), device_(device) {}

  void* allocate_pinned(std::size_t n) { return cuda::pinned_resource().allocate(n, 64); }
  void deallocate_pinned(void* p, std::size_t n) noexcept {
    cuda::pinned_resource().deallocate(p, n);
  }
  void* allocate_device(std::size_t n) {
    auto& mr = cuda::resource(device_);
    void* p = mr.allocate_on(n, copy_.get());
    if (compute_ != copy_.get()) mr.record_stream(p, compute_);
    return p;
  }
  void deallocate_device(void* p, std::size_t n) noexcept {
    cuda::resource(device_).deallocate(p, n);
  }
  cudaEvent_t create_event() {
    cudaEvent_t e = nullptr;
    TESSERA_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }
  void destroy_event(cudaEvent_t& e) noexcept {
    if (e) (void)cudaEventDestroy(e);
    e = nullptr;
  }
  void copy_to_device(void* d_dst, const void* h_src, std::size_t n) {
    TESSERA_CUDA_CHECK(cudaMemcpyAsync(d_dst, h_src, n, cudaMemcpyHostToDevice, copy_.get()));
  }
  void record_on_copy_stream(cudaEvent_t& e) {
    TESSERA_CUDA_CHECK(cudaEventRecord(e, copy_.get()));
  }
  void record_on_compute_stream(cudaEvent_t& e) {
    TESSERA_CUDA_CHECK(cudaEventRecord(e, compute_));
  }
  void copy_stream_wait(cudaEvent_t& e) {
    TESSERA_CUDA_CHECK(cudaStreamWaitEvent(copy_.get(), e, 0));
  }
  void compute_stream_wait(cudaEvent_t& e) {
    TESSERA_CUDA_CHECK(cudaStreamWaitEvent(compute_, e, 0));
  }
  void host_wait(cudaEvent_t& e) { TESSERA_CUDA_CHECK(cudaEventSynchronize(e)); }

  /// The side stream the copies run on (owned).
  cudaStream_t copy_stream() const { return copy_.get(); }
  /// The compute stream (not owned).
  cudaStream_t compute_stream() const { return compute_; }
  /// The device whose memory the buffers are in.
  int device() const { return device_; }

 private:
  cudaStream_t compute_;
  int device_;
  cuda::stream copy_;
};

static_assert(loader_system<cuda_loader_system>);

/// The loader of the cuda backend.
using device_loader = basic_device_loader<cuda_loader_system>;
template <>
struct loader_system_for<cuda> {
  using type = cuda_loader_system;
  template <class Ctx>
  static type make(const Ctx& ctx) {
    return type(ctx.stream(), ctx.device());
  }
};

}  // namespace tessera::data
