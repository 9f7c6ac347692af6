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
/// The forms that keep the scale and the amax in memory (fp8_amax_accumulate,
/// fp8_update_scale, fp8_quantize with a scale pointer,
/// fp8_quantize_transposed) have the same names and arguments on a
/// cuda_context (kernels/cuda/ops.hpp, device pointers), where the host never
/// reads the scale: current scaling sets it from the amax on the device.
///
/// T in {float, double, bf16, fp16}; F8 in {fp8_e4m3, fp8_e5m2}.
/// Sources: Micikevicius et al. 2022, "FP8 Formats for Deep Learning";
/// the OCP 8-bit floating point specification (the formats, saturation);
/// Transformer Engine's cast_transpose (the transposed cast).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/core/fp8_scale.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/kernels/context.hpp"
#include "tessera/kernels/detail/fp8.hpp"

namespace tessera::kernels {

/// max |x[i]| over [0, n) as a float (0 for n = 0); +inf if any x[i] is
/// NaN or infinite (core/fp8_scale.hpp: an amax lies in [0, +inf]). Exact (a maximum rounds nothing), so any order
/// gives the same bits. Throws config_error for n < 0.
template <class T>
float fp8_amax(const host_context& ctx, const T* x, std::int64_t n) {
  (void)ctx;
  detail::check_fp8_size("fp8_amax", n);
  float m = 0.0f;
  bool nan = false;
  for (std::int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(static_cast<float>(to<double>(x[i])));
    nan |= std::isnan(a);
    m = a > m ? a : m;
  }
  return nan ? INFINITY : m;
}

/// *amax = fp8_amax_max(*amax, max |x[i]| over [0, n)): the tensor's amax
/// folded into a running one (several buffers of one tensor, or the amax of
/// a use recorded into what a delayed scale reads). +inf if any x[i] is
/// NaN or infinite (fp8_amax_max); exact, so any order gives the same bits (the GPU's
/// too). n = 0 leaves *amax as it is. `amax`: one float; x of T in {float,
/// double, bf16, fp16}. Throws config_error for n < 0 or a null amax.
/// Source: Micikevicius et al. 2022, section 4 (per-tensor amax).
template <class T>
void fp8_amax_accumulate(const host_context& ctx, float* amax, const T* x, std::int64_t n) {
  detail::check_fp8_size("fp8_amax_accumulate", n);
  detail::check_fp8_pointer("fp8_amax_accumulate", "amax", amax);
  if (n == 0) return;
  *amax = fp8_amax_max(*amax, fp8_amax(ctx, x, n));
}

/// *scale = fp8_scale_of(*amax, fp8_max, margin, *scale): fp8_max / *amax /
/// 2^margin, or the scale as it was where *amax is 0 or not finite (or the
/// quotient is not finite). How current scaling sets a scale from the
/// tensor's amax without the host reading it (on a cuda_context: one
/// device thread). `scale`, `amax`: one float each, may not alias.
/// Throws config_error for a null pointer, fp8_max not finite > 0, or
/// margin outside [0, 64].
/// Sources: Micikevicius et al. 2022, section 4; Transformer Engine's
/// _default_sf_compute (core/fp8_scale.hpp).
inline void fp8_update_scale(const host_context& ctx, float* scale, const float* amax,
                             float fp8_max, int margin) {
  (void)ctx;
  detail::check_fp8_pointer("fp8_update_scale", "scale", scale);
  detail::check_fp8_pointer("fp8_update_scale", "amax", amax);
  detail::check_fp8_update("fp8_update_scale", fp8_max, margin);
  *scale = fp8_scale_of(*amax, fp8_max, margin, *scale);
}

/// q[i] = F8(float(x[i]) * scale), rounded to nearest even, a finite value
/// saturated to +-F8::max_finite: the scaled cast. A non-finite x[i] stays
/// non-finite (NaN with its sign; an infinity is E5M2's infinity or E4M3's
/// NaN), so an overflow upstream is never cast into a finite value. The
/// GPU's cast gives the same bytes (kernels::detail::fp8_scaled_cast).
/// `scale` a finite float > 0. q must not alias x. Throws config_error for
/// n < 0 or a bad scale.
template <class F8, class T>
void fp8_quantize(const host_context& ctx, F8* q, const T* x, std::int64_t n, float scale) {
  (void)ctx;
  static_assert(is_fp8_v<F8>, "fp8_quantize: F8 must be fp8_e4m3 or fp8_e5m2");
  detail::check_fp8_cast("fp8_quantize", n, scale);
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < n; ++i) q[i] = detail::fp8_scaled_cast<F8>(x[i], scale);
}

/// fp8_quantize with the scale read from memory, as a kernel on a
/// cuda_context reads it from the device: q[i] = F8(float(x[i]) * *scale)
/// (the scaled cast above), and, when inv_scale is not null, *inv_scale =
/// 1.0f / *scale (what an FP8 GEMM multiplies by; cuBLASLt reads it through
/// its A/B scale pointers). q (n) of F8, x (n) of T; `scale`, `inv_scale`
/// one float each; q must not alias x, inv_scale must not alias scale.
/// The same bytes as the by-value form. Here the scale's value is on the
/// host and is checked (on a GPU it is not: kernels/cuda/kernels.hpp says
/// what a bad one gives). Throws config_error for n < 0, a null scale, or
/// a scale not finite > 0.
template <class F8, class T>
void fp8_quantize(const host_context& ctx, F8* q, float* inv_scale, const T* x, std::int64_t n,
                  const float* scale) {
  detail::check_fp8_pointer("fp8_quantize", "scale", scale);
  const float s = *scale;
  fp8_quantize(ctx, q, x, n, s);
  if (inv_scale != nullptr) *inv_scale = 1.0f / s;
}

/// The cast and transpose (Transformer Engine's cast_transpose): x (rows,
/// cols) row-major of T, qt (cols, rows) row-major of F8 with
/// qt[j * rows + i] = F8(float(x[i * cols + j]) * *scale), the scaled cast
/// of fp8_quantize. cuBLASLt's FP8 GEMMs take only the TN layout, so the
/// backward GEMMs need such transposed FP8 copies of x and dy. When
/// inv_scale is not null, *inv_scale = 1.0f / *scale (as fp8_quantize).
/// qt must not alias x. Throws config_error for rows or cols < 0, rows * cols past
/// 64 bits, a null scale, or a scale not finite > 0 (checked here, where
/// its value is on the host).
template <class F8, class T>
void fp8_quantize_transposed(const host_context& ctx, F8* qt, float* inv_scale, const T* x,
                             std::int64_t rows, std::int64_t cols, const float* scale) {
  (void)ctx;
  static_assert(is_fp8_v<F8>, "fp8_quantize_transposed: F8 must be fp8_e4m3 or fp8_e5m2");
  detail::check_fp8_matrix("fp8_quantize_transposed", rows, cols);
  detail::check_fp8_pointer("fp8_quantize_transposed", "scale", scale);
  const float s = *scale;
  detail::check_fp8_scale("fp8_quantize_transposed", s);
  // Tiles of 32 x 32, so both the reads and the writes stay in cache lines.
  constexpr std::int64_t tile = 32;
  const std::int64_t tiles_r = (rows + tile - 1) / tile, tiles_c = (cols + tile - 1) / tile;
#pragma omp parallel for schedule(static)
  for (std::int64_t t = 0; t < tiles_r * tiles_c; ++t) {
    const std::int64_t i0 = t / tiles_c * tile, j0 = t % tiles_c * tile;
    const std::int64_t i1 = std::min(rows, i0 + tile), j1 = std::min(cols, j0 + tile);
    for (std::int64_t j = j0; j < j1; ++j)
      for (std::int64_t i = i0; i < i1; ++i)
        qt[j * rows + i] = detail::fp8_scaled_cast<F8>(x[i * cols + j], s);
  }
  if (inv_scale != nullptr) *inv_scale = 1.0f / s;
}

/// out[i] = float(q[i]) * inverse_scale in float, then rounded to T (for
/// float: one rounding, none when inverse_scale is a power of two).
/// Throws config_error for n < 0.
template <class T, class F8>
void fp8_dequantize(const host_context& ctx, T* out, const F8* q, std::int64_t n,
                    float inverse_scale) {
  (void)ctx;
  static_assert(is_fp8_v<F8>, "fp8_dequantize: F8 must be fp8_e4m3 or fp8_e5m2");
  detail::check_fp8_size("fp8_dequantize", n);
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
