#pragma once
/// \file optim/adamw.hpp
/// AdamW as an optimizer policy (optim/optimizer.hpp): `optim::adamw`, and
/// the optimizer it builds, `adamw_optimizer<Param, Grad, Master, Ctx>`,
/// over a flat buffer on any execution context (one implementation for the
/// host and the GPU: the step is kernels::adamw_step through the context).
///
/// State (master weights when Param is narrower than Master, first and
/// second moments, the segment table: flat_optimizer's) is allocated when
/// the optimizer is built, not lazily on the first step, so the memory floor
/// is visible before step 0. The optimizer owns n elements: the whole flat
/// buffer on one rank, a shard under ZeRO.
///
/// Source: Loshchilov & Hutter, "Decoupled Weight Decay Regularization"
/// (ICLR 2019), Algorithm 2, in the form of torch.optim.AdamW: p -= lr*wd*p;
/// m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; p -= lr * (m/(1-b1^t)) /
/// (sqrt(v/(1-b2^t)) + eps).

#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/kernels/context.hpp"
#include "tessera/kernels/optimizer.hpp"
#include "tessera/optim/optimizer.hpp"

namespace tessera::optim {

/// AdamW hyper-parameters (the learning rate comes from the schedule each step).
struct adamw_config {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  /// Throws config_error if a value is out of range.
  void validate() const {
    TESSERA_THROW_IF(!(beta1 >= 0 && beta1 < 1), config_error, "beta1=", beta1,
                     " must be in [0, 1)");
    TESSERA_THROW_IF(!(beta2 >= 0 && beta2 < 1), config_error, "beta2=", beta2,
                     " must be in [0, 1)");
    TESSERA_THROW_IF(!(eps > 0), config_error, "eps=", eps, " must be > 0");
    TESSERA_THROW_IF(!(weight_decay >= 0), config_error, "weight_decay=", weight_decay,
                     " must be >= 0");
  }
};

/// AdamW over n elements of `Param` with gradients `Grad` and `Master`
/// state, on context `Ctx` (fused_optimizer: two moments, master weights
/// when Param is narrower than Master). When Param == Master the parameters
/// are updated in place and no master copy is kept. The context is not
/// owned and must outlive the optimizer.
template <class Param, class Grad, class Master, class Ctx>
class adamw_optimizer : public fused_optimizer<adamw_optimizer<Param, Grad, Master, Ctx>,
                                               adamw_config, 2, Param, Grad, Master, Ctx> {
  using base = fused_optimizer<adamw_optimizer, adamw_config, 2, Param, Grad, Master, Ctx>;
  friend base;

 public:
  static constexpr const char* name = "adamw";
  /// The moments' roles in a checkpoint (PyTorch's AdamW state names).
  static constexpr std::array<const char*, 2> moment_roles = {"exp_avg", "exp_avg_sq"};
  using base::base;

  /// The moments, n elements each, in the context's memory.
  const Master* exp_avg() const { return this->moment(0); }
  const Master* exp_avg_sq() const { return this->moment(1); }

 private:
  /// Step t's fused kernel (kernels::adamw_step): bias corrections of t.
  void update(Param* params, const Grad* grads, double lr, double grad_scale, const Master* d_clip,
              std::int64_t t) {
    const adamw_config& c = this->config();
    const kernels::detail::adamw_step_params<Master> s{
        static_cast<Master>(lr),
        static_cast<Master>(c.beta1),
        static_cast<Master>(c.beta2),
        static_cast<Master>(c.eps),
        static_cast<Master>(c.weight_decay),
        static_cast<Master>(1.0 - std::pow(c.beta1, static_cast<double>(t))),
        static_cast<Master>(1.0 - std::pow(c.beta2, static_cast<double>(t))),
        static_cast<Master>(grad_scale)};
    adamw_step(this->ctx(), params, this->master_data(), this->moment(0), this->moment(1), grads,
               this->size(), this->segments(), this->num_segments(), s, d_clip);
  }
};

/// The AdamW policy: `trainer<P, B, optim::adamw, ...>`.
struct adamw {
  static constexpr const char* name = "adamw";
  using config = adamw_config;
  template <class Param, class Grad, class Master, class Ctx>
  using state = adamw_optimizer<Param, Grad, Master, Ctx>;
};

static_assert(check_optimizer_policy<adamw>());

}  // namespace tessera::optim
