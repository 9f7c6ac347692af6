#pragma once
/// \file optim/lion.hpp
/// Lion as an optimizer policy (optim/optimizer.hpp): `optim::lion`, and
/// the optimizer it builds, `lion_optimizer<Param, Grad, Master, Ctx>`,
/// over a flat buffer on any execution context (kernels::lion_step through
/// the context).
///
/// State: one momentum buffer ("exp_avg", as lion-pytorch names it; 4
/// bytes per parameter in float32) and master weights when Param is
/// narrower than Master: half of AdamW's moments. Allocated when the
/// optimizer is built.
///
/// Source: Chen et al. 2023, "Symbolic Discovery of Optimization
/// Algorithms", Algorithm 1: c = beta1 m + (1 - beta1) g;
/// w = w - lr (sign(c) + lambda w); m = beta2 m + (1 - beta2) g, with
/// sign(0) = 0 (torch.sign). Every element moves by exactly lr (plus the
/// decay) per step, so Lion wants a learning rate 3-10x below AdamW's and
/// a weight decay 3-10x above it (the paper's section 5).

#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/kernels/context.hpp"
#include "tessera/kernels/optimizer.hpp"
#include "tessera/optim/optimizer.hpp"

namespace tessera::optim {

/// Lion hyper-parameters (the learning rate comes from the schedule each step).
struct lion_config {
  double beta1 = 0.9;         ///< the update's interpolation between momentum and gradient
  double beta2 = 0.99;        ///< the momentum's decay
  double weight_decay = 0.0;  ///< decoupled: w -= lr lambda w (norms and biases excluded)
  /// Throws config_error if a value is out of range.
  void validate() const {
    TESSERA_THROW_IF(!(beta1 >= 0 && beta1 <= 1), config_error, "beta1=", beta1,
                     " must be in [0, 1]");
    TESSERA_THROW_IF(!(beta2 >= 0 && beta2 < 1), config_error, "beta2=", beta2,
                     " must be in [0, 1)");
    TESSERA_THROW_IF(!(weight_decay >= 0) || !std::isfinite(weight_decay), config_error,
                     "weight_decay=", weight_decay, " must be finite and >= 0");
  }
};

/// Lion over n elements of `Param` with gradients `Grad` and `Master`
/// state, on context `Ctx` (not owned): fused_optimizer with one moment,
/// the momentum buffer.
template <class Param, class Grad, class Master, class Ctx>
class lion_optimizer : public fused_optimizer<lion_optimizer<Param, Grad, Master, Ctx>, lion_config,
                                              1, Param, Grad, Master, Ctx> {
  using base = fused_optimizer<lion_optimizer, lion_config, 1, Param, Grad, Master, Ctx>;
  friend base;

 public:
  static constexpr const char* name = "lion";
  /// The momentum's role in a checkpoint (lion-pytorch's state name).
  static constexpr std::array<const char*, 1> moment_roles = {"exp_avg"};
  using base::base;

  /// The momentum buffer (n elements, the context's memory).
  const Master* exp_avg() const { return this->moment(0); }

 private:
  /// The fused kernel (kernels::lion_step); Lion needs no step count.
  void update(Param* params, const Grad* grads, double lr, double grad_scale, const Master* d_clip,
              std::int64_t /*t*/) {
    const lion_config& c = this->config();
    const kernels::detail::lion_step_params<Master> s{
        static_cast<Master>(lr), static_cast<Master>(c.beta1), static_cast<Master>(c.beta2),
        static_cast<Master>(c.weight_decay), static_cast<Master>(grad_scale)};
    lion_step(this->ctx(), params, this->master_data(), this->moment(0), grads, this->size(),
              this->segments(), this->num_segments(), s, d_clip);
  }
};

/// The Lion policy: `trainer<P, B, optim::lion, ...>`.
struct lion {
  static constexpr const char* name = "lion";
  using config = lion_config;
  template <class Param, class Grad, class Master, class Ctx>
  using state = lion_optimizer<Param, Grad, Master, Ctx>;
};

static_assert(check_optimizer_policy<lion>());

}  // namespace tessera::optim
