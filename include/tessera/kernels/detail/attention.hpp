#pragma once
/// \file detail/attention.hpp
/// Per-element arithmetic of tiled causal attention and of the merge of
/// blockwise results (ring attention), shared by the host loops
/// (kernels/attention.hpp, whose tile products are in
/// detail/attention_host.hpp) and the CUDA kernels. Every function is
/// TESSERA_HOST_DEVICE and nvcc-clean; `A` is the accumulation type
/// (accum_t<T>: float or double).
///
/// Source: FlashAttention-2 (Dao 2023), Algorithm 1 (forward, online softmax
/// of Milakov and Gimelshein 2018) and Algorithm 2 (backward); the merge of
/// blocks: Liu, Zaharia and Abbeel 2023, "Ring Attention with Blockwise
/// Transformers for Near-Infinite Context".

#include <cmath>
#include <cstdint>

#include "tessera/core/config.hpp"
#include "tessera/kernels/detail/exp.hpp"

namespace tessera::kernels {

/// Which keys each query of causal attention sees besides the causal bound:
/// the document mask of packed sequences (block-diagonal causal attention).
///
/// - `doc_start` (B, S) int32, row-major, or null: query t of batch row b
///   (global position q0 + t, attention_span) sees the keys at global
///   positions s with doc_start[b * S + t] <= s <= q0 + t. The values are
///   global positions, whatever block of keys a call is given. For a packed
///   window it is the position of the first token of the query's document
///   (data/documents.hpp); on one rank (q0 = 0) t - doc_start[b * S + t] is
///   then t's position in its document, which RoPE rotates by. Null: 0 for
///   every query, plain causal attention, the same bits as a kernel without
///   a mask.
/// - Precondition: nondecreasing in t within each row (documents are
///   contiguous; the kernels find the first and last key a tile needs from
///   its first and last query). A value above the query's position, or
///   after every key of the block, leaves the query nothing to attend to:
///   its output is 0 and its log-sum-exp -inf (never NaN), its gradients 0.
/// - A plain pointer the kernels read where they run: host memory for the
///   host context, device memory for the CUDA one.
struct attention_mask {
  const std::int32_t* doc_start = nullptr;  ///< (B, S) int32 or null
};

/// Where a call's query rows and key rows sit in the whole sequence: one
/// block of context-parallel (ring) attention, whose rank holds S queries
/// and is passed Sk keys at a time (Liu et al. 2023, "Ring Attention with
/// Blockwise Transformers"; under head-tail load balancing a rank calls once
/// per query chunk).
///
/// - Query row t is at global position q0 + t (t < S); key row s at
///   k0 + s (s < Sk). Key k0 + s is visible to query q0 + t iff
///   k0 + s <= q0 + t (causal, on global positions) and, with a document
///   mask, doc_start[t] <= k0 + s (attention_mask: global positions).
/// - `Sk`: the key/value rows of the call, k and v (B, Sk, nkv, hd); -1
///   (the default) means Sk = S.
/// - The default {0, 0, -1} is single-rank attention, with the bits the
///   kernels gave before spans existed. A block wholly in the future
///   (k0 > q0 + S - 1) writes out 0 and lse -inf; a block wholly in the past
///   (k0 + Sk - 1 <= q0) needs no causal mask.
/// - Preconditions (config_error otherwise, naming the value): q0 >= 0,
///   k0 >= 0, Sk >= 1 or Sk == -1.
struct attention_span {
  std::int64_t q0 = 0;   ///< global position of query row 0
  std::int64_t k0 = 0;   ///< global position of key/value row 0
  std::int64_t Sk = -1;  ///< key/value rows; -1: S
};

/// How attention_backward treats dq: written (`=`, the gradient contract of
/// a whole attention), or accumulated (`+=`) into an accum_t<T> buffer, a
/// key block's contribution added to the earlier blocks' (ring attention:
/// dq of a rank's queries is the sum over the key blocks it sees).
enum class attention_dq { write, accumulate };

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

/// How attention_merge_out combines an accumulator's output with a block's:
/// the merged log-sum-exp and the factors of the two sides.
template <class A>
struct attention_merge_factors {
  A lse;   ///< log(exp(lse_acc) + exp(lse_part))
  A acc;   ///< exp(lse_acc - lse), 0 for an empty accumulator
  A part;  ///< exp(lse_part - lse), 0 for an empty block
};

/// The merge of two partial softmax results over disjoint key sets, from
/// their log-sum-exps (FA-2's online softmax across blocks; Liu et al. 2023,
/// Ring Attention): lse = max + log1p(exp(-|lse_acc - lse_part|)), stable
/// for any difference. -inf (a side that saw no key) is exact: an empty
/// block gives {lse_acc, 1, 0}, an empty accumulator {lse_part, 0, 1}, both
/// {-inf, 0, 0}; never NaN.
template <class A>
TESSERA_HOST_DEVICE inline attention_merge_factors<A> attention_merge_lse(A lse_acc, A lse_part) {
  const A neg_inf = attention_neg_inf<A>();
  if (lse_part == neg_inf) return {lse_acc, lse_acc == neg_inf ? A(0) : A(1), A(0)};
  if (lse_acc == neg_inf) return {lse_part, A(0), A(1)};
  const A hi = lse_acc > lse_part ? lse_acc : lse_part;
  const A gap = lse_acc > lse_part ? lse_part - lse_acc : lse_acc - lse_part;  // -|difference|
  const A lse = hi + std::log1p(detail::exp(gap));
  return {lse, detail::exp(lse_acc - lse), detail::exp(lse_part - lse)};
}

/// One merged output element: out_acc * f.acc + out_part * f.part, the side
/// whose factor is 0 left out, so an empty block leaves the accumulator's
/// bits unchanged (x * 1 == x), an empty accumulator takes the block's, and
/// two empty sides give 0 whatever their outputs hold.
template <class A>
TESSERA_HOST_DEVICE inline A attention_merge_out(A out_acc, A out_part,
                                                 const attention_merge_factors<A>& f) {
  if (f.acc == A(0)) return f.part == A(0) ? A(0) : out_part * f.part;
  if (f.part == A(0)) return out_acc * f.acc;
  return out_acc * f.acc + out_part * f.part;
}

}  // namespace tessera::kernels::detail
