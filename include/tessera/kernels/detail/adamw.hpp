#pragma once
/// \file kernels/detail/adamw.hpp
/// Per-element AdamW arithmetic shared by the host loop and the CUDA kernel.

#include <math.h>

#include <cstdint>

#include "tessera/core/config.hpp"

namespace tessera::kernels {

/// A range [begin, end) of an optimizer's elements (offsets from the first
/// element of its state: master weights and moments), whether weight decay
/// applies there, and where the parameters and gradients of those elements
/// are: element i's parameter is params[i + param_shift], its gradient
/// grads[i + grad_shift] (multi-tensor apply over buffers laid out
/// differently: a ZeRO shard's state against the model's flat parameters
/// and a bucket-padded gradient buffer). The segment table every optimizer
/// kernel takes (host and device memory have the same layout; the planner
/// counts 40 bytes a segment).
struct optimizer_segment {
  std::int64_t begin;
  std::int64_t end;
  std::int32_t decay;
  std::int64_t param_shift = 0;
  std::int64_t grad_shift = 0;
};
static_assert(sizeof(optimizer_segment) == 40);

}  // namespace tessera::kernels

namespace tessera::kernels::detail {

/// Hyper-parameters of one AdamW step, with the bias corrections folded in.
/// `grad_scale` multiplies the gradient first (gradient clipping, 1/loss scale).
template <class A>
struct adamw_step_params {
  A lr;                ///< learning rate of this step
  A beta1, beta2;      ///< moment decay rates
  A eps;               ///< added to sqrt(v_hat), as PyTorch does
  A weight_decay;      ///< decoupled decay coefficient (applied as p -= lr * wd * p)
  A bias_correction1;  ///< 1 - beta1^t
  A bias_correction2;  ///< 1 - beta2^t
  A grad_scale;        ///< gradient multiplier (clip coefficient)
};

/// Correctly rounded square root in the accumulation type on host and device
/// (an unqualified sqrt(float) would resolve to ::sqrt(double) in a
/// translation unit that includes <cmath> but not <math.h>).
TESSERA_HOST_DEVICE inline float adamw_sqrt(float x) {
  return sqrtf(x);
}
TESSERA_HOST_DEVICE inline double adamw_sqrt(double x) {
  return sqrt(x);
}

/// One AdamW update of a single element (Loshchilov & Hutter 2019, Algorithm 2,
/// in PyTorch's form): decay first, then the Adam step with
/// eps added to sqrt(v / (1 - beta2^t)). `decay` selects whether weight decay
/// applies to this element. Updates p, m, v in place.
template <class A>
TESSERA_HOST_DEVICE inline void adamw_update(A& p, A& m, A& v, A g, const adamw_step_params<A>& s,
                                             bool decay) {
  g *= s.grad_scale;
  if (decay) p -= s.lr * s.weight_decay * p;
  m = s.beta1 * m + (A(1) - s.beta1) * g;
  v = s.beta2 * v + (A(1) - s.beta2) * g * g;
  A m_hat = m / s.bias_correction1;
  A v_hat = v / s.bias_correction2;
  p -= s.lr * m_hat / (adamw_sqrt(v_hat) + s.eps);
}

}  // namespace tessera::kernels::detail
