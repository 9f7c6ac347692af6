#pragma once
/// \file rope.hpp
/// Rotary position embedding (RoPE), Llama "rotate half" convention, host.
/// Per-pair arithmetic: detail/rope.hpp.
///
/// Gradient contract (llm.c): RoPE has no parameters; the activation gradient
/// is written in place (`rope_backward` overwrites dx with dL/dx).
///
/// Layout: x is (B, T, nh, hd), row-major; in head vector x[b,t,h,:] the pair
/// i is (x[i], x[i + hd/2]) rotated by angle t * f_i, f_i = theta^(-2i/hd)
/// (or a scaled set of inverse frequencies, nn/rope_scaling.hpp). The
/// position of token t is t, or what a rope_positions (detail/rope.hpp)
/// says: its position in its packed document, its global position on a
/// context-parallel rank. Tables are (rows, hd/2) of the precision policy's
/// rope_type (float32, or float64 for the float64 policy), one row per
/// position.

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/kernels/context.hpp"
#include "tessera/kernels/detail/rope.hpp"

namespace tessera::kernels {

namespace detail {
inline void check_rope_sizes(const char* who, std::int64_t B, std::int64_t T, std::int64_t nh,
                             std::int64_t hd) {
  TESSERA_THROW_IF(B < 0 || T < 0 || nh < 0, config_error, who, ": negative size B=", B, " T=", T,
                   " nh=", nh);
  TESSERA_THROW_IF(hd <= 0 || hd % 2 != 0, config_error, who, ": head dim hd=", hd,
                   " must be positive and even (RoPE rotates pairs)");
}
}  // namespace detail

/// Fills the RoPE tables cos(t * f_i), sin(t * f_i) for t in [0, T), i in
/// [0, hd/2), from the inverse frequencies f_i given.
/// - `cos`, `sin`: (T, hd/2) of R in {float, double}, written (=).
/// - `inv_freq`: (hd/2) inverse frequencies in radians per position, double
///   (detail::rope_inv_freq's theta^(-2i/hd), or a scaled set such as Llama
///   3's: nn/rope_scaling.hpp).
/// - Angles and their cos/sin are computed in double and rounded once to
///   R, so float tables are accurate to 2^-24 even at position 8191 and
///   beyond (Hugging Face's float32 angle t * inv_freq is not).
/// - Host memory (the tables are made once, then copied to a device: both
///   backends read the same tables).
/// - Throws config_error for T < 0, hd odd or <= 0, or an inverse frequency
///   that is not finite and positive (naming i and the value).
/// Source: Su et al., "RoFormer", 2021, eq. 15 (theta_i = 10000^(-2(i-1)/d)).
template <class R>
void rope_table(R* cos, R* sin, std::int64_t T, std::int64_t hd, const double* inv_freq) {
  static_assert(std::is_same_v<R, float> || std::is_same_v<R, double>,
                "tessera::kernels::rope_table: tables are float or double");
  detail::check_rope_sizes("rope_table", 0, T, 0, hd);
  const std::int64_t half = hd / 2;
  for (std::int64_t i = 0; i < half; ++i)
    TESSERA_THROW_IF(!(inv_freq[i] > 0 && std::isfinite(inv_freq[i])), config_error,
                     "rope_table: inverse frequency ", i, " is ", inv_freq[i],
                     ", not finite and positive");
#pragma omp parallel for schedule(static)
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(t) * inv_freq[i];
      cos[t * half + i] = static_cast<R>(std::cos(angle));
      sin[t * half + i] = static_cast<R>(std::sin(angle));
    }
  }
}

/// The unscaled tables: rope_table with f_i = theta^(-2i/hd)
/// (detail::rope_inv_freq).
/// - theta: the RoPE base (Llama 2: 10000, Llama 3: 500000).
/// - Throws config_error for T < 0, hd odd or <= 0, or theta <= 0.
template <class R>
void rope_table(R* cos, R* sin, std::int64_t T, std::int64_t hd, double theta) {
  detail::check_rope_sizes("rope_table", 0, T, 0, hd);
  TESSERA_THROW_IF(!(theta > 0), config_error, "rope_table: theta=", theta, " must be > 0");
  std::vector<double> inv_freq(static_cast<std::size_t>(hd / 2));
  for (std::int64_t i = 0; i < hd / 2; ++i)
    inv_freq[static_cast<std::size_t>(i)] = detail::rope_inv_freq(i, hd, theta);
  rope_table(cos, sin, T, hd, inv_freq.data());
}

/// Applies RoPE in place: for each (b, t, h), pair i of x[b,t,h,:] becomes
/// (x1 cos - x2 sin, x2 cos + x1 sin) with cos = cos[p, i], sin = sin[p, i]
/// at token t's position p.
/// - `x` (B, T, nh, hd) of Storage in {float, double, bf16}; arithmetic in
///   accum_t<Storage>, a bf16 result rounded once. `cos`, `sin` (rows, hd/2)
///   of R from rope_table, a row for every position the call rotates by (a
///   float table in a float64 model caps its accuracy at float32's: the
///   policy's rope_type decides).
/// - `positions`: token t of row b is rotated by
///   detail::rope_position(positions, b T + t, T): by default t; from a
///   doc_start (B, T) int32 pointer (the document mask,
///   kernels::attention_mask) its position in its document,
///   t - doc_start[b T + t]; from rope_positions::of(shard, doc_start) on a
///   context-parallel rank (T = shard.tokens()) its global position
///   cp_shard::position(t), less its document's global start. Each token
///   is rotated by the table row of its position, so a rank's tokens get
///   the bits the whole sequence's tokens at those positions get.
/// - Throws config_error for a negative size, hd odd or <= 0, or positions
///   with split outside [0, T] or a negative offset.
/// Source: Su et al. 2021, eq. 34, in the rotate-half pairing of Llama.
template <class Storage, class R>
void rope_forward(const host_context& ctx, Storage* x, const R* cos, const R* sin, std::int64_t B,
                  std::int64_t T, std::int64_t nh, std::int64_t hd, rope_positions positions = {}) {
  using A = accum_t<Storage>;
  (void)ctx;
  detail::check_rope_sizes("rope_forward", B, T, nh, hd);
  detail::check_rope_positions("rope_forward", positions, T);
  const std::int64_t half = hd / 2;
#pragma omp parallel for schedule(static)
  for (std::int64_t bt = 0; bt < B * T; ++bt) {
    const std::int64_t p = detail::rope_position(positions, bt, T);  // its table row
    const R* c = cos + p * half;
    const R* s = sin + p * half;
    for (std::int64_t h = 0; h < nh; ++h) {
      Storage* v = x + (bt * nh + h) * hd;
      for (std::int64_t i = 0; i < half; ++i) {
        A y1, y2;
        detail::rope_rotate(to<A>(v[i]), to<A>(v[i + half]), static_cast<A>(c[i]),
                            static_cast<A>(s[i]), y1, y2);
        v[i] = to<Storage>(y1);
        v[i + half] = to<Storage>(y2);
      }
    }
  }
}

/// RoPE backward, in place: dx (B, T, nh, hd) holds dL/dy on entry and
/// dL/dx on return (the transpose rotation: dx1 = dy1 cos + dy2 sin,
/// dx2 = dy2 cos - dy1 sin). G in {float, double, bf16}, the
/// activation-gradient type; arithmetic in accum_t<G> (a bf16 result
/// rounded once). Same tables, positions and throws as rope_forward.
template <class G, class R>
void rope_backward(const host_context& ctx, G* dx, const R* cos, const R* sin, std::int64_t B,
                   std::int64_t T, std::int64_t nh, std::int64_t hd,
                   rope_positions positions = {}) {
  using A = accum_t<G>;
  (void)ctx;
  static_assert(std::is_same_v<G, float> || std::is_same_v<G, double> || is_half_v<G>,
                "tessera::kernels::rope_backward: G must be float, double, bf16 or fp16");
  detail::check_rope_sizes("rope_backward", B, T, nh, hd);
  detail::check_rope_positions("rope_backward", positions, T);
  const std::int64_t half = hd / 2;
#pragma omp parallel for schedule(static)
  for (std::int64_t bt = 0; bt < B * T; ++bt) {
    const std::int64_t p = detail::rope_position(positions, bt, T);  // its table row
    const R* c = cos + p * half;
    const R* s = sin + p * half;
    for (std::int64_t h = 0; h < nh; ++h) {
      G* v = dx + (bt * nh + h) * hd;
      for (std::int64_t i = 0; i < half; ++i) {
        A d1, d2;
        detail::rope_rotate_transpose(to<A>(v[i]), to<A>(v[i + half]), static_cast<A>(c[i]),
                                      static_cast<A>(s[i]), d1, d2);
        v[i] = to<G>(d1);
        v[i + half] = to<G>(d2);
      }
    }
  }
}

}  // namespace tessera::kernels
