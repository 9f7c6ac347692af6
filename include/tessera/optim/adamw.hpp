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
/// state, on context `Ctx` (flat_optimizer: two moments, master weights
/// when Param is narrower than Master). When Param == Master the parameters
/// are updated in place and no master copy is kept. The context is not
/// owned and must outlive the optimizer.
template <class Param, class Grad, class Master, class Ctx>
class adamw_optimizer : public flat_optimizer<Param, Master, Ctx> {
  using base = flat_optimizer<Param, Master, Ctx>;

 public:
  static constexpr const char* name = "adamw";
  using base::has_master;
  /// Bytes of optimizer state per parameter (moments, plus master weights if kept).
  static constexpr std::size_t state_bytes_per_param = (has_master ? 3 : 2) * sizeof(Master);

  /// Builds the optimizer for elements [0, n), `ranges` giving each
  /// element's decay flag and where its parameter and gradient are
  /// (owned_range; ranges beyond n are clipped). Allocates all state from
  /// the context now (moments zero). Throws config_error for bad
  /// hyper-parameters or n < 0.
  adamw_optimizer(adamw_config cfg, std::int64_t n, const std::vector<owned_range>& ranges,
                  const Ctx& ctx)
      : base(n, ranges, (cfg.validate(), cfg.weight_decay != 0.0), ctx, 2), cfg_(cfg) {}
  /// The same over a flat buffer laid out as the state (shifts 0).
  adamw_optimizer(adamw_config cfg, std::int64_t n, const std::vector<param_range>& ranges,
                  const Ctx& ctx)
      : adamw_optimizer(cfg, n, owned(ranges), ctx) {}
  /// A temporary context would dangle: the optimizer keeps a pointer to it.
  adamw_optimizer(adamw_config, std::int64_t, const std::vector<param_range>&,
                  const Ctx&&) = delete;
  adamw_optimizer(adamw_config, std::int64_t, const std::vector<owned_range>&,
                  const Ctx&&) = delete;

  /// One step: the gradients are scaled by `*d_clip` (the clip
  /// coefficient, one Master in the context's memory; a non-finite value
  /// writes nothing: call skipped() once the caller knows), the parameters
  /// updated in place, and with a master copy params = round(master).
  /// Throws tessera::error if the master weights were never initialised
  /// (init_master or load), which would write zeros into the parameters.
  void step(Param* params, const Grad* grads, double lr, const Master* d_clip) {
    launch(params, grads, lr, 1.0, d_clip);
  }
  /// One step with the gradient multiplier `grad_scale` given on the host; a
  /// non-finite one skips the step (nothing written, not counted).
  void step(Param* params, const Grad* grads, double lr, double grad_scale = 1.0) {
    launch(params, grads, lr, grad_scale, nullptr);
  }

  const adamw_config& config() const { return cfg_; }
  /// The moments, n elements each, in the context's memory.
  const Master* exp_avg() const { return this->moment(0); }
  const Master* exp_avg_sq() const { return this->moment(1); }

 private:
  void launch(Param* params, const Grad* grads, double lr, double grad_scale,
              const Master* d_clip) {
    if (d_clip == nullptr && !std::isfinite(grad_scale))
      return;  // skipped: nothing written, not counted
    const std::int64_t t = this->begin_step("adamw");
    const kernels::detail::adamw_step_params<Master> s{
        static_cast<Master>(lr),
        static_cast<Master>(cfg_.beta1),
        static_cast<Master>(cfg_.beta2),
        static_cast<Master>(cfg_.eps),
        static_cast<Master>(cfg_.weight_decay),
        static_cast<Master>(1.0 - std::pow(cfg_.beta1, static_cast<double>(t))),
        static_cast<Master>(1.0 - std::pow(cfg_.beta2, static_cast<double>(t))),
        static_cast<Master>(grad_scale)};
    adamw_step(this->ctx(), params, this->master_data(), this->moment(0), this->moment(1), grads,
               this->size(), this->segments(), this->num_segments(), s, d_clip);
  }

  adamw_config cfg_;
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
