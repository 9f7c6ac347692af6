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
  double momentum = 0.9;     ///< mu in [0, 1); 0: plain SGD
  bool nesterov = false;     ///< Nesterov momentum (needs momentum > 0)
  double weight_decay = 0;   ///< L2 penalty added to the gradient (norms and biases excluded)
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

/// SGD with momentum over n elements of a flat buffer of `Param` with
/// gradients `Grad` and `Master` state, on context `Ctx` (not owned).
template <class Param, class Grad, class Master, class Ctx>
class sgd_optimizer {
 public:
  using Backend = typename Ctx::backend_type;
  static constexpr const char* name = "sgd";
  static constexpr bool has_master = !std::is_same_v<Param, Master>;
  /// Bytes of optimizer state per parameter (the momentum, plus master weights if kept).
  static constexpr std::size_t state_bytes_per_param = (has_master ? 2 : 1) * sizeof(Master);

  /// As adamw_optimizer's constructor: n elements, decay by `ranges`,
  /// state allocated now (momentum zero). Throws config_error for bad
  /// hyper-parameters or n < 0.
  sgd_optimizer(sgd_config cfg, std::int64_t n, const std::vector<param_range>& ranges,
                const Ctx& ctx)
      : cfg_(cfg), n_(n), ctx_(&ctx) {
    cfg_.validate();
    TESSERA_THROW_IF(n < 0, config_error, "optimizer size n=", n, " must be >= 0");
    buf_ = kernels::make_tensor<Master>(ctx, n);
    kernels::zero_elements(ctx, buf_.data(), n);
    if constexpr (has_master) {
      master_ = kernels::make_tensor<Master>(ctx, n);
      kernels::zero_elements(ctx, master_.data(), n);
    }
    segments_ = detail::segment_table(ctx, ranges, n, cfg_.weight_decay != 0.0);
  }
  /// A temporary context would dangle: the optimizer keeps a pointer to it.
  sgd_optimizer(sgd_config, std::int64_t, const std::vector<param_range>&, const Ctx&&) = delete;
  sgd_optimizer(const sgd_optimizer&) = delete;
  sgd_optimizer& operator=(const sgd_optimizer&) = delete;

  /// Copies the parameters into the master weights (once, after init).
  void init_master(const Param* params) {
    if constexpr (has_master) cast(*ctx_, master_.data(), params, n_);
    master_ready_ = true;
  }
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
  /// Takes back the step count of a skipped step.
  void skipped() {
    TESSERA_THROW_IF(t_ == 0, error, "sgd: skipped() without a step");
    --t_;
  }

  std::int64_t steps_taken() const { return t_; }
  std::int64_t size() const { return n_; }
  const sgd_config& config() const { return cfg_; }
  /// Bytes of state held (momentum, master weights, the segment table).
  std::size_t state_bytes() const { return buf_.bytes() + master_.bytes() + segments_.bytes(); }
  /// The momentum buffer (n elements, context memory).
  const Master* momentum_buffer() const { return buf_.data(); }
  const Master* master() const { return has_master ? master_.data() : nullptr; }

  /// Writes t, the momentum buffer, then the master weights when kept.
  template <class Writer>
  void save(Writer& w) const {
    w.write(&t_, sizeof(t_));
    detail::write_from(*ctx_, w, buf_.data(), buf_.bytes());
    if constexpr (has_master) detail::write_from(*ctx_, w, master_.data(), master_.bytes());
  }
  /// Restores what save() wrote from host memory (serialized_bytes() bytes).
  void load(const char* p) {
    std::memcpy(&t_, p, sizeof(t_));
    p += sizeof(t_);
    ctx_->from_host(buf_.data(), p, buf_.bytes());
    p += buf_.bytes();
    if constexpr (has_master) ctx_->from_host(master_.data(), p, master_.bytes());
    master_ready_ = true;
  }
  std::size_t serialized_bytes() const { return sizeof(t_) + buf_.bytes() + master_.bytes(); }

 private:
  void launch(Param* params, const Grad* grads, double lr, double grad_scale,
              const Master* d_clip) {
    if (d_clip == nullptr && !std::isfinite(grad_scale)) return;  // skipped: nothing written, not counted
    TESSERA_THROW_IF(has_master && !master_ready_, error,
                     "sgd: master weights not initialised; call init_master(params) first");
    ++t_;
    const kernels::detail::sgd_step_params<Master> s{
        static_cast<Master>(lr), static_cast<Master>(cfg_.momentum),
        static_cast<Master>(cfg_.weight_decay), static_cast<Master>(grad_scale), cfg_.nesterov};
    Master* master = nullptr;
    if constexpr (has_master) master = master_.data();
    sgd_step(*ctx_, params, master, buf_.data(), grads, n_, segments_.data(),
             static_cast<int>(segments_.numel()), s, d_clip);
  }

  sgd_config cfg_;
  std::int64_t n_;
  const Ctx* ctx_;
  tensor<Master, Backend> buf_, master_;
  tensor<kernels::optimizer_segment, Backend> segments_;
  std::int64_t t_ = 0;
  bool master_ready_ = !has_master;
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
