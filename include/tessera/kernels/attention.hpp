#pragma once
/// \file attention.hpp
/// Causal self-attention with grouped-query heads on the host, tiled with an
/// online softmax (FlashAttention-2): the S x S score matrix is never built;
/// each thread works on one Bq x Bk tile at a time. The same kernels run one
/// block of context-parallel (ring) attention: S queries against Sk keys at
/// arbitrary global offsets (attention_span), whose partial results
/// attention_merge combines by their log-sum-exps.
///
/// Gradient contract (llm.c): activation gradients are written (`=`):
/// attention_backward writes dq, dk and dv. Attention has no parameters. A
/// ring's block backward may instead accumulate dq (`+=`, attention_dq),
/// the sum over the key blocks a rank's queries see; dk and dv are always
/// written, the block's own.
///
/// Layout: row-major, q and out (B, S, nh, hd), k and v (B, Sk, nkv, hd)
/// (Sk = S but for a ring's blocks), lse (B, nh, S). S is the sequence
/// length (DESIGN.md's "T (or S)"; the name T is taken by the storage
/// type). Query head h reads key/value head h / (nh / nkv).
///
/// Determinism: every output element is reduced by one thread in a fixed
/// order that does not depend on the schedule, so results are bit-for-bit
/// reproducible and independent of the OpenMP thread count.
///
/// Source: Tri Dao, "FlashAttention-2: Faster Attention with Better
/// Parallelism and Work Partitioning", 2023, Algorithm 1 (forward) and
/// Algorithm 2 (backward); Liu, Zaharia and Abbeel, "Ring Attention with
/// Blockwise Transformers for Near-Infinite Context", 2023 (blocks and their
/// merge). The arithmetic shared with the CUDA kernels is in
/// kernels/detail/attention.hpp.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "tessera/core/backend.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/memory.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/core/tensor.hpp"
#include "tessera/kernels/context.hpp"
#include "tessera/kernels/detail/attention.hpp"
#include "tessera/kernels/detail/attention_host.hpp"

namespace tessera::kernels {

namespace detail {

inline void attention_check_sizes(const char* fn, std::int64_t B, std::int64_t S, std::int64_t nh,
                                  std::int64_t nkv, std::int64_t hd, attention_tiles tiles) {
  TESSERA_THROW_IF(B <= 0 || S <= 0 || nh <= 0 || nkv <= 0 || hd <= 0, config_error, fn,
                   ": every size must be >= 1, got B=", B, " S=", S, " nh=", nh, " nkv=", nkv,
                   " hd=", hd);
  TESSERA_THROW_IF(nh % nkv != 0, config_error, fn, ": nkv=", nkv, " does not divide nh=", nh,
                   " (grouped-query attention needs nh to be a multiple of nkv)");
  TESSERA_THROW_IF(tiles.q <= 0 || tiles.k <= 0, config_error, fn,
                   ": attention tile sizes must be >= 1, got q=", tiles.q, " k=", tiles.k);
}

/// The key/value rows of `span` for S query rows (span.Sk, or S for -1),
/// after checking it; throws config_error naming the value.
inline std::int64_t attention_key_rows(const char* fn, std::int64_t S, attention_span span) {
  TESSERA_THROW_IF(span.q0 < 0 || span.k0 < 0, config_error, fn,
                   ": attention_span offsets must be >= 0, got q0=", span.q0, " k0=", span.k0);
  TESSERA_THROW_IF(span.Sk == 0 || span.Sk < -1, config_error, fn, ": attention_span Sk=", span.Sk,
                   " must be >= 1 (key/value rows), or -1 for Sk = S");
  return span.Sk == -1 ? S : span.Sk;
}

}  // namespace detail

/// Throws config_error, naming the values, when the attention kernels of
/// `ctx` cannot run nh query heads over nkv key/value heads of size hd on
/// sequences of up to S tokens (host: every size >= 1, nkv dividing nh,
/// tiles >= 1). The model checks its shape with it at construction, before
/// it allocates; the CUDA overload (kernels/cuda/ops.hpp) adds the GPU
/// kernels' limits.
inline void attention_check_shape(const host_context& ctx, std::int64_t S, std::int64_t nh,
                                  std::int64_t nkv, std::int64_t hd) {
  detail::attention_check_sizes("attention", 1, S, nh, nkv, hd, ctx.tiles);
}

/// The key/value rows of a ring block's `span` (attention_span) for S query
/// rows, span.Sk or S for -1, after checking that the kernels of `ctx` take
/// it: throws config_error, naming the value, for an offset < 0 or Sk < 1
/// other than -1 (host). The CUDA overload (kernels/cuda/ops.hpp) adds the
/// GPU kernels' limits (global positions below 2^30, Sk within the grid).
/// Context parallelism checks every span its ring will run with it before
/// any traffic.
inline std::int64_t attention_check_span(const host_context&, std::int64_t S, attention_span span) {
  return detail::attention_key_rows("attention", S, span);
}

namespace detail {

/// Problems with fewer score-times-hd terms than this (B nh S Sk hd) run on the
/// calling thread: an OpenMP parallel region costs microseconds (far more on
/// a loaded machine, where the team's barrier spins), more than such a
/// problem's work. The result does not depend on it.
inline constexpr double attention_parallel_min_work = double(1 << 17);

inline bool attention_parallel(std::int64_t B, std::int64_t S, std::int64_t Sk, std::int64_t nh,
                               std::int64_t hd) {
  return static_cast<double>(B) * static_cast<double>(nh) * static_cast<double>(S) *
             static_cast<double>(Sk) * static_cast<double>(hd) >=
         attention_parallel_min_work;
}

inline int attention_max_threads() {
#if defined(_OPENMP)
  return omp_get_max_threads();
#else
  return 1;
#endif
}

inline int attention_thread_id() {
#if defined(_OPENMP)
  return omp_get_thread_num();
#else
  return 0;
#endif
}

/// Per-thread scratch of attention_forward over S query rows and Sk key rows
/// (Sk = S but for a ring's blocks), in elements of the accumulation type: Q
/// and the O accumulator (Bq, hd), K^T (hd, ldk), V (Bk, hd), the scores
/// (Bq, ldk), the running max and sum (Bq); Bq the query tile clamped to S,
/// Bk the key tile clamped to Sk, ldk = Bk rounded up to attention_lanes.
/// The planner counts it.
inline std::int64_t attention_forward_tile_elements(attention_tiles tiles, std::int64_t S,
                                                    std::int64_t Sk, std::int64_t hd) {
  const std::int64_t Bq = std::min(tiles.q, S), Bk = std::min(tiles.k, Sk);
  const std::int64_t ldk = attention_padded(Bk);
  return 2 * Bq * hd + hd * ldk + Bk * hd + Bq * ldk + 2 * Bq;
}

/// Per-thread scratch of attention_backward over S query rows and Sk key
/// rows, in elements of the accumulation type: Q and dO (Bq, hd), K^T and
/// V^T (hd, ldk), K, dK, dV (Bk, hd), P and dS (Bq, ldk); Bq, Bk, ldk as
/// attention_forward_tile_elements. The planner counts it.
inline std::int64_t attention_backward_tile_elements(attention_tiles tiles, std::int64_t S,
                                                     std::int64_t Sk, std::int64_t hd) {
  const std::int64_t Bq = std::min(tiles.q, S), Bk = std::min(tiles.k, Sk);
  const std::int64_t ldk = attention_padded(Bk);
  return 2 * Bq * hd + 2 * hd * ldk + 3 * Bk * hd + 2 * Bq * ldk;
}

/// Copies `rows` rows of length hd, `stride` elements apart, from `src` into
/// the dense tile `dst` (rows x hd), converting to the accumulation type.
template <class A, class U>
inline void attention_load_tile(A* dst, const U* src, std::int64_t rows, std::int64_t stride,
                                std::int64_t hd) {
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t d = 0; d < hd; ++d) dst[r * hd + d] = to<A>(src[r * stride + d]);
}

/// Copies `rows` rows of length hd, `stride` elements apart, from `src` into
/// the transposed tile `dst` (hd x ld, row d holds element d of every row),
/// converting to the accumulation type.
template <class A, class U>
inline void attention_load_tile_transposed(A* dst, std::int64_t ld, const U* src, std::int64_t rows,
                                           std::int64_t stride, std::int64_t hd) {
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t d = 0; d < hd; ++d) dst[d * ld + r] = to<A>(src[r * stride + d]);
}

}  // namespace detail

/// Causal self-attention forward: out = softmax(q k^T / sqrt(hd) + mask) v,
/// per batch row b and query head h, with key/value head h / (nh / nkv); the
/// mask is causal, and with `mask.doc_start` also confined to each query's
/// document (attention_mask: block-diagonal causal attention over packed
/// documents). With a `span`, one block of ring attention: the S queries at
/// global positions span.q0 .. against the Sk keys at span.k0 ..
///
/// - `out` (B, S, nh, hd), O: written. O is T, or accum_t<T> for a ring's
///   partial output, which attention_merge combines unrounded.
/// - `lse` (B, nh, S), accum_t<T>: written; natural-log log-sum-exp of each row's
///   scaled scores (what attention_backward needs besides q, k, v, out).
/// - `q` (B, S, nh, hd); `k`, `v` (B, Sk, nkv, hd); T in {float, double, bf16}.
/// - Arithmetic in accum_t<T>; a bf16 output is rounded once, at the store.
/// - Scratch: one tile set per OpenMP thread, attention_forward_tile_elements
///   of accum_t<T>, allocated once per call from `ctx.mr`; no O(S Sk) memory.
///   Tiles: `ctx.tiles`; the tile products are register-blocked
///   (detail/attention_host.hpp) without changing any summation order.
/// - `mask`: attention_mask, host memory, doc_start holding global key
///   positions. Key tiles wholly before a query tile's first key, or wholly
///   after its last query, are skipped; within a tile the masked scores get
///   probability 0. A query with nothing to attend to (in this block) gets
///   out 0 and lse -inf, never NaN: a block wholly in the future writes
///   only those. Without a document mask (the default) the results are the
///   bits of plain causal attention.
/// - `span`: attention_span; the default {0, 0, -1} is single-rank
///   attention (Sk = S), with the same tile grid, summation orders and bits
///   as before spans existed. Key tiles start at multiples of the key tile
///   from key row 0 whatever the offsets, so every query sees every key
///   tile of a block wholly in its past.
/// - Parallel over (b, h, query tile); deterministic, thread-count independent.
/// - Aliasing: out and lse must not overlap the inputs.
/// - Throws config_error (before any write) if a size is <= 0, nkv does not
///   divide nh, a tile size is <= 0, or the span is invalid (an offset < 0,
///   Sk < 1 other than -1); tessera::error if `mr` cannot allocate.
/// - Source: FlashAttention-2 (Dao 2023), Algorithm 1; ring blocks: Liu et
///   al. 2023.
template <class T, class O = T>
void attention_forward(const host_context& ctx, O* out, accum_t<T>* lse, const T* q, const T* k,
                       const T* v, std::int64_t B, std::int64_t S, std::int64_t nh,
                       std::int64_t nkv, std::int64_t hd, attention_mask mask = {},
                       attention_span span = {}) {
  using A = accum_t<T>;
  static_assert(std::is_same_v<O, T> || std::is_same_v<O, A>,
                "attention_forward: the output type O must be the storage type T, or accum_t<T> "
                "(a ring block's partial output, for attention_merge)");
  const attention_tiles tiles = ctx.tiles;
  memory_resource& mr = ctx.resource();
  detail::attention_check_sizes("attention_forward", B, S, nh, nkv, hd, tiles);
  const std::int64_t Sk = detail::attention_key_rows("attention_forward", S, span);
  const std::int64_t delta = span.q0 - span.k0;  // query row t sees key rows s <= t + delta
  const std::int64_t Bq = std::min(tiles.q, S), Bk = std::min(tiles.k, Sk);
  const std::int64_t nqt = (S + Bq - 1) / Bq;
  const std::int64_t qstride = nh * hd, kstride = nkv * hd;  // elements between rows t, t+1
  const A scale = A(1) / std::sqrt(static_cast<A>(hd));
  const bool parallel = detail::attention_parallel(B, S, Sk, nh, hd);

  const std::int64_t ldk = detail::attention_padded(Bk);  // K^T and P columns, padded
  const std::int64_t per_thread = detail::attention_forward_tile_elements(tiles, S, Sk, hd);
  tensor<A> scratch(shape{detail::attention_max_threads() * per_thread}, mr);
  A* const ws_base = scratch.data();
  // The score kernel reads the padding columns of K^T (and V^T): finite values.
  std::fill(ws_base, ws_base + scratch.numel(), A(0));

  const std::int64_t items = B * nh * nqt;
#pragma omp parallel for schedule(dynamic, 1) if (parallel)
  for (std::int64_t it = 0; it < items; ++it) {
    // Longest query tiles (the last ones, under the causal mask) first.
    const std::int64_t iq = nqt - 1 - it % nqt;
    const std::int64_t h = (it / nqt) % nh;
    const std::int64_t b = it / (nqt * nh);
    const std::int64_t g = detail::attention_kv_head(h, nh, nkv);
    const std::int64_t t0 = iq * Bq, t1 = std::min(t0 + Bq, S), nq = t1 - t0;

    // Per-thread tiles: Q (Bq, hd), O accumulator (Bq, hd), K^T (hd, ldk),
    // V (Bk, hd), P (Bq, ldk), running max m and sum l (Bq).
    A* ws = ws_base + detail::attention_thread_id() * per_thread;
    A* Qt = ws;
    A* Ot = Qt + Bq * hd;
    A* KT = Ot + Bq * hd;
    A* Vt = KT + hd * ldk;
    A* Pt = Vt + Bk * hd;
    A* m = Pt + Bq * ldk;
    A* l = m + Bq;

    const T* qb = q + (b * S * nh + h) * hd;  // row t at qb + t * qstride
    const T* kb = k + (b * Sk * nkv + g) * hd;
    const T* vb = v + (b * Sk * nkv + g) * hd;
    detail::attention_load_tile(Qt, qb + t0 * qstride, nq, qstride, hd);
    for (std::int64_t r = 0; r < nq; ++r) {
      m[r] = detail::attention_neg_inf<A>();
      l[r] = 0;
    }
    std::fill(Ot, Ot + nq * hd, A(0));

    // Key tiles that hold at least one key s <= t1 - 1 + delta (the last
    // row's causal bound) at or after the tile's first key (its first
    // row's: doc_start is nondecreasing); none for a tile wholly before the
    // block's keys.
    const std::int32_t* ds = mask.doc_start;
    const std::int64_t first =
        std::max<std::int64_t>(0, detail::attention_first_key(ds, b, S, t0) - span.k0);
    const std::int64_t s_end = std::min(Sk, t1 + delta);
    for (std::int64_t s0 = first / Bk * Bk; s0 < s_end; s0 += Bk) {
      const std::int64_t nk = std::min(s0 + Bk, s_end) - s0;
      detail::attention_load_tile_transposed(KT, ldk, kb + s0 * kstride, nk, kstride, hd);
      detail::attention_load_tile(Vt, vb + s0 * kstride, nk, kstride, hd);
      // Rows from r0 on see at least one key of the tile (causal: s <= t + delta).
      const std::int64_t r0 = std::max<std::int64_t>(0, s0 - t0 - delta);
      const std::int64_t diag = t0 + r0 + delta - s0, rows = nq - r0;
      detail::attention_tile_scores(Pt + r0 * ldk, ldk, Qt + r0 * hd, KT, ldk, rows, nk, hd);
      for (std::int64_t r = r0; r < nq; ++r) {
        // The row sees the tile's keys [lo, ne); those before lo get p = 0.
        const std::int64_t ne = detail::attention_row_keys(r - r0, diag, nk);
        const std::int64_t lo = std::clamp<std::int64_t>(
            detail::attention_first_key(ds, b, S, t0 + r) - span.k0 - s0, 0, ne);
        A* p = Pt + r * ldk;
        A mx = detail::attention_neg_inf<A>();
        TESSERA_SIMD_MAX(mx)
        for (std::int64_t c = lo; c < ne; ++c) {
          p[c] *= scale;
          mx = std::max(mx, p[c]);
        }
        const A alpha = detail::online_softmax_rescale(m[r], mx);
        const A m_r = m[r];
        for (std::int64_t c = 0; c < lo; ++c) p[c] = 0;
        TESSERA_SIMD
        for (std::int64_t c = lo; c < ne; ++c) p[c] = detail::attention_prob(p[c], m_r);
        A rowsum = 0;
        for (std::int64_t c = lo; c < ne; ++c) rowsum += p[c];  // in order: not vectorised
        l[r] = l[r] * alpha + rowsum;
        A* o = Ot + r * hd;
        TESSERA_SIMD
        for (std::int64_t d = 0; d < hd; ++d) o[d] *= alpha;
      }
      // O += P V, each row over its keys in order.
      detail::attention_tile_rows_acc(Ot + r0 * hd, hd, Pt + r0 * ldk, ldk, Vt, rows, diag, nk,
                                      hd);
    }

    O* ob = out + (b * S * nh + h) * hd;
    A* lse_b = lse + (b * nh + h) * S;
    for (std::int64_t r = 0; r < nq; ++r) {
      const A inv = detail::attention_inv_sum(l[r]);  // 0 for a row that saw no key
      for (std::int64_t d = 0; d < hd; ++d)
        ob[(t0 + r) * qstride + d] = to<O>(Ot[r * hd + d] * inv);
      lse_b[t0 + r] = detail::attention_lse(m[r], l[r]);
    }
  }
}

/// Causal self-attention backward, recomputing the probabilities tile by tile
/// from `lse` (the S x Sk matrix is never stored). With a `span`, one block
/// of ring attention: given the rank's queries, one key/value block, dout
/// and the FINAL (merged over every block) out and lse, the block's
/// contribution to dq and the block's dk, dv.
///
/// - `dq` (B, S, nh, hd), G: written (`=`, the default `dq_mode`), or with
///   attention_dq::accumulate the block's contribution added (`+=`) to what
///   it holds; accumulating needs G = accum_t<T>, so that a ring sums its
///   blocks unrounded.
/// - `dk`, `dv` (B, Sk, nkv, hd), G: written (`=`), this block's, summed
///   over the nh / nkv query heads that share a key/value head (a ring sums
///   a key block's dk, dv over the ranks that saw it).
/// - `dout` (B, S, nh, hd), G: gradient of the loss with respect to `out`.
/// - `q` (B, S, nh, hd), `k`, `v` (B, Sk, nkv, hd), `out`, `lse`: as given to
///   and returned by attention_forward (same sizes and tiles not required:
///   any tiles give the same function); for a block, `out` (T) and `lse`
///   are the final ones, after attention_merge of every block.
/// - G is accum_t<T> (double for double, float otherwise), or bf16 with
///   16-bit storage (read and written through accum_t<T>, rounded once).
/// - One pass after D = rowsum(dout * out), parallel over (b, kv head): for
///   each key tile in order, each query head of the group and each query
///   row at or after the tile, the scores and probabilities are computed
///   once and feed dV += P^T dO, dK += dS^T Q and dQ += dS K (FA-2's
///   backward with the query loop inside, so no dQ atomics: each (b, kv
///   head) owns the dQ rows of its query heads). Every output element is
///   summed by one thread in a fixed order (dK, dV over heads, query tiles,
///   rows; dQ over key tiles, then keys, after the value it held when
///   accumulating): deterministic and thread-count independent.
/// - Scratch from `ctx.mr`: D, B nh S elements of accum_t<T>; per OpenMP
///   thread attention_backward_tile_elements; with bf16 G, the float dQ
///   accumulator, B S nh hd elements. No O(S Sk) memory.
/// - `mask`, `span`: the attention_mask and attention_span given to
///   attention_forward. Query tiles wholly after a key tile's document
///   ends, or wholly before its first key, are skipped; masked pairs get
///   P = dS = 0. The defaults give the bits of plain causal attention.
/// - Aliasing: the outputs must not overlap each other or the inputs.
/// - Throws config_error (before any write) on the same conditions as
///   attention_forward, or when accumulating into a dq that is not
///   accum_t<T>; tessera::error if `mr` cannot allocate.
/// - Source: FlashAttention-2 (Dao 2023), Algorithm 2; ring blocks: Liu et
///   al. 2023.
template <class T, class G>
void attention_backward(const host_context& ctx, G* dq, G* dk, G* dv, const G* dout, const T* q,
                        const T* k, const T* v, const T* out, const accum_t<T>* lse, std::int64_t B,
                        std::int64_t S, std::int64_t nh, std::int64_t nkv, std::int64_t hd,
                        attention_mask mask = {}, attention_span span = {},
                        attention_dq dq_mode = attention_dq::write) {
  using A = accum_t<T>;
  const attention_tiles tiles = ctx.tiles;
  memory_resource& mr = ctx.resource();
  static_assert(std::is_same_v<G, A> || (is_half_v<G> && is_half_v<T>),
                "attention_backward: the activation-gradient type G must be accum_t<T> (double "
                "for double storage, float for float and bf16), or 16-bit with 16-bit storage");
  detail::attention_check_sizes("attention_backward", B, S, nh, nkv, hd, tiles);
  const std::int64_t Sk = detail::attention_key_rows("attention_backward", S, span);
  // dQ is accumulated in place, in A: the output itself, or a float copy for bf16.
  constexpr bool wide_dq = !std::is_same_v<G, A>;
  const bool accumulate = dq_mode == attention_dq::accumulate;
  TESSERA_THROW_IF(accumulate && wide_dq, config_error,
                   "attention_backward: attention_dq::accumulate needs dq in accum_t<T> (G = float "
                   "for 16-bit storage), got a 16-bit G: a ring's dq would be rounded per block");
  const std::int64_t delta = span.q0 - span.k0;  // query row t sees key rows s <= t + delta
  const std::int64_t Bq = std::min(tiles.q, S), Bk = std::min(tiles.k, Sk);
  const std::int64_t nqt = (S + Bq - 1) / Bq, nkt = (Sk + Bk - 1) / Bk;
  const std::int64_t group = nh / nkv;
  const std::int64_t qstride = nh * hd, kstride = nkv * hd;
  const A scale = A(1) / std::sqrt(static_cast<A>(hd));
  const bool parallel = detail::attention_parallel(B, S, Sk, nh, hd);

  // D[b, h, t] = sum_d dout[b, t, h, d] * out[b, t, h, d]  (FA-2 Algorithm 2, line 4).
  tensor<A> Dbuf(shape{B * nh * S}, mr);
  A* const D = Dbuf.data();
#pragma omp parallel for schedule(static) if (parallel)
  for (std::int64_t row = 0; row < B * nh * S; ++row) {
    const std::int64_t t = row % S, h = (row / S) % nh, b = row / (S * nh);
    const std::int64_t off = ((b * S + t) * nh + h) * hd;
    A s = 0;
    for (std::int64_t d = 0; d < hd; ++d) s += to<A>(dout[off + d]) * to<A>(out[off + d]);
    D[row] = s;
  }

  const std::int64_t ldk = detail::attention_padded(Bk);
  const std::int64_t per_thread = detail::attention_backward_tile_elements(tiles, S, Sk, hd);
  tensor<A> scratch(shape{detail::attention_max_threads() * per_thread}, mr);
  A* const ws_base = scratch.data();
  // The score kernel reads the padding columns of K^T (and V^T): finite values.
  std::fill(ws_base, ws_base + scratch.numel(), A(0));
  tensor<A> dq_acc(shape{wide_dq ? B * S * nh * hd : 0}, mr);
  A* const dqa = wide_dq ? dq_acc.data() : reinterpret_cast<A*>(dq);

  const std::int64_t items = B * nkv;
#pragma omp parallel for schedule(dynamic, 1) if (parallel)
  for (std::int64_t it = 0; it < items; ++it) {
    const std::int64_t g = it % nkv, b = it / nkv;
    // Per-thread tiles: Q, dO (Bq, hd); K^T, V^T (hd, ldk); K, dK, dV (Bk, hd);
    // P and dS (Bq, ldk).
    A* ws = ws_base + detail::attention_thread_id() * per_thread;
    A* Qt = ws;
    A* dOt = Qt + Bq * hd;
    A* KT = dOt + Bq * hd;
    A* VT = KT + hd * ldk;
    A* Kt = VT + hd * ldk;
    A* dKt = Kt + Bk * hd;
    A* dVt = dKt + Bk * hd;
    A* Pt = dVt + Bk * hd;
    A* dSt = Pt + Bq * ldk;

    const T* kb = k + (b * Sk * nkv + g) * hd;
    const T* vb = v + (b * Sk * nkv + g) * hd;
    if (!accumulate)
      for (std::int64_t h = g * group; h < (g + 1) * group; ++h) {
        A* dqb = dqa + (b * S * nh + h) * hd;
        for (std::int64_t t = 0; t < S; ++t)
          std::fill(dqb + t * qstride, dqb + t * qstride + hd, A(0));
      }
    for (std::int64_t ik = 0; ik < nkt; ++ik) {
      const std::int64_t s0 = ik * Bk, nk = std::min(s0 + Bk, Sk) - s0;
      detail::attention_load_tile_transposed(KT, ldk, kb + s0 * kstride, nk, kstride, hd);
      detail::attention_load_tile_transposed(VT, ldk, vb + s0 * kstride, nk, kstride, hd);
      detail::attention_load_tile(Kt, kb + s0 * kstride, nk, kstride, hd);
      std::fill(dKt, dKt + nk * hd, A(0));
      std::fill(dVt, dVt + nk * hd, A(0));
      // The first query row that sees the tile's first key (causal:
      // s0 <= t + delta), and its query tile; nqt when no row does (a key
      // tile wholly in the queries' future).
      const std::int64_t t_first = std::max<std::int64_t>(0, s0 - delta);
      const std::int64_t iq_first = t_first < S ? t_first / Bq : nqt;

      for (std::int64_t h = g * group; h < (g + 1) * group; ++h) {
        const T* qb = q + (b * S * nh + h) * hd;
        const G* dob = dout + (b * S * nh + h) * hd;
        A* dqb = dqa + (b * S * nh + h) * hd;
        const A* lse_b = lse + (b * nh + h) * S;
        const A* D_b = D + (b * nh + h) * S;
        // Query tiles holding a row t >= t_first; of each, the rows from
        // t = u0 on; none once the first row's document starts after the
        // key tile (doc_start is nondecreasing: neither do the later rows'
        // documents).
        for (std::int64_t iq = iq_first; iq < nqt; ++iq) {
          const std::int64_t u0 = std::max(iq * Bq, t_first), rows = std::min(iq * Bq + Bq, S) - u0;
          if (detail::attention_first_key(mask.doc_start, b, S, u0) - span.k0 >= s0 + nk) break;
          const std::int64_t diag = u0 + delta - s0;  // row i sees keys c <= i + diag
          detail::attention_load_tile(Qt, qb + u0 * qstride, rows, qstride, hd);
          detail::attention_load_tile(dOt, dob + u0 * qstride, rows, qstride, hd);
          detail::attention_tile_scores(Pt, ldk, Qt, KT, ldk, rows, nk, hd);    // q_t . k_s
          detail::attention_tile_scores(dSt, ldk, dOt, VT, ldk, rows, nk, hd);  // dP = dO_t . v_s
          // Each row's probabilities (into P) and scaled score gradients
          // (into dS, over dP), vectorised.
          // The keys [lo, ne) row i sees; P = dS = 0 before lo.
          for (std::int64_t i = 0; i < rows; ++i) {
            const std::int64_t ne = detail::attention_row_keys(i, diag, nk);
            const std::int64_t lo = std::clamp<std::int64_t>(
                detail::attention_first_key(mask.doc_start, b, S, u0 + i) - span.k0 - s0, 0, ne);
            const A lse_t = lse_b[u0 + i], D_t = D_b[u0 + i];
            A* p = Pt + i * ldk;
            A* ds = dSt + i * ldk;
            for (std::int64_t c = 0; c < lo; ++c) p[c] = ds[c] = 0;
            TESSERA_SIMD
            for (std::int64_t c = lo; c < ne; ++c) {
              const A pc = detail::attention_prob(scale * p[c], lse_t);
              ds[c] = scale * detail::attention_dscore(pc, ds[c], D_t);
              p[c] = pc;
            }
          }
          detail::attention_tile_cols_acc(dVt, Pt, ldk, dOt, rows, diag, nk, hd);   // dV += P^T dO
          detail::attention_tile_cols_acc(dKt, dSt, ldk, Qt, rows, diag, nk, hd);   // dK += dS^T Q
          detail::attention_tile_rows_acc(dqb + u0 * qstride, qstride, dSt, ldk, Kt, rows, diag,
                                          nk, hd);                                   // dQ += dS K
        }
      }

      G* dkb = dk + (b * Sk * nkv + g) * hd;
      G* dvb = dv + (b * Sk * nkv + g) * hd;
      for (std::int64_t c = 0; c < nk; ++c)
        for (std::int64_t d = 0; d < hd; ++d) {
          dkb[(s0 + c) * kstride + d] = to<G>(dKt[c * hd + d]);
          dvb[(s0 + c) * kstride + d] = to<G>(dVt[c * hd + d]);
        }
    }
    if constexpr (wide_dq) {
      for (std::int64_t h = g * group; h < (g + 1) * group; ++h) {
        const A* src = dqa + (b * S * nh + h) * hd;
        G* dst = dq + (b * S * nh + h) * hd;
        for (std::int64_t t = 0; t < S; ++t)
          for (std::int64_t d = 0; d < hd; ++d) dst[t * qstride + d] = to<G>(src[t * qstride + d]);
      }
    }
  }
}

/// Merges one block's partial attention into a running accumulator (ring
/// attention's combine step, FA-2's online softmax across blocks): per row,
/// lse = log(exp(lse_acc) + exp(lse_part)) computed stably (max + log1p),
/// out = out_acc exp(lse_acc - lse) + out_part exp(lse_part - lse)
/// (detail::attention_merge_lse, attention_merge_out, shared with CUDA).
///
/// - `out_acc` (B, S, nh, hd), `lse_acc` (B, nh, S), A: read and written in
///   place. Start from the first block's forward, or from out 0 and lse
///   -inf (merging into that gives the block's bits).
/// - `out_part` (B, S, nh, hd), `lse_part` (B, nh, S), A: one block's
///   attention_forward with O = A (unrounded).
/// - A is float or double (accum_t of the storage type). -inf is exact: a
///   row whose block saw no key (lse_part -inf) keeps the accumulator's
///   bits; two empty rows give out 0, lse -inf; never NaN.
/// - Merging blocks in a fixed order gives the same bits every run; another
///   order agrees to rounding (the merge is commutative, associative up to
///   rounding).
/// - Parallel over rows; thread-count independent. `out_part`, `lse_part`
///   must not overlap the accumulator.
/// - Throws config_error (before any write) if a size is <= 0.
/// - Source: Liu, Zaharia and Abbeel 2023, "Ring Attention with Blockwise
///   Transformers"; FlashAttention-2 (Dao 2023), Algorithm 1, lines 8-13.
template <class A>
void attention_merge(const host_context& ctx, A* out_acc, A* lse_acc, const A* out_part,
                     const A* lse_part, std::int64_t B, std::int64_t S, std::int64_t nh,
                     std::int64_t hd) {
  static_assert(std::is_same_v<A, float> || std::is_same_v<A, double>,
                "attention_merge: the accumulator type is accum_t of the storage type (float or "
                "double): attention_forward's out with O = accum_t<T>, and its lse");
  TESSERA_THROW_IF(B <= 0 || S <= 0 || nh <= 0 || hd <= 0, config_error,
                   "attention_merge: every size must be >= 1, got B=", B, " S=", S, " nh=", nh,
                   " hd=", hd);
  (void)ctx;  // threads: the calling thread's OpenMP setting
  const std::int64_t rows = B * S * nh;
  const bool parallel =
      static_cast<double>(rows) * static_cast<double>(hd) >= detail::attention_parallel_min_work;
#pragma omp parallel for schedule(static) if (parallel)
  for (std::int64_t row = 0; row < rows; ++row) {
    const std::int64_t h = row % nh, t = (row / nh) % S, b = row / (nh * S);
    A& lse = lse_acc[(b * nh + h) * S + t];
    const detail::attention_merge_factors<A> f =
        detail::attention_merge_lse(lse, lse_part[(b * nh + h) * S + t]);
    A* o = out_acc + row * hd;
    const A* op = out_part + row * hd;
    for (std::int64_t d = 0; d < hd; ++d) o[d] = detail::attention_merge_out(o[d], op[d], f);
    lse = f.lse;
  }
}

}  // namespace tessera::kernels
