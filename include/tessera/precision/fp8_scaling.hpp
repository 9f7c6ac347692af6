#pragma once
/// \file precision/fp8_scaling.hpp
/// The scale of a tensor cast to FP8: q = fp8(x * s), x ~= q / s, with s
/// chosen so the tensor's largest magnitude (its amax) lands near the
/// format's largest finite value (448 for E4M3, 57344 for E5M2; core's
/// fp8_e4m3, fp8_e5m2). Two recipes, as the FP8 training libraries name
/// them:
///
///   current  (tensorwise, torchao's Float8Linear default): s from this
///            tensor's own amax, computed before the cast;
///   delayed  (Transformer Engine's DelayedScaling): s from a history of
///            the amaxes of the last `history` uses of the tensor, so the
///            cast needs no pass over the tensor before it; the tensor's
///            amax is recorded after the use.
///
/// Either way s = fp8_max / amax / 2^margin, and an amax of 0 or one that
/// is not finite keeps the previous scale (Transformer Engine's
/// _default_sf_compute), so an all-zero tensor or an overflowing step does
/// not poison the scale.
/// Sources: Micikevicius et al. 2022, "FP8 Formats for Deep Learning",
/// section 4 (per-tensor scaling); Transformer Engine's
/// common/recipe/__init__.py (DelayedScaling: amax_history_len,
/// amax_compute_algo, margin) and pytorch/fp8.py (the scale update).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/core/error.hpp"
#include "tessera/core/fp8_scale.hpp"
#include "tessera/core/numeric.hpp"

namespace tessera::precision {

/// How a tensor's FP8 scale is chosen (file comment).
enum class fp8_scaling { delayed, current };

/// "delayed" or "current".
inline const char* to_string(fp8_scaling s) {
  return s == fp8_scaling::delayed ? "delayed" : "current";
}
/// Parses "delayed" or "current"; throws config_error naming the value and the choices.
inline fp8_scaling parse_fp8_scaling(std::string_view s) {
  if (s == "delayed") return fp8_scaling::delayed;
  if (s == "current") return fp8_scaling::current;
  throw config_error(::tessera::detail::str("unknown FP8 scaling '", s,
                                            "' (valid: delayed, current)"));
}

/// Which FP8 formats a GEMM's operands take: `hybrid` (E4M3 for the
/// forward's x and W, E5M2 for the gradient dy: Transformer Engine's
/// default Format.HYBRID; E5M2's range suits gradients) or `e4m3` (E4M3 for
/// every operand, TE's Format.E4M3).
enum class fp8_format { hybrid, e4m3 };

/// "hybrid" or "e4m3".
inline const char* to_string(fp8_format f) {
  return f == fp8_format::hybrid ? "hybrid" : "e4m3";
}
/// Parses "hybrid" or "e4m3"; throws config_error naming the value and the choices.
inline fp8_format parse_fp8_format(std::string_view s) {
  if (s == "hybrid") return fp8_format::hybrid;
  if (s == "e4m3") return fp8_format::e4m3;
  throw config_error(::tessera::detail::str("unknown FP8 format '", s, "' (valid: hybrid, e4m3)"));
}

/// The FP8 recipe's settings (values; the defaults are Transformer
/// Engine's DelayedScaling, with amax over the whole history, and its
/// HYBRID formats).
struct fp8_recipe {
  fp8_scaling scaling = fp8_scaling::delayed;
  /// The operands' formats (fp8_format).
  fp8_format format = fp8_format::hybrid;
  /// Uses of a tensor whose amaxes a delayed scale keeps (>= 1).
  std::int64_t history = 1024;
  /// true: the scale from the largest amax of the history (TE's "max");
  /// false: from the most recent one (TE's "most_recent").
  bool amax_over_history = true;
  /// The scale is divided by 2^margin: headroom for growth (>= 0).
  int margin = 0;

  bool operator==(const fp8_recipe&) const = default;
  /// Throws config_error naming the value and its limit.
  void validate() const {
    TESSERA_THROW_IF(history < 1 || history > (std::int64_t{1} << 20), config_error,
                     "FP8 amax history ", history, " must be in [1, 2^20] uses");
    TESSERA_THROW_IF(margin < 0 || margin > 64, config_error, "FP8 scale margin ", margin,
                     " must be in [0, 64]");
  }
  /// The settings as JSON (a checkpoint's run settings).
  nlohmann::json to_json() const {
    return {{"scaling", to_string(scaling)},
            {"format", to_string(format)},
            {"history", history},
            {"amax", amax_over_history ? "max" : "most_recent"},
            {"margin", margin}};
  }
};

/// The largest finite value of the forward operands' format (x and W):
/// 448, E4M3 under either format.
inline float fp8_forward_max(const fp8_recipe&) {
  return fp8_e4m3::max_finite;
}
/// The largest finite value of the gradient's format (dy): 57344 (E5M2)
/// under hybrid, 448 (E4M3) under e4m3.
inline float fp8_backward_max(const fp8_recipe& r) {
  return r.format == fp8_format::hybrid ? fp8_e5m2::max_finite : fp8_e4m3::max_finite;
}

/// The amax maximum and the scale's formula (core/fp8_scale.hpp, shared
/// with the kernels), under the names the recipes have used.
using ::tessera::fp8_amax_max;
using ::tessera::fp8_scale_of;

/// One tensor's scale under a recipe: `scale()` is what it is cast with
/// now; `record(amax)` after each use (delayed: the amax joins the history
/// and the scale follows it; current: the scale follows the tensor's own
/// amax before each use: `set_current` on the host, or fp8_update_scale in
/// the context's memory and `assign` to bring it back, as
/// nn::fp8_linear_state does). Every rank that
/// holds a piece of a tensor records the amax reduced over the tensor's
/// group (tp), so the ranks keep equal scales. Not thread-safe.
class fp8_scale {
 public:
  /// A tensor of `format`'s largest finite value `fp8_max`; scale 1 to start.
  fp8_scale(const fp8_recipe& r, float fp8_max) : r_(r), max_(fp8_max) {
    r_.validate();
    if (r_.scaling == fp8_scaling::delayed)
      history_.assign(static_cast<std::size_t>(r_.history), 0.0f);
  }
  /// The scale to cast with (q = fp8(x * scale())).
  float scale() const { return scale_; }
  /// 1 / scale(): what a dequantisation or an FP8 GEMM multiplies by.
  float inverse() const { return 1.0f / scale_; }
  /// The recipe this scale follows.
  const fp8_recipe& recipe() const { return r_; }
  /// The largest finite value of the tensor's format (448 or 57344).
  float fp8_max() const { return max_; }

  /// Takes `s` as the scale: what a kernel computed from the tensor's amax
  /// in the context's memory under current scaling (fp8_scale_of there),
  /// brought back to be kept in a checkpoint. Throws config_error unless s
  /// is finite > 0.
  void assign(float s) {
    TESSERA_THROW_IF(!(s > 0) || !std::isfinite(s), config_error, "FP8 scale ", s,
                     " must be finite > 0");
    scale_ = s;
  }

  /// current: the scale from this tensor's own amax, before the cast.
  void set_current(float amax) { scale_ = fp8_scale_of(amax, max_, r_.margin, scale_); }

  /// After a use of the tensor whose amax was `amax`. delayed: the amax
  /// joins the history (the oldest leaves) and the scale becomes
  /// fp8_scale_of(max of the history, or `amax`); current: nothing to keep.
  void record(float amax) {
    if (r_.scaling != fp8_scaling::delayed) return;
    history_[static_cast<std::size_t>(next_)] = amax;
    next_ = (next_ + 1) % r_.history;
    float a = amax;
    if (r_.amax_over_history)
      for (float h : history_) a = fp8_amax_max(a, h);
    scale_ = fp8_scale_of(a, max_, r_.margin, scale_);
  }

  /// The state a checkpoint keeps: the scale, and under delayed scaling the
  /// history, oldest first.
  nlohmann::json state() const {
    nlohmann::json h = nlohmann::json::array();
    for (std::int64_t i = 0; i < static_cast<std::int64_t>(history_.size()); ++i)
      h.push_back(history_[static_cast<std::size_t>((next_ + i) % r_.history)]);
    return {{"scale", scale_}, {"amax_history", h}};
  }
  /// Restores what state() wrote (an amax written as null, as JSON writes
  /// an infinity, is read as +inf). Throws io_error for a malformed
  /// state (a history of another length than the recipe's, a scale not
  /// finite > 0).
  void restore(const nlohmann::json& s) {
    try {
      const float scale = s.at("scale").get<float>();
      // JSON has no infinity: an overflowed use's amax (+inf; an amax is
      // never NaN, fp8_amax_max) is written as null and read back as +inf,
      // so the scales move on alike.
      std::vector<float> h;
      for (const auto& a : s.at("amax_history"))
        h.push_back(a.is_null() ? INFINITY : a.get<float>());
      TESSERA_THROW_IF(!(scale > 0) || !std::isfinite(scale) || h.size() != history_.size(),
                       io_error, "FP8 scale state with scale ", scale, " and an amax history of ",
                       h.size(), " (this recipe keeps ", history_.size(),
                       "): the scale must be finite > 0 and the lengths equal");
      scale_ = scale;
      history_ = h;
      next_ = 0;
    } catch (const nlohmann::json::exception& e) {
      throw io_error(::tessera::detail::str("FP8 scale state is malformed: ", e.what()));
    }
  }

 private:
  fp8_recipe r_;
  float max_;
  float scale_ = 1.0f;
  std::vector<float> history_;  // delayed: a ring of the last `history` amaxes
  std::int64_t next_ = 0;       // the ring's oldest entry, where the next amax goes
};

}  // namespace tessera::precision
