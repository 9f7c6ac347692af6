#pragma once
/// \file rmsnorm.hpp
/// RMSNorm forward and backward, host (Llama's norm: no mean subtraction, no
/// bias). Per-element arithmetic: detail/rmsnorm.hpp.
///
/// Gradient contract (llm.c): parameter gradients accumulate (`+=`: dweight),
/// activation gradients are written (`=`: dinp), unless `accumulate_dinp` is
/// set (then `+=`, for the residual stream).
///
/// Determinism: rows are independent (one thread per row, columns in order);
/// dweight is reduced over N by column blocks, each column summing rows in
/// increasing n, so every result is bit-for-bit the same for any thread count.

#include <cstdint>
#include <type_traits>

#include "tessera/core/error.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/kernels/context.hpp"
#include "tessera/kernels/detail/rmsnorm.hpp"

namespace tessera::kernels {

/// RMSNorm forward: rstd[n] = 1 / sqrt(mean_h(inp[n,h]^2) + eps),
/// out[n,h] = weight[h] * (inp[n,h] * rstd[n]).
/// - `inp` (N,H), `weight` (H), `out` (N,H) of T in {float, double, bf16};
///   `rstd` (N) in accum_t<T>, saved for the backward. Arithmetic in
///   accum_t<T>; a bf16 out is rounded once. `out` and `rstd` are written (=);
///   `out` may alias `inp` (each row is read fully before it is written).
/// - eps: added to the mean square (unitless; Llama uses 1e-5 or 1e-6).
/// - Throws config_error for N < 0, H <= 0 or eps < 0.
/// Source: Zhang and Sennrich, "Root Mean Square Layer Normalization", 2019.
template <class T>
void rmsnorm_forward(const host_context& ctx, T* out, accum_t<T>* rstd, const T* inp,
                     const T* weight, std::int64_t N, std::int64_t H, double eps) {
  (void)ctx;
  using A = accum_t<T>;
  TESSERA_THROW_IF(N < 0 || H <= 0, config_error, "rmsnorm_forward: bad sizes N=", N, " H=", H,
                   " (need N >= 0, H >= 1)");
  TESSERA_THROW_IF(!(eps >= 0), config_error, "rmsnorm_forward: eps=", eps, " must be >= 0");
  const A a_eps = static_cast<A>(eps), a_H = static_cast<A>(H);
#pragma omp parallel for schedule(static)
  for (std::int64_t n = 0; n < N; ++n) {
    const T* x = inp + n * H;
    T* y = out + n * H;
    A sum_sq = 0;
    for (std::int64_t h = 0; h < H; ++h) {
      const A v = to<A>(x[h]);
      sum_sq += v * v;
    }
    const A r = detail::rmsnorm_rstd(sum_sq, a_H, a_eps);
    rstd[n] = r;
    for (std::int64_t h = 0; h < H; ++h)
      y[h] = to<T>(detail::rmsnorm_out(to<A>(x[h]), to<A>(weight[h]), r));
  }
}

/// RMSNorm backward. With xhat = inp * rstd and dy = dout:
/// dinp[n,:] = rstd[n] * (weight * dy - xhat * mean_h(weight * dy * xhat)),
/// dweight[h] += sum_n dy[n,h] * xhat[n,h].
/// - `dout`, `dinp` (N,H) of GA, the activation-gradient type (accum_t<T>,
///   or bf16 for 16-bit storage: read and written through accum_t<T>, a
///   bf16 dinp rounded once); `dweight` (H) of G = accum_t<T>; `inp` (N,H),
///   `weight` (H) of T; `rstd` (N) as saved by rmsnorm_forward.
/// - dinp is written (=), or added to (+=) when `accumulate_dinp`; dweight
///   accumulates. `dinp` must not alias `dout` or `inp`.
/// - Deterministic, independent of the thread count.
/// - Throws config_error for N < 0 or H <= 0.
/// Source: derived from Zhang and Sennrich 2019, eq. 4 (llm.c's
/// layernorm_backward without the mean term).
template <class T, class GA, class G>
void rmsnorm_backward(const host_context& ctx, GA* dinp, G* dweight, const GA* dout, const T* inp,
                      const T* weight, const accum_t<T>* rstd, std::int64_t N, std::int64_t H,
                      bool accumulate_dinp = false) {
  using A = accum_t<T>;
  (void)ctx;
  static_assert(std::is_same_v<G, A>,
                "tessera::kernels::rmsnorm_backward: the parameter-gradient type G must be "
                "accum_t<T> (double for double storage, float for float and bf16)");
  static_assert(std::is_same_v<GA, A> || (is_half_v<GA> && !std::is_same_v<T, A>),
                "tessera::kernels::rmsnorm_backward: the activation-gradient type must be "
                "accum_t<T>, or 16-bit with 16-bit storage");
  TESSERA_THROW_IF(N < 0 || H <= 0, config_error, "rmsnorm_backward: bad sizes N=", N, " H=", H,
                   " (need N >= 0, H >= 1)");
  const A a_H = static_cast<A>(H);
  // dinp: one row per thread.
#pragma omp parallel for schedule(static)
  for (std::int64_t n = 0; n < N; ++n) {
    const T* x = inp + n * H;
    const GA* dy = dout + n * H;
    GA* dx = dinp + n * H;
    const A r = rstd[n];
    A dot = 0;  // sum_h w dy xhat
    for (std::int64_t h = 0; h < H; ++h)
      dot += to<A>(weight[h]) * to<A>(dy[h]) * (to<A>(x[h]) * r);
    const A mean = dot / a_H;
    for (std::int64_t h = 0; h < H; ++h) {
      const A g = detail::rmsnorm_dx(to<A>(dy[h]), to<A>(weight[h]), to<A>(x[h]) * r, r, mean);
      dx[h] = to<GA>(accumulate_dinp ? to<A>(dx[h]) + g : g);
    }
  }
  // dweight: column blocks, rows summed in order of n, added once.
  constexpr std::int64_t block = 64;
  const std::int64_t n_blocks = (H + block - 1) / block;
#pragma omp parallel for schedule(static)
  for (std::int64_t b = 0; b < n_blocks; ++b) {
    const std::int64_t h0 = b * block;
    const std::int64_t w = h0 + block < H ? block : H - h0;
    A acc[block] = {};
    for (std::int64_t n = 0; n < N; ++n) {
      const T* x = inp + n * H + h0;
      const GA* dy = dout + n * H + h0;
      const A r = rstd[n];
      for (std::int64_t j = 0; j < w; ++j) acc[j] += to<A>(dy[j]) * (to<A>(x[j]) * r);
    }
    for (std::int64_t j = 0; j < w; ++j) dweight[h0 + j] += acc[j];
  }
}

}  // namespace tessera::kernels
