#pragma once
/// \file optim/schedule.hpp
/// Learning-rate schedules: linear warmup, then cosine decay to a floor.

#include <cmath>
#include <cstdint>

#include "tessera/core/error.hpp"

namespace tessera::optim {

/// Linear warmup for `warmup` steps, then cosine decay from `max_lr` to
/// `min_lr` at step `total` (and `min_lr` after). Step numbers start at 0:
/// step s < warmup gets max_lr * (s + 1) / warmup (so step 0 is not a no-op).
/// Source: the warmup-cosine schedule of seed 004, section 10 (also GPT-3,
/// Brown et al. 2020, and llm.c).
struct warmup_cosine {
  double max_lr = 3e-4;
  double min_lr = 3e-5;
  std::int64_t warmup = 100;
  std::int64_t total = 1000;

  /// Throws config_error if warmup < 0, total < 1, or min_lr > max_lr.
  void validate() const {
    TESSERA_THROW_IF(warmup < 0, config_error, "warmup=", warmup, " must be >= 0");
    TESSERA_THROW_IF(total < 1, config_error, "total steps=", total, " must be >= 1");
    TESSERA_THROW_IF(max_lr < 0 || min_lr < 0 || min_lr > max_lr, config_error, "lr range [",
                     min_lr, ", ", max_lr, "] must satisfy 0 <= min_lr <= max_lr");
  }
  /// Learning rate at optimizer step `step` (0-based).
  double operator()(std::int64_t step) const {
    if (step < warmup) return max_lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
    if (step >= total) return min_lr;
    double span = static_cast<double>(total - warmup);
    double progress = span > 0 ? static_cast<double>(step - warmup) / span : 1.0;
    return min_lr + 0.5 * (max_lr - min_lr) * (1.0 + std::cos(3.14159265358979323846 * progress));
  }
};

}  // namespace tessera::optim
