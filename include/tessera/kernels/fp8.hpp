#pragma once
/// \file kernels/fp8.hpp
/// Host kernels of per-tensor FP8 scaling: a tensor's amax, its cast to
/// FP8 with a scale (q = fp8(x * s), saturating to the format's largest
/// finite value, as Transformer Engine's and cuBLASLt's scaled casts do),
/// and the way back (x' = float(q) / s: the FP8 value is exact in float,
/// the product with 1/s rounds once, and is exact when s is a power of
/// two). cuBLASLt's FP8 matmul multiplies the GEMM of the raw FP8 values
/// (exact products, float accumulation) by the two inverse scales; the
/// host reference of an FP8 GEMM does the same with the float GEMM.
///
/// T in {float, double, bf16, fp16}; F8 in {fp8_e4m3, fp8_e5m2}.
/// Sources: Micikevicius et al. 2022, "FP8 Formats for Deep Learning";
/// the OCP 8-bit floating point specification (the formats, saturation).

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/kernels/context.hpp"

namespace tessera::kernels {

namespace detail {
// F8(x * scale): saturating for a finite x, non-finite for a non-finite one.
template <class F8, class T>
F8 fp8_scaled_cast(T x, float scale) {
  const float v = static_cast<float>(to<double>(x));
  return F8(v * scale, std::isfinite(v) ? fp8_saturation::finite : fp8_saturation::none);
}
// The arguments of a scaled cast: n >= 0, scale finite > 0 (config_error naming `who`).
inline void check_fp8_cast(const char* who, std::int64_t n, float scale) {
  TESSERA_THROW_IF(n < 0, config_error, who, ": n=", n, " must be >= 0");
  TESSERA_THROW_IF(!(scale > 0) || !std::isfinite(scale), config_error, who, ": scale ", scale,
                   " must be a finite value > 0");
}
}  // namespace detail

/// max |x[i]| over [0, n) as a float (0 for n = 0); NaN if any x[i] is NaN,
/// +inf if any is infinite. Exact (a maximum rounds nothing), so any order
/// gives the same bits. Throws config_error for n < 0.
template <class T>
float fp8_amax(const host_context& ctx, const T* x, std::int64_t n) {
  (void)ctx;
  TESSERA_THROW_IF(n < 0, config_error, "fp8_amax: n=", n, " must be >= 0");
  float m = 0.0f;
  bool nan = false;
  for (std::int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(static_cast<float>(to<double>(x[i])));
    nan |= std::isnan(a);
    m = a > m ? a : m;
  }
  return nan ? NAN : m;
}

/// q[i] = F8(float(x[i]) * scale), rounded to nearest even, a finite value
/// saturated to +-F8::max_finite: the scaled cast. A non-finite x[i] stays
/// non-finite (NaN; an infinity is E5M2's infinity or E4M3's NaN), so an
/// overflow upstream is never cast into a finite value. `scale` a finite
/// float > 0. q must not alias x. Throws config_error for n < 0 or a bad scale.
template <class F8, class T>
void fp8_quantize(const host_context& ctx, F8* q, const T* x, std::int64_t n, float scale) {
  (void)ctx;
  static_assert(is_fp8_v<F8>, "fp8_quantize: F8 must be fp8_e4m3 or fp8_e5m2");
  detail::check_fp8_cast("fp8_quantize", n, scale);
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < n; ++i) q[i] = detail::fp8_scaled_cast<F8>(x[i], scale);
}

/// out[i] = float(q[i]) * inverse_scale in float, then rounded to T (for
/// float: one rounding, none when inverse_scale is a power of two).
/// Throws config_error for n < 0.
template <class T, class F8>
void fp8_dequantize(const host_context& ctx, T* out, const F8* q, std::int64_t n,
                    float inverse_scale) {
  (void)ctx;
  static_assert(is_fp8_v<F8>, "fp8_dequantize: F8 must be fp8_e4m3 or fp8_e5m2");
  TESSERA_THROW_IF(n < 0, config_error, "fp8_dequantize: n=", n, " must be >= 0");
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < n; ++i) out[i] = to<T>(static_cast<float>(q[i]) * inverse_scale);
}

/// The round trip x -> F8 -> float of fp8_quantize then fp8_dequantize,
/// without the FP8 buffer: out[i] = float(F8(x[i] * scale)) * (1 / scale)
/// in float (the operand an FP8 GEMM sees, as its float value; a
/// non-finite x[i] gives a non-finite out[i]). out may alias x when T is
/// float. Throws as fp8_quantize.
template <class F8, class T>
void fp8_round_trip(const host_context& ctx, float* out, const T* x, std::int64_t n, float scale) {
  (void)ctx;
  static_assert(is_fp8_v<F8>, "fp8_round_trip: F8 must be fp8_e4m3 or fp8_e5m2");
  detail::check_fp8_cast("fp8_round_trip", n, scale);
  const float inv = 1.0f / scale;
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < n; ++i)
    out[i] = static_cast<float>(detail::fp8_scaled_cast<F8>(x[i], scale)) * inv;
}

}  // namespace tessera::kernels
