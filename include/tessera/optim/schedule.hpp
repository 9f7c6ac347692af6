#pragma once
/// \file optim/schedule.hpp
/// Learning-rate schedules: a linear warmup, then one of a small closed set
/// of decays, chosen at run time (a command line names it): `cosine`, `wsd`
/// (warmup-stable-decay), `linear`, `constant` and `inverse_sqrt`.
///
/// Every schedule shares two rules. Step numbers start at 0; with W warmup
/// steps, T total steps, lr_max and lr_min:
///
///   step s < W:   lr = lr_max (s + 1) / W   (step 0 is not a no-op; the
///                                            last warmup step is at lr_max)
///   step s >= T:  lr = lr_min               (past the run)
///
/// and in between (W <= s < T) the decay of the kind:
///
///   cosine        lr_min + (lr_max - lr_min) (1 + cos(pi p)) / 2,
///                 p = (s - W) / (T - W)
///                 (GPT-3, Brown et al. 2020; llm.c; seed 004, section 10)
///   linear        lr_max - (lr_max - lr_min) p, p as for cosine
///                 (Hugging Face's get_linear_schedule_with_warmup, with a floor)
///   wsd           lr_max while s < T - D, then over the last D steps
///                 lr_min + (lr_max - lr_min) c(q), q = (s - (T - D)) / D,
///                 c(q) = 1 - q (linear) or 1 - sqrt(q) (sqrt, "1-sqrt");
///                 D = round(decay_fraction T)
///                 (Hu et al. 2024, "MiniCPM", section 4: warmup-stable-decay;
///                 Hägele et al. 2024, "Scaling Laws and Compute-Optimal
///                 Training Beyond Fixed Training Durations": the 1-sqrt
///                 cooldown; torchtitan's lr_scheduler.py
///                 linear_warmup_stable_decay: decay_ratio, decay_type
///                 linear | sqrt, lr_min)
///   constant      lr_max
///   inverse_sqrt  lr_max sqrt(W / (s + 1))
///                 (fairseq's inverse_square_root, lr = lr_max sqrt(W / n) at
///                 update n >= W, with n = s + 1 as this warmup counts
///                 updates; continuous with the warmup at s = W - 1)
///
/// cosine, linear and wsd reach lr_min at step T, continuously: their last
/// step, T - 1, is one step of decay above it (the same convention for all
/// three). constant and inverse_sqrt meet lr_min only past the run.
///
/// A run that goes on past its planned total (a resume with more steps)
/// builds the schedule over the new total: cosine and linear stretch their
/// decay over it, and wsd's decay window moves to the last D' =
/// round(decay_fraction T') steps of the new total T' (a run resumed inside
/// the old window goes back to lr_max until the new window starts).

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "tessera/core/error.hpp"

namespace tessera::optim {

/// The decay after the warmup (file comment).
enum class lr_schedule_kind { cosine, wsd, linear, constant, inverse_sqrt };

/// "cosine", "wsd", "linear", "constant" or "inverse_sqrt" (the names
/// parse_lr_schedule_kind reads and checkpoints record).
inline const char* to_string(lr_schedule_kind k) {
  switch (k) {
    case lr_schedule_kind::cosine:
      return "cosine";
    case lr_schedule_kind::wsd:
      return "wsd";
    case lr_schedule_kind::linear:
      return "linear";
    case lr_schedule_kind::constant:
      return "constant";
    case lr_schedule_kind::inverse_sqrt:
      return "inverse_sqrt";
  }
  return "?";
}
/// Parses a name of to_string; throws config_error naming the value and the choices.
inline lr_schedule_kind parse_lr_schedule_kind(std::string_view s) {
  for (auto k : {lr_schedule_kind::cosine, lr_schedule_kind::wsd, lr_schedule_kind::linear,
                 lr_schedule_kind::constant, lr_schedule_kind::inverse_sqrt})
    if (s == to_string(k)) return k;
  throw config_error(::tessera::detail::str(
      "unknown lr schedule '", s, "' (valid: cosine, wsd, linear, constant, inverse_sqrt)"));
}

/// The shape of WSD's cooldown: `linear` (1 - q) or `sqrt` (1 - sqrt(q),
/// Hägele et al. 2024's "1-sqrt").
enum class wsd_cooldown { linear, sqrt };

/// "linear" or "sqrt".
inline const char* to_string(wsd_cooldown c) {
  return c == wsd_cooldown::linear ? "linear" : "sqrt";
}
/// Parses "linear" or "sqrt"; throws config_error naming the value and the choices.
inline wsd_cooldown parse_wsd_cooldown(std::string_view s) {
  if (s == "linear") return wsd_cooldown::linear;
  if (s == "sqrt") return wsd_cooldown::sqrt;
  throw config_error(
      ::tessera::detail::str("unknown WSD cooldown '", s, "' (valid: linear, sqrt)"));
}

/// WSD's decay: the fraction of all steps it takes (torchtitan's
/// decay_ratio; default 0.1) and its shape. Other schedules refuse
/// settings other than these defaults (lr_schedule::validate).
struct wsd_options {
  double decay_fraction = 0.1;  ///< in (0, 1]: D = round(decay_fraction T) steps
  wsd_cooldown cooldown = wsd_cooldown::linear;

  bool operator==(const wsd_options&) const = default;
  /// D: the steps of the decay for a run of `total` steps,
  /// round(decay_fraction total), halves away from zero.
  std::int64_t decay_steps(std::int64_t total) const {
    return std::llround(decay_fraction * static_cast<double>(total));
  }
  /// Throws config_error unless decay_fraction is in (0, 1].
  void validate() const {
    TESSERA_THROW_IF(!(decay_fraction > 0 && decay_fraction <= 1), config_error,
                     "wsd decay_fraction=", decay_fraction, " must be in (0, 1]");
  }
  /// The settings as JSON (a checkpoint's run settings).
  nlohmann::json to_json() const {
    return {{"decay_fraction", decay_fraction}, {"cooldown", to_string(cooldown)}};
  }
};

/// A learning-rate schedule: `operator()(s)` is the learning rate of
/// optimizer step s (0-based), by the formulas of the file comment. A
/// value type; evaluating it is pure (the same step gives the same bits,
/// so a resumed run's learning rates equal the uninterrupted run's).
struct lr_schedule {
  lr_schedule_kind kind = lr_schedule_kind::cosine;
  double max_lr = 3e-4;       ///< lr_max, reached at the last warmup step
  double min_lr = 3e-5;       ///< lr_min, at step `total` and after
  std::int64_t warmup = 100;  ///< W, warmup steps (>= 0; inverse_sqrt: >= 1)
  std::int64_t total = 1000;  ///< T, the run's steps (>= 1)
  wsd_options wsd{};          ///< wsd's decay (other kinds: the defaults)

  /// Throws config_error, one line naming the value and its limit, if
  /// warmup < 0, total < 1, the lr range is not 0 <= min_lr <= max_lr
  /// (finite), wsd's decay fraction is outside (0, 1] or its decay would
  /// start inside the warmup (W + D > T), inverse_sqrt has no warmup, or
  /// another kind is given WSD settings other than the defaults.
  void validate() const {
    TESSERA_THROW_IF(warmup < 0, config_error, "warmup=", warmup, " must be >= 0");
    TESSERA_THROW_IF(total < 1, config_error, "total steps=", total, " must be >= 1");
    TESSERA_THROW_IF(!(min_lr >= 0 && min_lr <= max_lr && std::isfinite(max_lr)), config_error,
                     "lr range [", min_lr, ", ", max_lr, "] must satisfy 0 <= min_lr <= max_lr");
    if (kind == lr_schedule_kind::wsd) {
      wsd.validate();
      const std::int64_t d = wsd.decay_steps(total);
      TESSERA_THROW_IF(warmup > total - d, config_error, "wsd's decay of ", d,
                       " steps (decay_fraction=", wsd.decay_fraction, " of total=", total,
                       ") would start at step ", total - d, ", inside the warmup of ", warmup,
                       " steps: lower the warmup or the decay fraction");
    } else {
      TESSERA_THROW_IF(wsd != wsd_options{}, config_error,
                       "wsd decay_fraction=", wsd.decay_fraction, " and cooldown ",
                       to_string(wsd.cooldown), " shape wsd's decay only, not the ",
                       to_string(kind), " schedule's");
    }
    TESSERA_THROW_IF(kind == lr_schedule_kind::inverse_sqrt && warmup < 1, config_error,
                     "inverse_sqrt decays as max_lr sqrt(warmup / (step + 1)): it needs "
                     "warmup >= 1 (warmup=",
                     warmup, ")");
  }

  /// The first step of wsd's decay window, T - D (T for the other kinds).
  std::int64_t decay_start() const {
    return kind == lr_schedule_kind::wsd ? total - wsd.decay_steps(total) : total;
  }

  /// Learning rate at optimizer step `step` (0-based); file comment.
  double operator()(std::int64_t step) const {
    if (step < warmup) return max_lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
    if (step >= total) return min_lr;
    switch (kind) {
      case lr_schedule_kind::cosine: {
        const double span = static_cast<double>(total - warmup);
        const double progress = span > 0 ? static_cast<double>(step - warmup) / span : 1.0;
        return min_lr +
               0.5 * (max_lr - min_lr) * (1.0 + std::cos(3.14159265358979323846 * progress));
      }
      case lr_schedule_kind::linear: {
        const double p = static_cast<double>(step - warmup) / static_cast<double>(total - warmup);
        return max_lr - (max_lr - min_lr) * p;
      }
      case lr_schedule_kind::wsd: {
        const std::int64_t start = decay_start();
        if (step < start) return max_lr;
        const double q = static_cast<double>(step - start) / static_cast<double>(total - start);
        const double c = wsd.cooldown == wsd_cooldown::linear ? 1.0 - q : 1.0 - std::sqrt(q);
        return min_lr + (max_lr - min_lr) * c;
      }
      case lr_schedule_kind::constant:
        return max_lr;
      case lr_schedule_kind::inverse_sqrt:
        return max_lr * std::sqrt(static_cast<double>(warmup) / static_cast<double>(step + 1));
    }
    return min_lr;
  }

  /// One line for a log: "warmup 50, cosine decay to step 2400"; wsd's
  /// names its stable phase and cooldown ("warmup 50, stable to step 2160,
  /// 1-sqrt cooldown to step 2400").
  std::string describe() const {
    const auto w = ::tessera::detail::str("warmup ", warmup, ", ");
    switch (kind) {
      case lr_schedule_kind::cosine:
        return w + ::tessera::detail::str("cosine decay to step ", total);
      case lr_schedule_kind::linear:
        return w + ::tessera::detail::str("linear decay to step ", total);
      case lr_schedule_kind::wsd:
        return w +
               ::tessera::detail::str("stable to step ", decay_start(), ", ",
                                      wsd.cooldown == wsd_cooldown::linear ? "linear" : "1-sqrt",
                                      " cooldown to step ", total);
      case lr_schedule_kind::constant:
        return w + ::tessera::detail::str("constant to step ", total);
      case lr_schedule_kind::inverse_sqrt:
        return w + ::tessera::detail::str("inverse square root decay to step ", total);
    }
    return w;
  }
};

}  // namespace tessera::optim
