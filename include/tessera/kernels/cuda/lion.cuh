#pragma once
/// \file kernels/cuda/lion.cuh
/// Multi-tensor Lion over a flat buffer on the GPU (declared and documented
/// in kernels/cuda/kernels.hpp): one launch updates every segment, the
/// float32 master weight and the momentum, and writes the rounded parameter
/// in the same pass. Per-element arithmetic: kernels::detail::lion_update,
/// the function the host kernels::lion_step (kernels/optimizer.hpp) calls.
/// The body is written over the primitive interface of
/// kernels/cuda/block.hpp and shares AdamW's segment lookup
/// (kernels/cuda/adamw.cuh), so the host tests run it under the block
/// emulator (tests/kernels/emulated_optimizer.cpp). Element-wise, no
/// reduction: deterministic, and the host's bits where both round alike.

#include <cstdint>
#include <type_traits>

#include "tessera/kernels/cuda/adamw.cuh"
#include "tessera/kernels/detail/lion.hpp"

namespace tessera::kernels::cuda {

namespace detail {

/// One Lion step of the elements [0, n) in a segment, as sgd_body with the
/// momentum `m` ("exp_avg") as its one state buffer.
template <class Param, class Grad, bool Master>
struct lion_body {
  static constexpr int threads = elementwise_threads;
  static constexpr std::size_t smem_bound = 0;
  static constexpr const char* name = "lion";
  template <class Ops>
  using shared_storage = no_shared;

  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index& b, no_shared&, Param* params, float* master,
                                   float* m, const Grad* grads, std::int64_t n,
                                   const optimizer_segment* segments, int num_segments,
                                   kernels::detail::lion_step_params<float> s,
                                   const float* grad_scale) {
    for_each_segment_element<Ops>(b, grads, n, segments, num_segments, grad_scale, s.grad_scale,
                                  [&](std::int64_t i, const segment_of_element& seg, float g) {
                                    float mi = Ops::ld(static_cast<const float*>(m + i));
                                    update_parameter<Ops, Master>(
                                        params + i + seg.param_shift, master, i, [&](float& p) {
                                          kernels::detail::lion_update(p, mi, g, s, seg.decay);
                                        });
                                    Ops::st(m + i, mi);
                                  });
  }
};

}  // namespace detail

/// lion_step (kernels.hpp) on `launch`: as adamw_step_launch.
template <class Launcher, class Param, class Grad>
void lion_step_launch(const Launcher& launch, Param* d_params, float* d_master, float* d_m,
                      const Grad* d_grads, std::int64_t n, const optimizer_segment* d_segments,
                      int num_segments, const kernels::detail::lion_step_params<float>& step,
                      const float* d_grad_scale) {
  constexpr bool has_master = !std::is_same_v<Param, float>;
  detail::check_optimizer_launch<Param>("lion_step", num_segments, d_master);
  const launch_config c = elementwise_config(n, 1);
  if (n == 0 || num_segments == 0) return;
  launch.template run<detail::lion_body<Param, Grad, has_master>>(
      c, d_params, d_master, d_m, d_grads, n, d_segments, num_segments, step, d_grad_scale);
}

#if defined(__CUDACC__)

template <class Param, class Grad>
void lion_step(Param* d_params, float* d_master, float* d_m, const Grad* d_grads, std::int64_t n,
               const optimizer_segment* d_segments, int num_segments,
               const kernels::detail::lion_step_params<float>& step, const float* d_grad_scale,
               cudaStream_t stream) {
  lion_step_launch(device_launcher{stream}, d_params, d_master, d_m, d_grads, n, d_segments,
                   num_segments, step, d_grad_scale);
}

#endif  // __CUDACC__

}  // namespace tessera::kernels::cuda
