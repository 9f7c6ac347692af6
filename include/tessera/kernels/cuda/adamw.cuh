#pragma once
/// \file kernels/cuda/adamw.cuh
/// Multi-tensor AdamW over a flat buffer on the GPU (declared and documented
/// in kernels/cuda/kernels.hpp): one launch updates every segment, the
/// float32 master weight, both moments, and writes the rounded parameter in
/// the same pass. Per-element arithmetic: kernels::detail::adamw_update, the
/// function the host optim::adamw calls.
///
/// Each thread finds its element's segment by binary search in the (small,
/// cached) segment table; elements outside every segment are left alone.

#include "tessera/kernels/cuda/common.cuh"
#include "tessera/kernels/cuda/kernels.hpp"
#include "tessera/kernels/detail/adamw.hpp"
#include "tessera/kernels/detail/sgd.hpp"

namespace tessera::kernels::cuda {

namespace detail {

template <class Param, class Grad, bool Master>
__global__ void __launch_bounds__(elementwise_threads)
    adamw_kernel(Param* params, float* master, float* m, float* v, const Grad* grads,
                 std::int64_t n, const optimizer_segment* segments, int num_segments,
                 kernels::detail::adamw_step_params<float> s, const float* grad_scale) {
  if (grad_scale) {
    // A non-finite clip coefficient (the gradient norm overflowed): the
    // step is skipped, as the host trainer skips it, and nothing is written.
    const float c = *grad_scale;
    if (!isfinite(c)) return;
    s.grad_scale *= c;
  }
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    int lo = 0, hi = num_segments;  // first segment with begin > i
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (segments[mid].begin <= i)
        lo = mid + 1;
      else
        hi = mid;
    }
    if (lo == 0 || i >= segments[lo - 1].end) continue;
    const optimizer_segment& seg = segments[lo - 1];
    const bool decay = seg.decay != 0;
    const float g = to<float>(grads[i + seg.grad_shift]);
    float mi = m[i], vi = v[i];
    if constexpr (Master) {
      float p = master[i];
      kernels::detail::adamw_update(p, mi, vi, g, s, decay);
      master[i] = p;
      params[i + seg.param_shift] = to<Param>(p);
    } else {
      float p = to<float>(params[i + seg.param_shift]);
      kernels::detail::adamw_update(p, mi, vi, g, s, decay);
      params[i + seg.param_shift] = to<Param>(p);
    }
    m[i] = mi;
    v[i] = vi;
  }
}

template <class Param, class Grad, bool Master>
__global__ void __launch_bounds__(elementwise_threads)
    sgd_kernel(Param* params, float* master, float* buf, const Grad* grads, std::int64_t n,
               const optimizer_segment* segments, int num_segments,
               kernels::detail::sgd_step_params<float> s, const float* grad_scale) {
  if (grad_scale) {
    const float c = *grad_scale;
    if (!isfinite(c)) return;  // skipped step: nothing written
    s.grad_scale *= c;
  }
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    int lo = 0, hi = num_segments;  // first segment with begin > i
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (segments[mid].begin <= i)
        lo = mid + 1;
      else
        hi = mid;
    }
    if (lo == 0 || i >= segments[lo - 1].end) continue;
    const optimizer_segment& seg = segments[lo - 1];
    const bool decay = seg.decay != 0;
    const float g = to<float>(grads[i + seg.grad_shift]);
    float bi = buf[i];
    if constexpr (Master) {
      float p = master[i];
      kernels::detail::sgd_update(p, bi, g, s, decay);
      master[i] = p;
      params[i + seg.param_shift] = to<Param>(p);
    } else {
      float p = to<float>(params[i + seg.param_shift]);
      kernels::detail::sgd_update(p, bi, g, s, decay);
      params[i + seg.param_shift] = to<Param>(p);
    }
    buf[i] = bi;
  }
}

}  // namespace detail

template <class Param, class Grad>
void adamw_step(Param* d_params, float* d_master, float* d_m, float* d_v, const Grad* d_grads,
                std::int64_t n, const optimizer_segment* d_segments, int num_segments,
                const kernels::detail::adamw_step_params<float>& step, const float* d_grad_scale,
                cudaStream_t stream) {
  constexpr bool has_master = !std::is_same_v<Param, float>;
  TESSERA_THROW_IF(num_segments < 0, config_error, "adamw_step (cuda): num_segments=", num_segments,
                   " must be >= 0");
  TESSERA_THROW_IF(has_master && d_master == nullptr, config_error,
                   "adamw_step (cuda): ", dtype_name<Param>(),
                   " parameters need float32 master weights (d_master is null)");
  TESSERA_THROW_IF(!has_master && d_master != nullptr, config_error,
                   "adamw_step (cuda): float32 parameters are updated in place; pass "
                   "d_master = nullptr");
  const launch_config c = elementwise_config(n, 1);
  if (n == 0 || num_segments == 0) return;
  detail::adamw_kernel<Param, Grad, has_master><<<detail::grid_of(c), c.block, 0, stream>>>(
      d_params, d_master, d_m, d_v, d_grads, n, d_segments, num_segments, step, d_grad_scale);
  TESSERA_CUDA_CHECK_LAUNCH("adamw_kernel");
}

template <class Param, class Grad>
void sgd_step(Param* d_params, float* d_master, float* d_buf, const Grad* d_grads, std::int64_t n,
              const optimizer_segment* d_segments, int num_segments,
              const kernels::detail::sgd_step_params<float>& step, const float* d_grad_scale,
              cudaStream_t stream) {
  constexpr bool has_master = !std::is_same_v<Param, float>;
  TESSERA_THROW_IF(num_segments < 0, config_error, "sgd_step (cuda): num_segments=", num_segments,
                   " must be >= 0");
  TESSERA_THROW_IF(has_master && d_master == nullptr, config_error,
                   "sgd_step (cuda): ", dtype_name<Param>(),
                   " parameters need float32 master weights (d_master is null)");
  TESSERA_THROW_IF(!has_master && d_master != nullptr, config_error,
                   "sgd_step (cuda): float32 parameters are updated in place; pass d_master = "
                   "nullptr");
  const launch_config c = elementwise_config(n, 1);
  if (n == 0 || num_segments == 0) return;
  detail::sgd_kernel<Param, Grad, has_master><<<detail::grid_of(c), c.block, 0, stream>>>(
      d_params, d_master, d_buf, d_grads, n, d_segments, num_segments, step, d_grad_scale);
  TESSERA_CUDA_CHECK_LAUNCH("sgd_kernel");
}

}  // namespace tessera::kernels::cuda
