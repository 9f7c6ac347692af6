#pragma once
/// \file detail/cross_entropy.hpp
/// Per-element arithmetic of the softmax cross-entropy over the vocabulary,
/// shared by the host loop (kernels/cross_entropy.hpp) and the CUDA kernels.
/// `A` is the accumulation type (accum_t<T>: float or double). nvcc-clean.
///
/// Source: the fused classifier of llm.c (`fused_classifier_kernel`) and
/// Liger-kernel's fused linear cross-entropy: loss = logsumexp(z) - z[y],
/// dz = (softmax(z) - onehot(y)) * scale, computed with the row max
/// subtracted so exp never overflows.

#include <cmath>

#include "tessera/core/config.hpp"

namespace tessera::kernels::detail {

/// exp(z - row_max): the unnormalised softmax term of a logit, in (0, 1].
template <class A>
TESSERA_HOST_DEVICE inline A ce_exp(A z, A row_max) {
  return std::exp(z - row_max);
}

/// -log softmax(z)[y] = row_max + log(sum_exp) - z[y], where
/// sum_exp = sum_v exp(z[v] - row_max) >= 1.
template <class A>
TESSERA_HOST_DEVICE inline A ce_row_loss(A row_max, A sum_exp, A target_logit) {
  return row_max + std::log(sum_exp) - target_logit;
}

/// Gradient of the row loss with respect to one logit, times `scale`:
/// (softmax - onehot) * scale, with softmax = e * inv_sum and e = ce_exp(z, max).
template <class A>
TESSERA_HOST_DEVICE inline A ce_dlogit(A e, A inv_sum, bool is_target, A scale) {
  return (e * inv_sum - (is_target ? A(1) : A(0))) * scale;
}

}  // namespace tessera::kernels::detail
