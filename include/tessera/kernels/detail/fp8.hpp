#pragma once
/// \file kernels/detail/fp8.hpp
/// The FP8 scaled cast and the magnitude an amax takes, shared by the host
/// kernels (kernels/fp8.hpp) and the CUDA kernels (kernels/cuda/fp8.cuh), so
/// a value casts to the same byte on both; and the argument checks of both
/// (the same config_error messages, `who` naming the kernel).

#include <cmath>
#include <cstdint>
#include <limits>

#include "tessera/core/config.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/numeric.hpp"

namespace tessera::kernels::detail {

/// True when v is finite, by the bits (no compiler flag folds it away).
TESSERA_HOST_DEVICE inline bool fp8_finite(float v) {
  return (::tessera::detail::float_bits(v) & 0x7f800000u) != 0x7f800000u;
}

/// |v| by the bits (NaN stays NaN).
TESSERA_HOST_DEVICE inline float fp8_abs(float v) {
  return ::tessera::detail::bits_float(::tessera::detail::float_bits(v) & 0x7fffffffu);
}

/// F8(float(x) * scale), rounded to nearest even and saturating to
/// +-F8::max_finite, for a finite x; a non-finite x is cast as it is,
/// unscaled and unsaturated: NaN stays NaN with its sign, +-inf becomes
/// E5M2's +-inf or E4M3's NaN (an overflow upstream is never cast into a
/// finite value). For a scale that is finite > 0 that is F8(x * scale)
/// exactly; not multiplying keeps a NaN's sign where a GPU's multiply would
/// return its canonical NaN, so host and device give the same byte. float(x)
/// is exact for float, bf16 and fp16 and rounds a double once.
/// Sources: the OCP 8-bit floating point specification, rev 1.0
/// (saturating conversion); Micikevicius et al. 2022, section 4.
template <class F8, class T>
TESSERA_HOST_DEVICE inline F8 fp8_scaled_cast(T x, float scale) {
  const float v = to<float>(x);
  return fp8_finite(v) ? F8(v * scale, fp8_saturation::finite) : F8(v, fp8_saturation::none);
}

// ---- argument checks (host code; config_error naming `who` and the value) --------------------

/// n >= 0.
inline void check_fp8_size(const char* who, std::int64_t n) {
  TESSERA_THROW_IF(n < 0, config_error, who, ": n=", n, " must be >= 0");
}
/// A scale that is finite and > 0 (where its value is on the host).
inline void check_fp8_scale(const char* who, float scale) {
  TESSERA_THROW_IF(!(scale > 0) || !std::isfinite(scale), config_error, who, ": scale ", scale,
                   " must be a finite value > 0");
}
/// The arguments of a scaled cast with the scale's value on the host: n >= 0,
/// scale finite > 0.
inline void check_fp8_cast(const char* who, std::int64_t n, float scale) {
  check_fp8_size(who, n);
  check_fp8_scale(who, scale);
}
/// A pointer the kernel reads or writes one float through (a scale, an amax).
inline void check_fp8_pointer(const char* who, const char* name, const void* p) {
  TESSERA_THROW_IF(p == nullptr, config_error, who, ": ", name, " is null");
}
/// rows, cols >= 0 with rows * cols within std::int64_t.
inline void check_fp8_matrix(const char* who, std::int64_t rows, std::int64_t cols) {
  TESSERA_THROW_IF(rows < 0 || cols < 0, config_error, who, ": rows=", rows, " and cols=", cols,
                   " must be >= 0");
  TESSERA_THROW_IF(cols > 0 && rows > std::numeric_limits<std::int64_t>::max() / cols, config_error,
                   who, ": rows=", rows, " x cols=", cols, " elements overflow a 64-bit size");
}
/// The settings of a scale update: fp8_max finite > 0 (the format's largest
/// finite value), margin in [0, 64] (as fp8_recipe::validate).
inline void check_fp8_update(const char* who, float fp8_max, int margin) {
  TESSERA_THROW_IF(!(fp8_max > 0) || !std::isfinite(fp8_max), config_error, who, ": fp8_max ",
                   fp8_max, " must be a finite value > 0");
  TESSERA_THROW_IF(margin < 0 || margin > 64, config_error, who, ": margin ", margin,
                   " must be in [0, 64]");
}

}  // namespace tessera::kernels::detail
