#pragma once
/// \file optim/adamw.hpp
/// AdamW as an optimizer policy (optim/optimizer.hpp): `optim::adamw`, and
/// the optimizer it builds, `adamw_optimizer<Param, Grad, Master, Ctx>`,
/// over a flat buffer on any execution context (one implementation for the
/// host and the GPU: the step is kernels::adamw_step through the context).
///
/// State (master weights when Param is narrower than Master, first and
/// second moments, the segment table) is allocated when the optimizer is
/// built, not lazily on the first step, so the memory floor is visible
/// before step 0. The optimizer owns n elements from the start of the
/// buffer it is given: the whole flat buffer on one rank, a shard under ZeRO.
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
    TESSERA_THROW_IF(!(beta1 >= 0 && beta1 < 1), config_error, "beta1=", beta1, " must be in [0, 1)");
    TESSERA_THROW_IF(!(beta2 >= 0 && beta2 < 1), config_error, "beta2=", beta2, " must be in [0, 1)");
    TESSERA_THROW_IF(!(eps > 0), config_error, "eps=", eps, " must be > 0");
    TESSERA_THROW_IF(!(weight_decay >= 0), config_error, "weight_decay=", weight_decay,
                     " must be >= 0");
  }
};

/// AdamW over n elements of a flat buffer of `Param` with gradients `Grad`
/// and `Master` state, on context `Ctx`. When Param == Master the
/// parameters are updated in place and no master copy is kept. The context
/// is not owned and must outlive the optimizer.
template <class Param, class Grad, class Master, class Ctx>
class adamw_optimizer {
 public:
  using Backend = typename Ctx::backend_type;
  static constexpr const char* name = "adamw";
  static constexpr bool has_master = !std::is_same_v<Param, Master>;
  /// Bytes of optimizer state per parameter (moments, plus master weights if kept).
  static constexpr std::size_t state_bytes_per_param = (has_master ? 3 : 2) * sizeof(Master);

  /// Builds the optimizer for elements [0, n) of a flat buffer, `ranges`
  /// (offsets in that buffer) giving the decay flag of each element;
  /// ranges beyond n are clipped. Allocates all state from the context now
  /// (moments zero). Throws config_error for bad hyper-parameters or n < 0.
  adamw_optimizer(adamw_config cfg, std::int64_t n, const std::vector<param_range>& ranges,
                  const Ctx& ctx)
      : cfg_(cfg), n_(n), ctx_(&ctx) {
    cfg_.validate();
    TESSERA_THROW_IF(n < 0, config_error, "optimizer size n=", n, " must be >= 0");
    m_ = kernels::make_tensor<Master>(ctx, n);
    v_ = kernels::make_tensor<Master>(ctx, n);
    kernels::zero_elements(ctx, m_.data(), n);
    kernels::zero_elements(ctx, v_.data(), n);
    if constexpr (has_master) {
      master_ = kernels::make_tensor<Master>(ctx, n);
      kernels::zero_elements(ctx, master_.data(), n);
    }
    segments_ = detail::segment_table(ctx, ranges, n, cfg_.weight_decay != 0.0);
  }
  /// A temporary context would dangle: the optimizer keeps a pointer to it.
  adamw_optimizer(adamw_config, std::int64_t, const std::vector<param_range>&, const Ctx&&) = delete;
  adamw_optimizer(const adamw_optimizer&) = delete;
  adamw_optimizer& operator=(const adamw_optimizer&) = delete;

  /// Copies the parameters (n elements, the context's memory) into the
  /// master weights (call once after the model is initialised).
  void init_master(const Param* params) {
    if constexpr (has_master) cast(*ctx_, master_.data(), params, n_);
    master_ready_ = true;
  }

  /// One step: the gradients are scaled by `*d_clip` (the clip
  /// coefficient, one Master in the context's memory; a non-finite value
  /// writes nothing: call skipped() once the caller knows), the parameters
  /// updated in place, and with a master copy params[i] = round(master[i]).
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
  /// Takes back the step count of a step the kernel skipped (non-finite clip
  /// coefficient), so the bias corrections stay those of the steps taken.
  void skipped() {
    TESSERA_THROW_IF(t_ == 0, error, "adamw: skipped() without a step");
    --t_;
  }

  std::int64_t steps_taken() const { return t_; }
  std::int64_t size() const { return n_; }
  const adamw_config& config() const { return cfg_; }
  /// Bytes of state held (master weights, moments, the segment table).
  std::size_t state_bytes() const {
    return m_.bytes() + v_.bytes() + master_.bytes() + segments_.bytes();
  }
  /// The state, n elements each, in the context's memory (master: null without a copy).
  const Master* exp_avg() const { return m_.data(); }
  const Master* exp_avg_sq() const { return v_.data(); }
  const Master* master() const { return has_master ? master_.data() : nullptr; }

  /// Writes the step count and every state buffer (raw little-endian bytes:
  /// t, m, v, then master when kept; serialized_bytes() in all) through
  /// `w.write(const void*, bytes)`, staged through host memory.
  template <class Writer>
  void save(Writer& w) const {
    w.write(&t_, sizeof(t_));
    detail::write_from(*ctx_, w, m_.data(), m_.bytes());
    detail::write_from(*ctx_, w, v_.data(), v_.bytes());
    if constexpr (has_master) detail::write_from(*ctx_, w, master_.data(), master_.bytes());
  }
  /// Restores what save() wrote from host memory `p`, which holds
  /// serialized_bytes() bytes (the caller checks the size before calling).
  void load(const char* p) {
    std::memcpy(&t_, p, sizeof(t_));
    p += sizeof(t_);
    ctx_->from_host(m_.data(), p, m_.bytes());
    p += m_.bytes();
    ctx_->from_host(v_.data(), p, v_.bytes());
    p += v_.bytes();
    if constexpr (has_master) ctx_->from_host(master_.data(), p, master_.bytes());
    master_ready_ = true;
  }
  /// Bytes save() writes.
  std::size_t serialized_bytes() const {
    return sizeof(t_) + m_.bytes() + v_.bytes() + master_.bytes();
  }

 private:
  void launch(Param* params, const Grad* grads, double lr, double grad_scale,
              const Master* d_clip) {
    if (d_clip == nullptr && !std::isfinite(grad_scale)) return;  // skipped: nothing written, not counted
    TESSERA_THROW_IF(has_master && !master_ready_, error,
                     "adamw: master weights not initialised; call init_master(params) first");
    ++t_;
    const kernels::detail::adamw_step_params<Master> s{
        static_cast<Master>(lr),
        static_cast<Master>(cfg_.beta1),
        static_cast<Master>(cfg_.beta2),
        static_cast<Master>(cfg_.eps),
        static_cast<Master>(cfg_.weight_decay),
        static_cast<Master>(1.0 - std::pow(cfg_.beta1, static_cast<double>(t_))),
        static_cast<Master>(1.0 - std::pow(cfg_.beta2, static_cast<double>(t_))),
        static_cast<Master>(grad_scale)};
    Master* master = nullptr;
    if constexpr (has_master) master = master_.data();
    adamw_step(*ctx_, params, master, m_.data(), v_.data(), grads, n_, segments_.data(),
               static_cast<int>(segments_.numel()), s, d_clip);
  }

  adamw_config cfg_;
  std::int64_t n_;
  const Ctx* ctx_;
  tensor<Master, Backend> m_, v_, master_;
  tensor<kernels::optimizer_segment, Backend> segments_;
  std::int64_t t_ = 0;
  bool master_ready_ = !has_master;
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
