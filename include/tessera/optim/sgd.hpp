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

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/core/tensor.hpp"
#include "tessera/kernels/context.hpp"
#include "tessera/kernels/elementwise.hpp"
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
/// `Master` state, on context `Ctx` (not owned): flat_optimizer with one
/// moment, the momentum buffer.
template <class Param, class Grad, class Master, class Ctx>
class sgd_optimizer : public flat_optimizer<Param, Master, Ctx> {
  using base = flat_optimizer<Param, Master, Ctx>;

 public:
  static constexpr const char* name = "sgd";
  using base::has_master;
  /// Bytes of optimizer state per parameter (the momentum, plus master weights if kept).
  static constexpr std::size_t state_bytes_per_param = (has_master ? 2 : 1) * sizeof(Master);

  /// As adamw_optimizer's constructor: n elements, decay and layout by
  /// `ranges`, state allocated now (momentum zero). Throws config_error for
  /// bad hyper-parameters or n < 0.
  sgd_optimizer(sgd_config cfg, std::int64_t n, const std::vector<owned_range>& ranges,
                const Ctx& ctx)
      : base(n, ranges, (cfg.validate(), cfg.weight_decay != 0.0), ctx, 1), cfg_(cfg) {}
  sgd_optimizer(sgd_config cfg, std::int64_t n, const std::vector<param_range>& ranges,
                const Ctx& ctx)
      : sgd_optimizer(cfg, n, owned(ranges), ctx) {}
  /// A temporary context would dangle: the optimizer keeps a pointer to it.
  sgd_optimizer(sgd_config, std::int64_t, const std::vector<param_range>&, const Ctx&&) = delete;
  sgd_optimizer(sgd_config, std::int64_t, const std::vector<owned_range>&, const Ctx&&) = delete;

  /// One step, the gradients scaled by `*d_clip` (context memory; a
  /// non-finite value writes nothing: call skipped()).
  void step(Param* params, const Grad* grads, double lr, const Master* d_clip) {
    launch(params, grads, lr, 1.0, d_clip);
  }
  /// One step with the gradient multiplier given on the host; a non-finite
  /// one skips the step (nothing written, not counted).
  void step(Param* params, const Grad* grads, double lr, double grad_scale = 1.0) {
    launch(params, grads, lr, grad_scale, nullptr);
  }

  const sgd_config& config() const { return cfg_; }
  /// The momentum buffer (n elements, context memory).
  const Master* momentum_buffer() const { return this->moment(0); }

 private:
  void launch(Param* params, const Grad* grads, double lr, double grad_scale,
              const Master* d_clip) {
    if (d_clip == nullptr && !std::isfinite(grad_scale))
      return;  // skipped: nothing written, not counted
    (void)this->begin_step("sgd");
    const kernels::detail::sgd_step_params<Master> s{
        static_cast<Master>(lr), static_cast<Master>(cfg_.momentum),
        static_cast<Master>(cfg_.weight_decay), static_cast<Master>(grad_scale), cfg_.nesterov};
    sgd_step(this->ctx(), params, this->master_data(), this->moment(0), grads, this->size(),
             this->segments(), this->num_segments(), s, d_clip);
  }

  sgd_config cfg_;
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
