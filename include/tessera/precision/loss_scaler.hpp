#pragma once
/// \file precision/loss_scaler.hpp
/// The loss scale of a loss-scaled precision policy (precision::fp16_mixed):
/// its settings and the dynamic scaler that moves it from step to step.
///
/// The step multiplies the loss by the scale S before backward (the seed
/// gradient is S / scored tokens), so activation gradients that would
/// underflow fp16 stay representable; the parameter gradients are then S
/// times too large and are unscaled once, by folding 1/S into the norm and
/// the clip coefficient the optimizer multiplies them by
/// (kernels::unscaled_clip_coefficient_of). A non-finite gradient anywhere
/// makes the global norm non-finite on every rank (it is summed over dp, tp
/// and pp), so every rank skips the same step, and every rank's scaler
/// takes the same update: the decision needs no communication of its own.
///
/// The dynamic update (Megatron-LM's DynamicGradScaler, DeepSpeed's
/// DynamicLossScaler with its `hysteresis`, PyTorch's GradScaler without
/// it): after `growth_interval` steps in a row without an overflow the
/// scale grows by `growth_factor`; an overflow resets that count and
/// counts down `hysteresis`: the first hysteresis - 1 overflows only skip
/// their steps, the hysteresis-th and each after it multiplies the scale
/// by `backoff_factor` (not below `min_scale`), until a growth restores the
/// count (hysteresis 1: every overflow backs off).
/// Source: Micikevicius et al. 2018, "Mixed Precision Training", sections
/// 3.2-3.3; DeepSpeed's fp16 config (initial_scale_power 16,
/// loss_scale_window 1000, hysteresis 2, min_loss_scale 1).

#include <algorithm>
#include <cmath>
#include <cstdint>

#include <nlohmann/json.hpp>

#include "tessera/core/error.hpp"

namespace tessera::precision {

/// Settings of the loss scale (the defaults are DeepSpeed's and
/// Megatron-LM's for fp16).
struct loss_scale_options {
  /// true: the dynamic scaler (file comment); false: a static scale
  /// `initial` for the whole run (a non-finite step is still skipped).
  bool dynamic = true;
  double initial = 65536;               ///< S of the first step (2^16)
  double growth_factor = 2;             ///< S *= this after growth_interval clean steps (> 1)
  double backoff_factor = 0.5;          ///< S *= this on an overflow past the hysteresis, in (0, 1)
  std::int64_t growth_interval = 1000;  ///< clean steps in a row before a growth (>= 1)
  std::int64_t hysteresis = 2;          ///< the overflow that backs off first (>= 1; 1: every one)
  double min_scale = 1;                 ///< S never backs off below this (> 0, <= initial)

  bool operator==(const loss_scale_options&) const = default;

  /// Throws config_error naming the value and its limit.
  void validate() const {
    TESSERA_THROW_IF(!(initial > 0) || !std::isfinite(initial), config_error, "loss scale ",
                     initial, " must be a finite value > 0");
    TESSERA_THROW_IF(!(growth_factor > 1) || !std::isfinite(growth_factor), config_error,
                     "loss scale growth factor ", growth_factor, " must be > 1");
    TESSERA_THROW_IF(!(backoff_factor > 0 && backoff_factor < 1), config_error,
                     "loss scale backoff factor ", backoff_factor, " must be in (0, 1)");
    TESSERA_THROW_IF(growth_interval < 1, config_error, "loss scale window (growth interval) ",
                     growth_interval, " must be >= 1 steps");
    TESSERA_THROW_IF(hysteresis < 1, config_error, "loss scale hysteresis ", hysteresis,
                     " must be >= 1");
    TESSERA_THROW_IF(!(min_scale > 0) || min_scale > initial, config_error, "minimum loss scale ",
                     min_scale, " must be > 0 and at most the initial scale ", initial);
  }
  /// The settings as JSON (a checkpoint's run settings; a resume compares them).
  nlohmann::json to_json() const {
    return {{"dynamic", dynamic},
            {"initial", initial},
            {"growth_factor", growth_factor},
            {"backoff_factor", backoff_factor},
            {"growth_interval", growth_interval},
            {"hysteresis", hysteresis},
            {"min_scale", min_scale}};
  }
};

/// The loss scale of a run and its dynamic update (file comment). Every
/// rank holds one and feeds it the same overflow flags, so every rank holds
/// the same scale. Not thread-safe (one per rank).
class loss_scaler {
 public:
  /// Starts at `o.initial`. Throws config_error for invalid options.
  explicit loss_scaler(const loss_scale_options& o = {}) : o_(o) {
    o_.validate();
    scale_ = o_.initial;
    hysteresis_left_ = o_.hysteresis;
  }

  /// S, the multiplier of the loss of the next step.
  double scale() const { return scale_; }
  /// Steps skipped for a non-finite gradient so far in the run.
  std::int64_t skipped() const { return skipped_; }
  /// The settings it was built with.
  const loss_scale_options& options() const { return o_; }

  /// After a step: `overflow` = its gradients were not finite (the step
  /// was skipped). Moves the scale (file comment); a static scale stays.
  void update(bool overflow) {
    if (overflow) {
      ++skipped_;
      if (!o_.dynamic) return;
      clean_steps_ = 0;
      if (--hysteresis_left_ <= 0) {
        hysteresis_left_ = 0;
        scale_ = std::max(scale_ * o_.backoff_factor, o_.min_scale);
      }
      return;
    }
    if (!o_.dynamic) return;
    if (++clean_steps_ == o_.growth_interval) {
      clean_steps_ = 0;
      hysteresis_left_ = o_.hysteresis;
      scale_ *= o_.growth_factor;
    }
  }

  /// The scaler's state (a checkpoint's run state): the scale, the clean
  /// steps since the last growth or overflow, the overflows left before a
  /// backoff and the steps skipped.
  nlohmann::json state() const {
    return {{"scale", scale_},
            {"clean_steps", clean_steps_},
            {"hysteresis_left", hysteresis_left_},
            {"skipped_steps", skipped_}};
  }
  /// Restores what state() wrote. Throws io_error for a malformed state
  /// (a missing or mistyped key, a scale that is not finite and > 0, counts
  /// beyond the options' growth interval or hysteresis).
  void restore(const nlohmann::json& s) {
    try {
      const double scale = s.at("scale").get<double>();
      const auto clean = s.at("clean_steps").get<std::int64_t>();
      const auto left = s.at("hysteresis_left").get<std::int64_t>();
      const auto skipped = s.at("skipped_steps").get<std::int64_t>();
      TESSERA_THROW_IF(!(scale > 0) || !std::isfinite(scale) || clean < 0 ||
                           clean >= o_.growth_interval || left < 0 || left > o_.hysteresis ||
                           skipped < 0,
                       io_error, "loss scaler state ", s.dump(),
                       " is out of range (scale finite > 0; clean_steps in [0, growth interval ",
                       o_.growth_interval, "); hysteresis_left in [0, ", o_.hysteresis,
                       "]; skipped_steps >= 0)");
      scale_ = scale;
      clean_steps_ = clean;
      hysteresis_left_ = left;
      skipped_ = skipped;
    } catch (const nlohmann::json::exception& e) {
      throw io_error(
          ::tessera::detail::str("loss scaler state ", s.dump(), " is malformed: ", e.what()));
    }
  }

 private:
  loss_scale_options o_;
  double scale_ = 1;
  std::int64_t clean_steps_ = 0;      // clean steps since the last growth or overflow
  std::int64_t hysteresis_left_ = 1;  // overflows still tolerated before a backoff
  std::int64_t skipped_ = 0;
};

}  // namespace tessera::precision
