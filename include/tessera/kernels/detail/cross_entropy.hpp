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
#include "tessera/kernels/detail/exp.hpp"

namespace tessera::kernels::detail {

/// exp(z - row_max): the unnormalised softmax term of a logit, in (0, 1].
template <class A>
TESSERA_HOST_DEVICE inline A ce_exp(A z, A row_max) {
  return detail::exp(z - row_max);
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

/// Running (max, sum of exp(z - max)) of a stream of logits: the online
/// softmax normaliser (Milakov and Gimelshein, "Online normalizer calculation
/// for softmax", 2018, algorithm 3). The GPU kernel keeps one per thread and
/// merges them with ce_online_combine; the host loop takes the max first
/// and does not use these. The empty state is {-inf, 0}.
template <class A>
struct ce_online {
  A max;
  A sum;
};

/// Adds logit z to the running state: when z is a new maximum the sum is
/// rescaled to it (exp(old_max - z) <= 1), otherwise exp(z - max) is added.
/// A NaN logit makes the sum NaN (it is never a new maximum).
template <class A>
TESSERA_HOST_DEVICE inline ce_online<A> ce_online_update(ce_online<A> s, A z) {
  if (z > s.max) return {z, s.sum * ce_exp(s.max, z) + A(1)};
  if (s.sum == A(0) && z == s.max) return s;  // -inf into an empty state adds exp(-inf) = 0
  return {s.max, s.sum + ce_exp(z, s.max)};
}

/// Merges two running states (associative and commutative up to rounding).
/// An empty side (sum 0, max -inf) contributes nothing, so two empty sides
/// give an empty state instead of exp(-inf - -inf) = NaN.
template <class A>
TESSERA_HOST_DEVICE inline ce_online<A> ce_online_combine(ce_online<A> a, ce_online<A> b) {
  if (a.sum == A(0)) return b;
  if (b.sum == A(0)) return a;
  const A m = a.max > b.max ? a.max : b.max;
  return {m, a.sum * ce_exp(a.max, m) + b.sum * ce_exp(b.max, m)};
}

}  // namespace tessera::kernels::detail
