#pragma once
/// \file detail/attention.hpp
/// Per-element arithmetic of tiled causal attention, shared by the host loops
/// (kernels/attention.hpp, whose tile products are in
/// detail/attention_host.hpp) and the CUDA kernels. Every function is
/// TESSERA_HOST_DEVICE and nvcc-clean; `A` is the accumulation type
/// (accum_t<T>: float or double).
///
/// Source: FlashAttention-2 (Dao 2023), Algorithm 1 (forward, online softmax
/// of Milakov and Gimelshein 2018) and Algorithm 2 (backward).

#include <cmath>
#include <cstdint>

#include "tessera/core/config.hpp"
#include "tessera/kernels/detail/exp.hpp"

namespace tessera::kernels {

/// Which keys each query of causal attention sees besides the causal bound:
/// the document mask of packed sequences (block-diagonal causal attention).
///
/// - `doc_start` (B, S) int32, row-major, or null: query t of batch row b
///   sees the keys s with doc_start[b * S + t] <= s <= t, in the key
///   positions of the same row (0 .. S-1). For a packed window it is the
///   position of the first token of t's document (data/documents.hpp);
///   t - doc_start[b * S + t] is then t's position in its document, which
///   RoPE rotates by. Null: 0 for every query, plain causal attention, the
///   same bits as a kernel without a mask.
/// - Precondition: nondecreasing in t within each row (documents are
///   contiguous; the kernels find the first and last key a tile needs from
///   its first and last query). A value above t leaves the query nothing to
///   attend to: its output is 0 and its log-sum-exp -inf (never NaN), its
///   gradients 0.
/// - A plain pointer the kernels read where they run: host memory for the
///   host context, device memory for the CUDA one.
struct attention_mask {
  const std::int32_t* doc_start = nullptr;  ///< (B, S) int32 or null
};

}  // namespace tessera::kernels

namespace tessera::kernels::detail {

/// First key query t of batch row b sees under the document mask
/// `doc_start` ((B, S) int32, attention_mask), or 0 without one.
TESSERA_HOST_DEVICE inline std::int64_t attention_first_key(const std::int32_t* doc_start,
                                                            std::int64_t b, std::int64_t S,
                                                            std::int64_t t) {
  return doc_start == nullptr ? 0 : static_cast<std::int64_t>(doc_start[b * S + t]);
}

/// 1 / l for a row's softmax sum l, or 0 for a row that saw no key (l = 0):
/// its output is then 0, not 0 * inf = NaN.
template <class A>
TESSERA_HOST_DEVICE inline A attention_inv_sum(A l) {
  return l > A(0) ? A(1) / l : A(0);
}

/// -infinity in `A`: the running max of a row before it has seen a score.
template <class A>
TESSERA_HOST_DEVICE inline A attention_neg_inf() {
  return static_cast<A>(-INFINITY);
}

/// Key/value head used by query head `h` when `nh` query heads share `nkv`
/// key/value heads (grouped-query attention; nkv divides nh).
TESSERA_HOST_DEVICE inline std::int64_t attention_kv_head(std::int64_t h, std::int64_t nh,
                                                          std::int64_t nkv) {
  return h / (nh / nkv);
}

/// Online-softmax step (FA-2 Algorithm 1, line 8): raises the running max `m`
/// of a row to include `tile_max` and returns the factor exp(m_old - m_new)
/// by which the running sum and output accumulator must be rescaled.
/// Returns 1 while the row has seen nothing but -inf.
template <class A>
TESSERA_HOST_DEVICE inline A online_softmax_rescale(A& m, A tile_max) {
  const A m_new = m > tile_max ? m : tile_max;
  if (m_new == attention_neg_inf<A>()) return A(1);
  const A alpha = detail::exp(m - m_new);  // exp(-inf) == 0 on the first tile
  m = m_new;
  return alpha;
}

/// Unnormalised probability of a scaled score `s` under running max `m`,
/// or the normalised probability when `m` is the row's log-sum-exp
/// (FA-2 Algorithm 2, line 11: P = exp(S - L)).
template <class A>
TESSERA_HOST_DEVICE inline A attention_prob(A s, A m) {
  return detail::exp(s - m);
}

/// Log-sum-exp of a row from its running max and sum (FA-2 Algorithm 1, line 13).
template <class A>
TESSERA_HOST_DEVICE inline A attention_lse(A m, A l) {
  return m + std::log(l);
}

/// Gradient of a (scaled) score: dS = P * (dP - D), D = rowsum(dO * O)
/// (FA-2 Algorithm 2, line 14; softmax backward).
template <class A>
TESSERA_HOST_DEVICE inline A attention_dscore(A p, A dp, A d_row) {
  return p * (dp - d_row);
}

}  // namespace tessera::kernels::detail
