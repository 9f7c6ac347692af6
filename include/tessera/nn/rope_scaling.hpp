#pragma once
/// \file nn/rope_scaling.hpp
/// Llama 3.1's RoPE frequency scaling (Hugging Face's rope_type "llama3"),
/// which Llama 3.1 and 3.2 use to reach 128K positions, and the inverse
/// frequencies of a model's RoPE tables.
///
/// Each unscaled inverse frequency f = theta^(-2i/hd) has the wavelength
/// w = 2 pi / f (positions per turn). With L = original_max_position_embeddings,
/// w_lo = L / low_freq_factor and w_hi = L / high_freq_factor (w_hi < w_lo):
///
///   w <  w_hi          f' = f                       (high frequencies: kept)
///   w >  w_lo          f' = f / factor              (low frequencies: slowed)
///   w_hi <= w <= w_lo  f' = (1 - s) f / factor + s f,
///                      s  = (L / w - low_freq_factor) / (high_freq_factor - low_freq_factor)
///
/// s runs from 0 at w = w_lo to 1 at w = w_hi, so f' is continuous. Both
/// edges belong to the smoothed band, and each expression is evaluated in
/// the order written, in double, as transformers' _compute_llama3_parameters
/// (src/transformers/modeling_rope_utils.py) evaluates it.
/// Source: Meta's reference implementation of Llama 3.1 (llama-models,
/// apply_scaling) and transformers' _compute_llama3_parameters.

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/kernels/detail/rope.hpp"

namespace tessera::nn {

/// The parameters of rope_type "llama3" (config.json's rope_scaling, or
/// rope_parameters from transformers 5 on). The defaults are Llama 3.1's;
/// Llama 3.2 1B and 3B use factor 32.
struct llama3_rope_scaling {
  double factor = 8.0;            ///< divides the low frequencies (>= 1)
  double low_freq_factor = 1.0;   ///< w_lo = L / low_freq_factor (> 0)
  double high_freq_factor = 4.0;  ///< w_hi = L / high_freq_factor (> low_freq_factor)
  std::int64_t original_max_position_embeddings = 8192;  ///< L, the pre-training context

  bool operator==(const llama3_rope_scaling&) const = default;

  /// Throws config_error naming the value for a factor below 1 or not
  /// finite, a low_freq_factor not positive, a high_freq_factor not above
  /// low_freq_factor (the smoothed band would be empty or inverted: s
  /// divides by their difference), or original_max_position_embeddings < 1.
  void validate() const {
    TESSERA_THROW_IF(!(factor >= 1.0 && std::isfinite(factor)), config_error,
                     "rope scaling factor=", factor, " must be finite and >= 1");
    TESSERA_THROW_IF(!(low_freq_factor > 0.0 && std::isfinite(low_freq_factor)), config_error,
                     "rope scaling low_freq_factor=", low_freq_factor, " must be finite and > 0");
    TESSERA_THROW_IF(!(high_freq_factor > low_freq_factor && std::isfinite(high_freq_factor)),
                     config_error, "rope scaling high_freq_factor=", high_freq_factor,
                     " must be finite and > low_freq_factor=", low_freq_factor);
    TESSERA_THROW_IF(original_max_position_embeddings < 1, config_error,
                     "rope scaling original_max_position_embeddings=",
                     original_max_position_embeddings, " must be >= 1");
  }
};

/// "none", or "llama3(factor=8, low_freq_factor=1, high_freq_factor=4,
/// original_max_position_embeddings=8192)": for messages.
inline std::string to_string(const std::optional<llama3_rope_scaling>& s) {
  if (!s) return "none";
  return tessera::detail::str(
      "llama3(factor=", s->factor, ", low_freq_factor=", s->low_freq_factor,
      ", high_freq_factor=", s->high_freq_factor,
      ", original_max_position_embeddings=", s->original_max_position_embeddings, ")");
}

/// The llama3-scaled inverse frequency of the unscaled inverse frequency
/// `inv_freq` (radians per position, > 0), by the three bands of the file
/// comment; double throughout. `s` must be valid (llama3_rope_scaling::validate).
inline double llama3_scaled_inv_freq(double inv_freq, const llama3_rope_scaling& s) {
  constexpr double two_pi = 6.283185307179586;  // 2 * math.pi, rounded to double as Python's
  const double L = static_cast<double>(s.original_max_position_embeddings);
  const double low_freq_wavelen = L / s.low_freq_factor;
  const double high_freq_wavelen = L / s.high_freq_factor;
  const double wavelen = two_pi / inv_freq;
  if (wavelen < high_freq_wavelen) return inv_freq;
  if (wavelen > low_freq_wavelen) return inv_freq / s.factor;
  const double smooth =
      (L / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  return (1 - smooth) * inv_freq / s.factor + smooth * inv_freq;
}

/// The hd/2 RoPE inverse frequencies of a head of hd dims, in double:
/// theta^(-2i/hd) (kernels::detail::rope_inv_freq), each passed through
/// llama3_scaled_inv_freq when `scaling` is set. These feed
/// kernels::rope_table, whose tables both backends read.
/// Throws config_error for hd odd or <= 0, theta <= 0, and as
/// llama3_rope_scaling::validate.
inline std::vector<double> rope_inv_freqs(std::int64_t hd, double theta,
                                          const std::optional<llama3_rope_scaling>& scaling) {
  TESSERA_THROW_IF(hd <= 0 || hd % 2 != 0, config_error, "rope_inv_freqs: head dim hd=", hd,
                   " must be positive and even (RoPE rotates pairs)");
  TESSERA_THROW_IF(!(theta > 0), config_error, "rope_inv_freqs: theta=", theta, " must be > 0");
  if (scaling) scaling->validate();
  std::vector<double> f(static_cast<std::size_t>(hd / 2));
  for (std::int64_t i = 0; i < hd / 2; ++i) {
    double x = kernels::detail::rope_inv_freq(i, hd, theta);
    if (scaling) x = llama3_scaled_inv_freq(x, *scaling);
    f[static_cast<std::size_t>(i)] = x;
  }
  return f;
}

}  // namespace tessera::nn
