#pragma once
/// \file kernels/detail/lion.hpp
/// Per-element Lion arithmetic shared by the host loop and the CUDA kernel
/// (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms",
/// Algorithm 1).

#include "tessera/core/config.hpp"

namespace tessera::kernels::detail {

/// Hyper-parameters of one Lion step.
template <class A>
struct lion_step_params {
  A lr;            ///< learning rate of this step
  A beta1;         ///< interpolation of the update direction: c = beta1 m + (1 - beta1) g
  A beta2;         ///< momentum decay: m = beta2 m + (1 - beta2) g
  A weight_decay;  ///< decoupled decay lambda: w -= lr (sign(c) + lambda w)
  A grad_scale;    ///< gradient multiplier (clip coefficient)
};

/// sign(x) as torch.sign: +1, -1, and x itself for 0 (keeping -0) and NaN
/// (which stays NaN), without a branch the vectoriser cannot take.
template <class A>
TESSERA_HOST_DEVICE inline A lion_sign(A x) {
  return x > A(0) ? A(1) : (x < A(0) ? A(-1) : x);
}

/// One Lion update of a single element, Algorithm 1 of Chen et al. 2023 as
/// written there: g = scale g; c = beta1 m + (1 - beta1) g;
/// w = w - lr (sign(c) + lambda w) (lambda only where `decay`);
/// m = beta2 m + (1 - beta2) g. Updates p and m in place.
template <class A>
TESSERA_HOST_DEVICE inline void lion_update(A& p, A& m, A g, const lion_step_params<A>& s,
                                            bool decay) {
  g *= s.grad_scale;
  const A c = s.beta1 * m + (A(1) - s.beta1) * g;
  const A d = decay ? lion_sign(c) + s.weight_decay * p : lion_sign(c);
  p -= s.lr * d;
  m = s.beta2 * m + (A(1) - s.beta2) * g;
}

}  // namespace tessera::kernels::detail
