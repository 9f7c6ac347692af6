#pragma once
/// \file kernels/cuda/adamw.cuh
/// Multi-tensor AdamW and SGD over a flat buffer on the GPU (declared and
/// documented in kernels/cuda/kernels.hpp): one launch updates every
/// segment, the float32 master weight and the optimizer state, and writes
/// the rounded parameter in the same pass. Per-element arithmetic:
/// kernels::detail::adamw_update and sgd_update, the functions the host
/// kernels::adamw_step and sgd_step (kernels/optimizer.hpp) call. The bodies
/// are written over the primitive interface of kernels/cuda/block.hpp, so
/// the host tests run them under the block emulator
/// (tests/kernels/emulated_optimizer.cpp).
///
/// One thread per element (grid-stride, 64-bit indices; elementwise_config
/// in launch.hpp): each finds its element's segment by binary search in the
/// (small, cached) segment table; elements outside every segment are left
/// alone. Element-wise, no reduction: deterministic, and the same bits as
/// the host for the same step parameters where both round alike (without
/// FMA contraction).

#include <math.h>

#include <cstdint>
#include <type_traits>

#include "tessera/core/error.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/kernels/cuda/block.hpp"
#include "tessera/kernels/detail/adamw.hpp"
#include "tessera/kernels/detail/sgd.hpp"

#if defined(__CUDACC__)
#include "tessera/kernels/cuda/kernels.hpp"
#endif

namespace tessera::kernels::cuda {

namespace detail {

/// What an update needs of element i's segment.
struct segment_of_element {
  std::int64_t param_shift;  ///< the element's parameter is params[i + param_shift]
  std::int64_t grad_shift;   ///< its gradient grads[i + grad_shift]
  bool decay;                ///< weight decay applies
};

/// Finds the segment of `segments` (num_segments, sorted and disjoint) that
/// holds element i: a binary search for the first segment with begin > i,
/// then i must lie before the end of the one before it. False (and `s`
/// untouched) for an element in no segment.
template <class Ops>
TESSERA_BLOCK_FN bool find_segment(const optimizer_segment* segments, int num_segments,
                                   std::int64_t i, segment_of_element& s) {
  int lo = 0, hi = num_segments;  // first segment with begin > i
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (Ops::ld(&segments[mid].begin) <= i)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo == 0 || i >= Ops::ld(&segments[lo - 1].end)) return false;
  const optimizer_segment* seg = segments + (lo - 1);
  s.decay = Ops::ld(&seg->decay) != 0;
  s.grad_shift = Ops::ld(&seg->grad_shift);
  s.param_shift = Ops::ld(&seg->param_shift);
  return true;
}

/// What the optimizer bodies share: applies the device clip coefficient to
/// `scale` (a non-finite one returns before any write: the step is skipped,
/// as the host trainer skips it), then, one thread per element
/// (grid-stride), calls update(i, seg, g) for each element i of [0, n) that
/// lies in a segment, g its gradient as float.
template <class Ops, class Grad, class F>
TESSERA_BLOCK_FN void for_each_segment_element(const block_index& b, const Grad* grads,
                                               std::int64_t n, const optimizer_segment* segments,
                                               int num_segments, const float* grad_scale,
                                               float& scale, F&& update) {
  if (grad_scale) {
    const float c = Ops::ld(grad_scale);
    if (!isfinite(c)) return;
    scale *= c;
  }
  const std::int64_t stride = b.grid_x * b.threads;
  for (std::int64_t i = b.x * b.threads + b.tid; i < n; i += stride) {
    segment_of_element seg;
    if (!find_segment<Ops>(segments, num_segments, i, seg)) continue;
    update(i, seg, to<float>(Ops::ld(grads + i + seg.grad_shift)));
  }
}

/// Runs step(p) on one parameter as float: with `Master`, on the float32
/// master weight master[i], written back and rounded into the parameter;
/// else on the float parameter in place (`master` unused, may be null).
template <class Ops, bool Master, class Param, class F>
TESSERA_BLOCK_FN void update_parameter(Param* param, float* master, std::int64_t i, F&& step) {
  if constexpr (Master) {  // (master is null otherwise: no offset is taken from it)
    float p = Ops::ld(static_cast<const float*>(master + i));
    step(p);
    Ops::st(master + i, p);
    Ops::st(param, to<Param>(p));
  } else {
    float p = to<float>(Ops::ld(static_cast<const Param*>(param)));
    step(p);
    Ops::st(param, to<Param>(p));
  }
}

/// One AdamW step of the elements [0, n) in a segment. Param in {float,
/// bf16}, Grad in {float, bf16}; `Master`: the float32 master weight is
/// updated and the parameter written rounded from it (else the float
/// parameter is updated in place and `master` is unused). A non-finite
/// *grad_scale returns before any write.
template <class Param, class Grad, bool Master>
struct adamw_body {
  static constexpr int threads = elementwise_threads;
  static constexpr std::size_t smem_bound = 0;
  static constexpr const char* name = "adamw";
  template <class Ops>
  using shared_storage = no_shared;

  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index& b, no_shared&, Param* params, float* master,
                                   float* m, float* v, const Grad* grads, std::int64_t n,
                                   const optimizer_segment* segments, int num_segments,
                                   kernels::detail::adamw_step_params<float> s,
                                   const float* grad_scale) {
    for_each_segment_element<Ops>(b, grads, n, segments, num_segments, grad_scale, s.grad_scale,
                                  [&](std::int64_t i, const segment_of_element& seg, float g) {
                                    float mi = Ops::ld(static_cast<const float*>(m + i));
                                    float vi = Ops::ld(static_cast<const float*>(v + i));
                                    update_parameter<Ops, Master>(
                                        params + i + seg.param_shift, master, i, [&](float& p) {
                                          kernels::detail::adamw_update(p, mi, vi, g, s, seg.decay);
                                        });
                                    Ops::st(m + i, mi);
                                    Ops::st(v + i, vi);
                                  });
  }
};

/// One SGD-with-momentum step of the elements [0, n) in a segment, as
/// adamw_body with one state buffer `buf` (the momentum) instead of m and v.
template <class Param, class Grad, bool Master>
struct sgd_body {
  static constexpr int threads = elementwise_threads;
  static constexpr std::size_t smem_bound = 0;
  static constexpr const char* name = "sgd";
  template <class Ops>
  using shared_storage = no_shared;

  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index& b, no_shared&, Param* params, float* master,
                                   float* buf, const Grad* grads, std::int64_t n,
                                   const optimizer_segment* segments, int num_segments,
                                   kernels::detail::sgd_step_params<float> s,
                                   const float* grad_scale) {
    for_each_segment_element<Ops>(b, grads, n, segments, num_segments, grad_scale, s.grad_scale,
                                  [&](std::int64_t i, const segment_of_element& seg, float g) {
                                    float bi = Ops::ld(static_cast<const float*>(buf + i));
                                    update_parameter<Ops, Master>(
                                        params + i + seg.param_shift, master, i, [&](float& p) {
                                          kernels::detail::sgd_update(p, bi, g, s, seg.decay);
                                        });
                                    Ops::st(buf + i, bi);
                                  });
  }
};

/// The argument checks both optimizer launches make (`who` names the
/// entry point): num_segments >= 0, and master weights exactly when the
/// parameters are not float32. Throws config_error.
template <class Param>
inline void check_optimizer_launch(const char* who, int num_segments, const float* d_master) {
  constexpr bool has_master = !std::is_same_v<Param, float>;
  TESSERA_THROW_IF(num_segments < 0, config_error, who, " (cuda): num_segments=", num_segments,
                   " must be >= 0");
  TESSERA_THROW_IF(has_master && d_master == nullptr, config_error, who,
                   " (cuda): ", dtype_name<Param>(),
                   " parameters need float32 master weights (d_master is null)");
  TESSERA_THROW_IF(!has_master && d_master != nullptr, config_error, who,
                   " (cuda): float32 parameters are updated in place; pass d_master = nullptr");
}

}  // namespace detail

/// adamw_step (kernels.hpp) on `launch`: the argument checks, the
/// configuration (one thread per element), then the body; no launch for
/// n = 0 or no segments.
template <class Launcher, class Param, class Grad>
void adamw_step_launch(const Launcher& launch, Param* d_params, float* d_master, float* d_m,
                       float* d_v, const Grad* d_grads, std::int64_t n,
                       const optimizer_segment* d_segments, int num_segments,
                       const kernels::detail::adamw_step_params<float>& step,
                       const float* d_grad_scale) {
  constexpr bool has_master = !std::is_same_v<Param, float>;
  detail::check_optimizer_launch<Param>("adamw_step", num_segments, d_master);
  const launch_config c = elementwise_config(n, 1);
  if (n == 0 || num_segments == 0) return;
  launch.template run<detail::adamw_body<Param, Grad, has_master>>(
      c, d_params, d_master, d_m, d_v, d_grads, n, d_segments, num_segments, step, d_grad_scale);
}

/// sgd_step (kernels.hpp) on `launch`: as adamw_step_launch.
template <class Launcher, class Param, class Grad>
void sgd_step_launch(const Launcher& launch, Param* d_params, float* d_master, float* d_buf,
                     const Grad* d_grads, std::int64_t n, const optimizer_segment* d_segments,
                     int num_segments, const kernels::detail::sgd_step_params<float>& step,
                     const float* d_grad_scale) {
  constexpr bool has_master = !std::is_same_v<Param, float>;
  detail::check_optimizer_launch<Param>("sgd_step", num_segments, d_master);
  const launch_config c = elementwise_config(n, 1);
  if (n == 0 || num_segments == 0) return;
  launch.template run<detail::sgd_body<Param, Grad, has_master>>(
      c, d_params, d_master, d_buf, d_grads, n, d_segments, num_segments, step, d_grad_scale);
}

#if defined(__CUDACC__)

template <class Param, class Grad>
void adamw_step(Param* d_params, float* d_master, float* d_m, float* d_v, const Grad* d_grads,
                std::int64_t n, const optimizer_segment* d_segments, int num_segments,
                const kernels::detail::adamw_step_params<float>& step, const float* d_grad_scale,
                cudaStream_t stream) {
  adamw_step_launch(device_launcher{stream}, d_params, d_master, d_m, d_v, d_grads, n, d_segments,
                    num_segments, step, d_grad_scale);
}

template <class Param, class Grad>
void sgd_step(Param* d_params, float* d_master, float* d_buf, const Grad* d_grads, std::int64_t n,
              const optimizer_segment* d_segments, int num_segments,
              const kernels::detail::sgd_step_params<float>& step, const float* d_grad_scale,
              cudaStream_t stream) {
  sgd_step_launch(device_launcher{stream}, d_params, d_master, d_buf, d_grads, n, d_segments,
                  num_segments, step, d_grad_scale);
}

#endif  // __CUDACC__

}  // namespace tessera::kernels::cuda
