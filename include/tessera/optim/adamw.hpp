#pragma once
/// \file optim/adamw.hpp
/// AdamW over a flat parameter buffer (one multi-tensor pass).
///
/// State (float32 by default: master weights when the parameters are stored
/// in a narrower type, first and second moments) is allocated when the
/// optimizer is built, not lazily on the first step, so the memory floor is
/// visible before step 0 (DESIGN.md, "Key types"). The optimizer owns the
/// elements [begin, end) of the flat buffer: the whole buffer on one rank, a
/// shard under ZeRO.
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
#include "tessera/kernels/detail/adamw.hpp"
#include "tessera/optim/param_range.hpp"

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
    TESSERA_THROW_IF(weight_decay < 0, config_error, "weight_decay=", weight_decay, " must be >= 0");
  }
};

/// AdamW optimizer policy over a flat buffer of `Param` with gradients `Grad`
/// and float32 (`Master`) state. When Param == Master the parameters are
/// updated in place and no master copy is kept.
template <class Param, class Grad, class Master = accum_t<Param>>
class adamw {
public:
  static constexpr const char* name = "adamw";
  static constexpr bool has_master = !std::is_same_v<Param, Master>;
  /// Bytes of optimizer state per parameter (moments, plus master weights if kept).
  static constexpr std::size_t state_bytes_per_param = (has_master ? 3 : 2) * sizeof(Master);

  /// Builds the optimizer for elements [begin, end) of the flat buffer, with
  /// `ranges` (absolute offsets) giving the decay flag of each element; ranges
  /// outside [begin, end) are clipped. Allocates all state from `mr` now.
  adamw(adamw_config cfg, std::int64_t begin, std::int64_t end, std::vector<param_range> ranges,
        memory_resource& mr = host::default_resource())
      : cfg_(cfg), begin_(begin), end_(end), ranges_(clip_ranges(ranges, begin, end)) {
    cfg_.validate();
    TESSERA_THROW_IF(end < begin, config_error, "optimizer range [", begin, ", ", end, ") has end < begin");
    const std::int64_t n = end - begin;
    m_ = tensor<Master>(shape{n}, mr);
    v_ = tensor<Master>(shape{n}, mr);
    m_.zero();
    v_.zero();
    if constexpr (has_master) {
      master_ = tensor<Master>(shape{n}, mr);
      master_.zero();
    }
  }

  /// Copies the current parameters into the master weights (call once after
  /// the model is initialised). `params` points at the start of the flat buffer.
  void init_master(const Param* params) {
    if constexpr (has_master) {
      for (std::int64_t i = begin_; i < end_; ++i) master_[i - begin_] = to<Master>(params[i]);
    }
    master_ready_ = true;
  }

  /// One step over the owned elements: grads (flat buffer start) are scaled by
  /// `grad_scale` (the clip coefficient), parameters updated in place, and,
  /// when a master copy is kept, params[i] = round(master[i]).
  /// Throws tessera::error if the master weights were never initialised
  /// (init_master or load), which would write zeros into the parameters.
  void step(Param* params, const Grad* grads, double lr, double grad_scale = 1.0) {
    TESSERA_THROW_IF(has_master && !master_ready_, error,
                     "adamw::step: master weights not initialised; call init_master(params) first");
    ++t_;
    kernels::detail::adamw_step_params<Master> s{
        static_cast<Master>(lr),
        static_cast<Master>(cfg_.beta1),
        static_cast<Master>(cfg_.beta2),
        static_cast<Master>(cfg_.eps),
        static_cast<Master>(cfg_.weight_decay),
        static_cast<Master>(1.0 - std::pow(cfg_.beta1, static_cast<double>(t_))),
        static_cast<Master>(1.0 - std::pow(cfg_.beta2, static_cast<double>(t_))),
        static_cast<Master>(grad_scale)};
    Master* m = m_.data();
    Master* v = v_.data();
    Master* master = nullptr;
    if constexpr (has_master) master = master_.data();
    for (const auto& r : ranges_) {
      const bool decay = r.decay && cfg_.weight_decay != 0.0;
#pragma omp parallel for schedule(static)
      for (std::int64_t i = r.begin; i < r.end; ++i) {
        const std::int64_t j = i - begin_;
        Master g = to<Master>(grads[i]);
        if constexpr (has_master) {
          kernels::detail::adamw_update(master[j], m[j], v[j], g, s, decay);
          params[i] = to<Param>(master[j]);
        } else {
          kernels::detail::adamw_update(params[i], m[j], v[j], g, s, decay);
        }
      }
    }
  }

  std::int64_t steps_taken() const { return t_; }
  std::int64_t begin() const { return begin_; }
  std::int64_t end() const { return end_; }
  const adamw_config& config() const { return cfg_; }
  /// Bytes of state held (master weights and moments).
  std::size_t state_bytes() const { return m_.bytes() + v_.bytes() + master_.bytes(); }
  const Master* exp_avg() const { return m_.data(); }
  const Master* exp_avg_sq() const { return v_.data(); }
  const Master* master() const { return has_master ? master_.data() : nullptr; }

  /// Writes the step count and every state buffer (raw little-endian bytes,
  /// serialized_bytes() in all) through `w.write(const void*, bytes)`.
  template <class Writer>
  void save(Writer& w) const {
    w.write(&t_, sizeof(t_));
    w.write(m_.data(), m_.bytes());
    w.write(v_.data(), v_.bytes());
    if constexpr (has_master) w.write(master_.data(), master_.bytes());
  }
  /// Restores what save() wrote from `p`, which holds serialized_bytes() bytes
  /// (the caller checks the size before calling).
  void load(const char* p) {
    auto rd = [&](void* dst, std::size_t n) {
      std::memcpy(dst, p, n);
      p += n;
    };
    rd(&t_, sizeof(t_));
    rd(m_.data(), m_.bytes());
    rd(v_.data(), v_.bytes());
    if constexpr (has_master) rd(master_.data(), master_.bytes());
    master_ready_ = true;
  }
  /// Bytes save() writes.
  std::size_t serialized_bytes() const { return sizeof(t_) + state_bytes(); }

private:
  adamw_config cfg_;
  std::int64_t begin_, end_;
  std::vector<param_range> ranges_;
  tensor<Master> m_, v_, master_;
  std::int64_t t_ = 0;
  bool master_ready_ = !has_master;
};

}  // namespace tessera::optim
