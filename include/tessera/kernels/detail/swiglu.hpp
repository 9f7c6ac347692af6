#pragma once
/// \file detail/swiglu.hpp
/// Per-element SwiGLU arithmetic shared by the host loop and the CUDA kernel.
/// `A` is the accumulation type (float or double):
///   silu(g) = g / (1 + exp(-g)),  out = silu(g) * u
///   d out / d g = u * sigma(g) * (1 + g * (1 - sigma(g))),  d out / d u = silu(g)
/// Source: Shazeer, "GLU Variants Improve Transformer", 2020, eq. 6 (SwiGLU
/// with beta = 1, i.e. SiLU; Elfwing et al. 2017).

#include "tessera/core/config.hpp"
#include "tessera/kernels/detail/exp.hpp"

namespace tessera::kernels::detail {

/// e^x of the SiLU: on the host libm's value in a form that vectorises
/// (detail/exp.hpp); on the device CUDA's expf.
template <class A>
TESSERA_HOST_DEVICE inline A swiglu_exp(A x) {
  return detail::exp(x);
}

/// silu(g) = g / (1 + exp(-g)). For g -> -inf, exp overflows to inf and the
/// result is -0 (the limit); no NaN for finite g.
template <class A>
TESSERA_HOST_DEVICE inline A swiglu_silu(A g) {
  return g / (A(1) + swiglu_exp(-g));
}

/// out = silu(g) * u.
template <class A>
TESSERA_HOST_DEVICE inline A swiglu_out(A g, A u) {
  return swiglu_silu(g) * u;
}

/// Gradients of out = silu(g) * u given dy = dL/dout:
/// dg = dy * u * sigma * (1 + g (1 - sigma)), du = dy * silu(g).
template <class A>
TESSERA_HOST_DEVICE inline void swiglu_grad(A dy, A g, A u, A& dg, A& du) {
  const A sig = A(1) / (A(1) + swiglu_exp(-g));
  dg = dy * u * sig * (A(1) + g * (A(1) - sig));
  du = dy * swiglu_silu(g);
}

}  // namespace tessera::kernels::detail
