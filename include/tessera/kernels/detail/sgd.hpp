#pragma once
/// \file kernels/detail/sgd.hpp
/// Per-element SGD-with-momentum arithmetic shared by the host loop and the
/// CUDA kernel (torch.optim.SGD's form, dampening 0).

#include "tessera/core/config.hpp"

namespace tessera::kernels::detail {

/// Hyper-parameters of one SGD step.
template <class A>
struct sgd_step_params {
  A lr;            ///< learning rate of this step
  A momentum;      ///< momentum factor mu (0: plain SGD, the buffer is then the gradient)
  A weight_decay;  ///< L2 penalty, added to the gradient: g += wd * p (PyTorch's SGD)
  A grad_scale;    ///< gradient multiplier (clip coefficient)
  bool nesterov;   ///< Nesterov momentum: the step uses g + mu * buf instead of buf
};

/// One SGD update of a single element, as torch.optim.SGD with dampening 0
/// (Sutskever et al. 2013 for Nesterov's form): g = scale g (+ wd p);
/// buf = mu buf + g; p -= lr (nesterov ? g + mu buf : buf). The first step
/// with buf = 0 gives buf = g, PyTorch's initialisation. `decay` selects
/// whether weight decay applies to this element. Updates p and buf.
template <class A>
TESSERA_HOST_DEVICE inline void sgd_update(A& p, A& buf, A g, const sgd_step_params<A>& s,
                                           bool decay) {
  g *= s.grad_scale;
  if (decay) g += s.weight_decay * p;
  buf = s.momentum * buf + g;
  const A d = s.nesterov ? g + s.momentum * buf : buf;
  p -= s.lr * d;
}

}  // namespace tessera::kernels::detail
