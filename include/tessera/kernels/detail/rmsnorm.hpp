#pragma once
/// \file detail/rmsnorm.hpp
/// Per-element RMSNorm arithmetic shared by the host loop and the CUDA kernel.
/// `A` is the accumulation type (float or double). With xhat = x * rstd:
///   forward   y = w * xhat,  rstd = 1 / sqrt(mean(x^2) + eps)
///   backward  dx = rstd * (w * dy - xhat * mean(w * dy * xhat)),
///             dw += dy * xhat
/// Source: Zhang and Sennrich, "Root Mean Square Layer Normalization", 2019,
/// eq. 4; the backward follows from it as in llm.c's layernorm_backward.

#include <math.h>

#include "tessera/core/config.hpp"

namespace tessera::kernels::detail {

TESSERA_HOST_DEVICE inline float rmsnorm_sqrt(float x) {
  return sqrtf(x);
}
TESSERA_HOST_DEVICE inline double rmsnorm_sqrt(double x) {
  return sqrt(x);
}

/// 1 / sqrt(sum_sq / H + eps): the saved reciprocal RMS of one row. Both the
/// division and the square root are correctly rounded on host and device.
template <class A>
TESSERA_HOST_DEVICE inline A rmsnorm_rstd(A sum_sq, A H, A eps) {
  return A(1) / rmsnorm_sqrt(sum_sq / H + eps);
}

/// y = w * (x * rstd).
template <class A>
TESSERA_HOST_DEVICE inline A rmsnorm_out(A x, A w, A rstd) {
  return w * (x * rstd);
}

/// dx = rstd * (w * dy - xhat * mean_wdy_xhat), mean_wdy_xhat = (1/H) sum_j w_j dy_j xhat_j.
template <class A>
TESSERA_HOST_DEVICE inline A rmsnorm_dx(A dy, A w, A xhat, A rstd, A mean_wdy_xhat) {
  return rstd * (w * dy - xhat * mean_wdy_xhat);
}

}  // namespace tessera::kernels::detail
