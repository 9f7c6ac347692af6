#pragma once
/// \file optim/sgd.hpp
/// SGD with momentum (and Nesterov momentum as an option) as an optimizer
/// policy (optim/optimizer.hpp): `optim::sgd`, and the optimizer it builds,
/// `sgd_optimizer<Param, Grad, Master, Ctx>`, over a flat buffer on any
/// execution context (kernels::sgd_step through the context).
///
/// State: the momentum buffer (and master weights when Param is narrower
/// than Master), allocated when the optimizer is built.
///
/// Source: torch.optim.SGD with dampening 0: g += wd p (an L2 penalty, not
/// decoupled: PyTorch's SGD), buf = mu buf + g, p -= lr buf, or with
/// Nesterov p -= lr (g + mu buf) (Sutskever et al. 2013, "On the importance
/// of initialization and momentum in deep learning", eq. 3-4, in PyTorch's
/// reformulation).

#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/kernels/context.hpp"
#include "tessera/kernels/optimizer.hpp"
#include "tessera/optim/optimizer.hpp"

namespace tessera::optim {

/// SGD hyper-parameters (the learning rate comes from the schedule each step).
struct sgd_config {
  double momentum = 0.9;    ///< mu in [0, 1); 0: plain SGD
  bool nesterov = false;    ///< Nesterov momentum (needs momentum > 0)
  double weight_decay = 0;  ///< L2 penalty added to the gradient (norms and biases excluded)
  /// Throws config_error if a value is out of range.
  void validate() const {
    TESSERA_THROW_IF(!(momentum >= 0 && momentum < 1), config_error, "momentum=", momentum,
                     " must be in [0, 1)");
    TESSERA_THROW_IF(nesterov && !(momentum > 0), config_error,
                     "Nesterov momentum needs momentum > 0 (momentum=", momentum, ")");
    TESSERA_THROW_IF(!(weight_decay >= 0) || !std::isfinite(weight_decay), config_error,
                     "weight_decay=", weight_decay, " must be finite and >= 0");
  }
};

/// SGD with momentum over n elements of `Param` with gradients `Grad` and
/// `Master` state, on context `Ctx` (not owned): fused_optimizer with one
/// moment, the momentum buffer.
template <class Param, class Grad, class Master, class Ctx>
class sgd_optimizer : public fused_optimizer<sgd_optimizer<Param, Grad, Master, Ctx>, sgd_config, 1,
                                             Param, Grad, Master, Ctx> {
  using base = fused_optimizer<sgd_optimizer, sgd_config, 1, Param, Grad, Master, Ctx>;
  friend base;

 public:
  static constexpr const char* name = "sgd";
  /// The momentum buffer's role in a checkpoint (PyTorch's SGD state name).
  static constexpr std::array<const char*, 1> moment_roles = {"momentum_buffer"};
  using base::base;

  /// The momentum buffer (n elements, context memory).
  const Master* momentum_buffer() const { return this->moment(0); }

 private:
  /// The fused kernel (kernels::sgd_step); SGD needs no step count.
  void update(Param* params, const Grad* grads, double lr, double grad_scale, const Master* d_clip,
              std::int64_t /*t*/) {
    const sgd_config& c = this->config();
    const kernels::detail::sgd_step_params<Master> s{
        static_cast<Master>(lr), static_cast<Master>(c.momentum),
        static_cast<Master>(c.weight_decay), static_cast<Master>(grad_scale), c.nesterov};
    sgd_step(this->ctx(), params, this->master_data(), this->moment(0), grads, this->size(),
             this->segments(), this->num_segments(), s, d_clip);
  }
};

/// The SGD policy: `trainer<P, B, optim::sgd, ...>`.
struct sgd {
  static constexpr const char* name = "sgd";
  using config = sgd_config;
  template <class Param, class Grad, class Master, class Ctx>
  using state = sgd_optimizer<Param, Grad, Master, Ctx>;
};

static_assert(check_optimizer_policy<sgd>());

}  // namespace tessera::optim
