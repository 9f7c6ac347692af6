#pragma once
/// \file swiglu.hpp
/// SwiGLU gating, out = silu(gate) * up, host. Per-element arithmetic:
/// detail/swiglu.hpp. The two projections that produce gate and up, and the
/// one that consumes out, are GEMMs (gemm.hpp).
///
/// Gradient contract (llm.c): no parameters; the activation gradients dgate
/// and dup are written (`=`).

#include <cstdint>
#include <type_traits>

#include "tessera/core/error.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/kernels/context.hpp"
#include "tessera/kernels/detail/swiglu.hpp"

namespace tessera::kernels {

/// SwiGLU forward: out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)).
/// - `gate`, `up`, `out`: n elements of T in {float, double, bf16} (any
///   shape, e.g. (B*T, F)); arithmetic in accum_t<T>, a bf16 out rounded once.
///   `out` is written (=) and may alias `gate` or `up` (elementwise).
/// - Throws config_error for n < 0.
/// Source: Shazeer, "GLU Variants Improve Transformer", 2020, eq. 6.
template <class T>
void swiglu_forward(const host_context& ctx, T* out, const T* gate, const T* up, std::int64_t n) {
  using A = accum_t<T>;
  (void)ctx;
  TESSERA_THROW_IF(n < 0, config_error, "swiglu_forward: negative n=", n);
#pragma omp parallel for simd schedule(static)
  for (std::int64_t i = 0; i < n; ++i)
    out[i] = to<T>(detail::swiglu_out(to<A>(gate[i]), to<A>(up[i])));
}

/// SwiGLU backward: dgate = dout * up * silu'(gate), dup = dout * silu(gate),
/// silu'(g) = sigma(g) (1 + g (1 - sigma(g))).
/// - `dout`, `dgate`, `dup`: n elements of the activation-gradient type G
///   (accum_t<T>, or bf16 for 16-bit storage: a bf16 result rounded once);
///   `gate`, `up` of T.
/// - dgate and dup are written (=); they may alias dout (elementwise) but not
///   each other.
/// - Throws config_error for n < 0.
template <class T, class G>
void swiglu_backward(const host_context& ctx, G* dgate, G* dup, const G* dout, const T* gate,
                     const T* up, std::int64_t n) {
  using A = accum_t<T>;
  (void)ctx;
  static_assert(std::is_same_v<G, A> || (is_half_v<G> && !std::is_same_v<T, A>),
                "tessera::kernels::swiglu_backward: the activation-gradient type G must be "
                "accum_t<T> (double for double storage, float for float and bf16), or bf16 with "
                "16-bit storage");
  TESSERA_THROW_IF(n < 0, config_error, "swiglu_backward: negative n=", n);
#pragma omp parallel for simd schedule(static)
  for (std::int64_t i = 0; i < n; ++i) {
    A dg, du;
    detail::swiglu_grad(to<A>(dout[i]), to<A>(gate[i]), to<A>(up[i]), dg, du);
    dgate[i] = to<G>(dg);
    dup[i] = to<G>(du);
  }
}

}  // namespace tessera::kernels
