#pragma once
/// \file cross_entropy.hpp
/// The LM head fused with the next-token cross-entropy, in chunks of tokens,
/// so that the full (B*S, V) logits never exist: per chunk the logits, the
/// softmax, the loss, the logit gradient and the two GEMMs of the backward
/// run on a (chunk, V) scratch block, and the block is reused.
///
/// Gradient contract (llm.c): the parameter gradient dwlm accumulates (`+=`),
/// the activation gradient dx is written (`=`).
///
/// Layout: row-major. x (N, H) with N = B T token rows, wlm (V, H)
/// (PyTorch's nn.Linear(H, V) weight), targets (N): what each row predicts
/// (the next token of its window).
///
/// Source: llm.c's fused classifier (`fused_classifier_kernel`, train_gpt2.cu)
/// and Liger-kernel's fused linear cross-entropy (chunking over tokens). The
/// per-element arithmetic is in kernels/detail/cross_entropy.hpp.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "tessera/core/backend.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/memory.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/core/tensor.hpp"
#include "tessera/kernels/context.hpp"
#include "tessera/kernels/detail/cross_entropy.hpp"
#include "tessera/kernels/gemm.hpp"

namespace tessera::kernels {

/// Elements of the bf16 -> float conversion block of wlm (rows of H): 2^18
/// floats, 1 MiB. Only bf16 storage converts; float and double pass wlm to
/// the BLAS as it is.
inline constexpr std::int64_t ce_wlm_block_elems = std::int64_t{1} << 18;

/// Loops over fewer elements than this run on the calling thread: an OpenMP
/// parallel region costs microseconds (far more on a loaded machine, where
/// the team's barrier spins), more than the work of a small chunk. The
/// result does not depend on it (one thread per row either way).
inline constexpr std::int64_t ce_parallel_min_elems = std::int64_t{1} << 15;

/// LM head + softmax cross-entropy over the next token, fused and chunked.
///
/// - `x` (N, H), T: final-normed hidden states (N = B S token rows).
///   `wlm` (V, H), T.
/// - `targets` (N), int32: row n is scored against targets[n] unless it
///   equals `ignore_index`.
/// - `*loss_sum` (one double in the context's memory) is written: the sum
///   over scored rows of -log softmax(x wlm^T)[n, target]; the loss is
///   accumulated per row in accum_t<T> and summed in double in row order.
///   The caller divides by the global count of scored tokens (all
///   micro-batches and ranks of the step), so the mean is over the global
///   batch.
/// - If `dx` != nullptr (training), `dwlm` must be non-null too:
///   `dx` (N, H), GA: written, grad_scale * d(loss_sum)/dx; rows of ignored
///   positions are exactly 0. `dwlm` (V, H), G: accumulated (+=),
///   grad_scale * d(loss_sum)/dwlm. Both null: forward only (evaluation).
/// - G must be accum_t<T> (double for double, float for float and bf16); GA
///   accum_t<T>, or 16-bit with 16-bit storage (rounded once from accum_t<T>).
/// - `chunk` >= 1 token rows per step. Scratch from `ctx.mr`: chunk*V
///   elements of accum_t<T> (the logits block, overwritten by its gradient)
///   + chunk doubles; for bf16 also chunk*H floats (x converted) and
///   min(V, ce_wlm_block_elems/H)*H floats (a block of wlm converted), and
///   with bf16 GA chunk*H floats of dx. Independent of N.
/// - GEMMs via kernels::gemm (CBLAS), from serial code; softmax rows in
///   parallel, one thread per row. Deterministic for a fixed thread count.
/// - Throws config_error before any write if a size or `chunk` is < 1, if only
///   one of dx and dwlm is given, or if a target other than ignore_index lies
///   outside [0, V) (naming the value, the row and V); tessera::error if
///   `ctx.mr` cannot allocate.
/// - Aliasing: dx and dwlm must not overlap each other or the inputs.
/// - Source: llm.c fused classifier; Liger-kernel fused linear cross-entropy.
template <class T, class GA, class G>
void lm_head_cross_entropy(const host_context& ctx, double* loss_sum, const T* x, const T* wlm,
                           const std::int32_t* targets, std::int64_t N, std::int64_t V,
                           std::int64_t H, std::int32_t ignore_index, accum_t<T> grad_scale,
                           GA* dx, G* dwlm, std::int64_t chunk) {
  using A = accum_t<T>;
  static_assert(std::is_same_v<G, A>,
                "lm_head_cross_entropy: the parameter-gradient type G must be accum_t<T> (double "
                "for double storage, float for float and bf16)");
  static_assert(std::is_same_v<GA, A> || (is_half_v<GA> && is_half_v<T>),
                "lm_head_cross_entropy: the activation-gradient type must be accum_t<T>, or bf16 "
                "with 16-bit storage");
  constexpr bool convert = !std::is_same_v<T, A>;  // bf16: convert blocks to float for the BLAS
  constexpr bool narrow_dx = !std::is_same_v<GA, A>;
  memory_resource& mr = ctx.resource();

  TESSERA_THROW_IF(N <= 0 || H <= 0 || V <= 0, config_error,
                   "lm_head_cross_entropy: every size must be >= 1, got N=", N, " H=", H, " V=", V);
  TESSERA_THROW_IF(chunk <= 0, config_error, "lm_head_cross_entropy: chunk=", chunk,
                   " must be >= 1 token rows");
  TESSERA_THROW_IF((dx == nullptr) != (dwlm == nullptr), config_error,
                   "lm_head_cross_entropy: pass both dx and dwlm (training) or neither "
                   "(evaluation); got dx ",
                   dx ? "set" : "null", ", dwlm ", dwlm ? "set" : "null");
  TESSERA_THROW_IF(loss_sum == nullptr, config_error, "lm_head_cross_entropy: loss_sum is null");
  const bool grad = dx != nullptr;
  auto target_of = [&](std::int64_t row) { return targets[row]; };

  for (std::int64_t row = 0; row < N; ++row) {
    const std::int32_t y = target_of(row);
    if (y == ignore_index) continue;
    TESSERA_THROW_IF(y < 0 || y >= V, config_error, "lm_head_cross_entropy: target token ", y,
                     " at row ", row, " is outside the vocabulary [0, V=", V,
                     "); use ignore_index=", ignore_index, " to skip a position");
  }
  double res_loss = 0;

  const std::int64_t C = std::min(chunk, N);
  tensor<A> logits_buf(shape{C * V}, mr);  // (C, V) logits, then their gradient
  tensor<double> loss_buf(shape{C}, mr);   // per-row loss of the chunk
  A* const L = logits_buf.data();
  double* const row_loss = loss_buf.data();
  const std::int64_t Vb =
      convert ? std::min(V, std::max<std::int64_t>(1, ce_wlm_block_elems / H)) : V;
  tensor<A> xbuf, wbuf, dxbuf;
  if constexpr (convert) {
    xbuf = tensor<A>(shape{C * H}, mr);
    wbuf = tensor<A>(shape{Vb * H}, mr);
  }
  if constexpr (narrow_dx)
    if (grad) dxbuf = tensor<A>(shape{C * H}, mr);
  // Converts rows [v0, v0 + vb) of wlm into wbuf (bf16 only).
  auto convert_wlm_block = [&](std::int64_t v0, std::int64_t vb) {
    A* w = wbuf.data();
#pragma omp parallel for schedule(static) if (vb * H >= ce_parallel_min_elems)
    for (std::int64_t i = 0; i < vb * H; ++i) w[i] = to<A>(wlm[v0 * H + i]);
  };

  for (std::int64_t r0 = 0; r0 < N; r0 += C) {
    const std::int64_t c = std::min(C, N - r0);
    std::int64_t chunk_scored = 0;
    for (std::int64_t i = 0; i < c; ++i) chunk_scored += target_of(r0 + i) != ignore_index;
    if (chunk_scored == 0) {  // nothing to score: dx rows are 0, dwlm unchanged
      if (grad) std::fill(dx + r0 * H, dx + (r0 + c) * H, to<GA>(0.0));
      continue;
    }

    // x chunk (c, H) in A.
    const A* xa = nullptr;
    if constexpr (convert) {
      A* xc = xbuf.data();
      const T* xs = x + r0 * H;
#pragma omp parallel for schedule(static) if (c * H >= ce_parallel_min_elems)
      for (std::int64_t i = 0; i < c * H; ++i) xc[i] = to<A>(xs[i]);
      xa = xc;
    } else {
      xa = x + r0 * H;
    }

    // logits (c, V) = x_chunk (c, H) * wlm (V, H)^T
    if constexpr (convert) {
      for (std::int64_t v0 = 0; v0 < V; v0 += Vb) {
        const std::int64_t vb = std::min(Vb, V - v0);
        convert_wlm_block(v0, vb);
        gemm<A>(transpose::no, transpose::yes, c, vb, H, A(1), xa, H, wbuf.data(), H, A(0), L + v0,
                V);
      }
    } else {
      gemm<A>(transpose::no, transpose::yes, c, V, H, A(1), xa, H, wlm, H, A(0), L, V);
    }

    // Softmax, loss and (training) dlogits = (softmax - onehot) * grad_scale, row by row.
#pragma omp parallel for schedule(static) if (c * V >= ce_parallel_min_elems)
    for (std::int64_t i = 0; i < c; ++i) {
      A* z = L + i * V;
      const std::int32_t y = target_of(r0 + i);
      if (y == ignore_index) {
        row_loss[i] = 0;
        if (grad) std::fill(z, z + V, A(0));
        continue;
      }
      A mx = z[0];
      TESSERA_SIMD_MAX(mx)
      for (std::int64_t v = 1; v < V; ++v) mx = std::max(mx, z[v]);
      const A zy = z[y];
      TESSERA_SIMD
      for (std::int64_t v = 0; v < V; ++v) z[v] = detail::ce_exp(z[v], mx);
      A sum = 0;
      for (std::int64_t v = 0; v < V; ++v) sum += z[v];  // in order: not vectorised
      row_loss[i] = static_cast<double>(detail::ce_row_loss(mx, sum, zy));
      if (grad) {
        const A inv = A(1) / sum;
        TESSERA_SIMD
        for (std::int64_t v = 0; v < V; ++v)
          z[v] = detail::ce_dlogit(z[v], inv, v == y, grad_scale);
      }
    }
    for (std::int64_t i = 0; i < c; ++i) res_loss += row_loss[i];  // fixed order
    if (!grad) continue;

    // dx_chunk (c, H) = dlogits (c, V) * wlm (V, H);  dwlm (V, H) += dlogits^T * x_chunk.
    A* dxc = nullptr;
    if constexpr (narrow_dx)
      dxc = dxbuf.data();
    else
      dxc = dx + r0 * H;
    if constexpr (convert) {
      for (std::int64_t v0 = 0; v0 < V; v0 += Vb) {
        const std::int64_t vb = std::min(Vb, V - v0);
        convert_wlm_block(v0, vb);
        gemm<A>(transpose::no, transpose::no, c, H, vb, A(1), L + v0, V, wbuf.data(), H,
                v0 == 0 ? A(0) : A(1), dxc, H);
        gemm<A>(transpose::yes, transpose::no, vb, H, c, A(1), L + v0, V, xa, H, A(1),
                dwlm + v0 * H, H);
      }
    } else {
      gemm<A>(transpose::no, transpose::no, c, H, V, A(1), L, V, wlm, H, A(0), dxc, H);
      gemm<A>(transpose::yes, transpose::no, V, H, c, A(1), L, V, xa, H, A(1), dwlm, H);
    }
    // Ignored rows: exactly zero, whatever the BLAS made of 0 * wlm.
    for (std::int64_t i = 0; i < c; ++i)
      if (target_of(r0 + i) == ignore_index) std::fill(dxc + i * H, dxc + (i + 1) * H, A(0));
    if constexpr (narrow_dx) {
      GA* out = dx + r0 * H;
#pragma omp parallel for schedule(static) if (c * H >= ce_parallel_min_elems)
      for (std::int64_t i = 0; i < c * H; ++i) out[i] = to<GA>(dxc[i]);
    }
  }
  *loss_sum = res_loss;
}

/// The vocabulary-parallel form of lm_head_cross_entropy (Megatron-LM's
/// parallel cross-entropy): this rank holds rows [v_begin, v_begin + Vl) of
/// the LM head, a slice of the vocabulary padded to a multiple of the tp
/// group (rows at or beyond V are padding), and never sees the other
/// slices' logits. Per chunk of rows it computes its logits, and `reduce`
/// combines over the group (every rank calls it in the same order): the
/// row maxima (max), then the rows' sums of exp(z - max) with the target
/// logits (sum; the rank owning a target contributes it, the others 0).
/// Every rank then has each row's loss; padding never enters the softmax
/// and gets no gradient; an ignored target contributes nothing, as on one
/// rank.
/// - `wlm` (Vl, H) this rank's rows; `dwlm` (Vl, H) accumulates their
///   gradient; `dx` (N, H) is written with this rank's partial sum of
///   d(loss)/dx (all_reduce it over the group).
/// - `reduce(bool max, accum_t<T>* values, std::int64_t n)`: in-place
///   all-reduce over the group, max or sum.
/// - `*loss_sum`, grad_scale, chunk, ignore_index, the types and the throws
///   as lm_head_cross_entropy; also config_error for a slice outside
///   [0, V + Vl) or Vl < 1. Targets are checked against V.
template <class T, class GA, class G, class Reduce>
void lm_head_cross_entropy_vocab_parallel(const host_context& ctx, double* loss_sum, const T* x,
                                          const T* wlm, const std::int32_t* targets,
                                          std::int64_t N, std::int64_t V, std::int64_t v_begin,
                                          std::int64_t Vl, std::int64_t H,
                                          std::int32_t ignore_index, accum_t<T> grad_scale,
                                          GA* dx, G* dwlm, std::int64_t chunk, Reduce&& reduce) {
  using A = accum_t<T>;
  static_assert(std::is_same_v<G, A>, "lm_head_cross_entropy_vocab_parallel: G must be accum_t<T>");
  static_assert(std::is_same_v<GA, A> || (is_half_v<GA> && is_half_v<T>),
                "lm_head_cross_entropy_vocab_parallel: the activation-gradient type must be "
                "accum_t<T>, or 16-bit with 16-bit storage");
  constexpr bool convert = !std::is_same_v<T, A>;
  constexpr bool narrow_dx = !std::is_same_v<GA, A>;
  memory_resource& mr = ctx.resource();
  TESSERA_THROW_IF(N <= 0 || H <= 0 || V <= 0 || Vl <= 0, config_error,
                   "lm_head_cross_entropy_vocab_parallel: every size must be >= 1, got N=", N,
                   " H=", H, " V=", V, " Vl=", Vl);
  TESSERA_THROW_IF(v_begin < 0 || v_begin >= V + Vl, config_error,
                   "lm_head_cross_entropy_vocab_parallel: slice [", v_begin, ", ", v_begin + Vl,
                   ") is outside the padded vocabulary of V=", V);
  TESSERA_THROW_IF(chunk <= 0, config_error, "lm_head_cross_entropy_vocab_parallel: chunk=",
                   chunk, " must be >= 1 token rows");
  TESSERA_THROW_IF((dx == nullptr) != (dwlm == nullptr), config_error,
                   "lm_head_cross_entropy_vocab_parallel: pass both dx and dwlm or neither");
  for (std::int64_t row = 0; row < N; ++row) {
    const std::int32_t y = targets[row];
    TESSERA_THROW_IF(y != ignore_index && (y < 0 || y >= V), config_error,
                     "lm_head_cross_entropy: target token ", y, " at row ", row,
                     " is outside the vocabulary [0, V=", V, "); use ignore_index=", ignore_index,
                     " to skip a position");
  }
  const bool grad = dx != nullptr;
  const std::int64_t real = std::max<std::int64_t>(0, std::min(Vl, V - v_begin));  // not padding
  const std::int64_t C = std::min(chunk, N);
  tensor<A> logits_buf(shape{C * Vl}, mr);  // (C, Vl) logits, then their gradient
  tensor<A> stats(shape{3 * C}, mr);        // max, then sum of exps and target logit
  tensor<A> xbuf, wbuf, dxbuf;
  if constexpr (convert) {
    xbuf = tensor<A>(shape{C * H}, mr);
    wbuf = tensor<A>(shape{Vl * H}, mr);
    A* w = wbuf.data();
    for (std::int64_t i = 0; i < Vl * H; ++i) w[i] = to<A>(wlm[i]);
  }
  if constexpr (narrow_dx)
    if (grad) dxbuf = tensor<A>(shape{C * H}, mr);
  const A* wa = nullptr;
  if constexpr (convert)
    wa = wbuf.data();
  else
    wa = wlm;
  A* const L = logits_buf.data();
  A* const mx = stats.data();
  A* const se = mx + C;  // se[0, c): sums of exps; se[c, 2c): target logits
  double res_loss = 0;
  for (std::int64_t r0 = 0; r0 < N; r0 += C) {
    const std::int64_t c = std::min(C, N - r0);
    // Every chunk reduces, even one whose targets are all ignored: the same
    // collectives on every backend (the device cannot look at the targets
    // without a sync) and in plan::plan_tp_bytes.
    const A* xa = nullptr;
    if constexpr (convert) {
      A* xc = xbuf.data();
      for (std::int64_t i = 0; i < c * H; ++i) xc[i] = to<A>(x[r0 * H + i]);
      xa = xc;
    } else {
      xa = x + r0 * H;
    }
    gemm<A>(transpose::no, transpose::yes, c, Vl, H, A(1), xa, H, wa, H, A(0), L, Vl);
    const A neg_inf = -std::numeric_limits<A>::infinity();
    for (std::int64_t i = 0; i < c; ++i) {
      const A* z = L + i * Vl;
      A m = neg_inf;
      for (std::int64_t v = 0; v < real; ++v) m = std::max(m, z[v]);
      mx[i] = m;
    }
    reduce(true, mx, c);
    for (std::int64_t i = 0; i < c; ++i) {
      A* z = L + i * Vl;
      const std::int32_t y = targets[r0 + i];
      const std::int64_t yl = static_cast<std::int64_t>(y) - v_begin;
      const bool owned = y != ignore_index && yl >= 0 && yl < real;
      se[c + i] = owned ? z[yl] : A(0);  // the target logit, on the rank that holds it
      A sum = 0;
      if (y != ignore_index)
        for (std::int64_t v = 0; v < real; ++v) {
          z[v] = detail::ce_exp(z[v], mx[i]);
          sum += z[v];  // in order
        }
      se[i] = sum;
    }
    reduce(false, se, 2 * c);
    for (std::int64_t i = 0; i < c; ++i) {
      A* z = L + i * Vl;
      const std::int32_t y = targets[r0 + i];
      if (y == ignore_index) {
        if (grad) std::fill(z, z + Vl, A(0));
        continue;
      }
      res_loss += static_cast<double>(detail::ce_row_loss(mx[i], se[i], se[c + i]));
      if (grad) {
        const A inv = A(1) / se[i];
        const std::int64_t yl = static_cast<std::int64_t>(y) - v_begin;
        for (std::int64_t v = 0; v < real; ++v)
          z[v] = detail::ce_dlogit(z[v], inv, v == yl, grad_scale);
        std::fill(z + real, z + Vl, A(0));  // padding: no gradient
      }
    }
    if (!grad) continue;
    A* dxc = nullptr;
    if constexpr (narrow_dx)
      dxc = dxbuf.data();
    else
      dxc = dx + r0 * H;
    gemm<A>(transpose::no, transpose::no, c, H, Vl, A(1), L, Vl, wa, H, A(0), dxc, H);
    gemm<A>(transpose::yes, transpose::no, Vl, H, c, A(1), L, Vl, xa, H, A(1), dwlm, H);
    for (std::int64_t i = 0; i < c; ++i)
      if (targets[r0 + i] == ignore_index) std::fill(dxc + i * H, dxc + (i + 1) * H, A(0));
    if constexpr (narrow_dx)
      for (std::int64_t i = 0; i < c * H; ++i) dx[r0 * H + i] = to<GA>(dxc[i]);
  }
  *loss_sum = res_loss;
}

/// Logits of one token row for sampling at generation time:
/// logits[v] = sum_h x_row[h] * wlm[v, h].
///
/// - `logits` (V), float: written. `x_row` (H), `wlm` (V, H), T in
///   {float, double, bf16}; computed in accum_t<T>, stored as float.
/// - float: one GEMM (M = 1) through kernels::gemm; double and bf16: a
///   parallel loop over v (a GEMV reads wlm once either way; converting wlm
///   for the BLAS would cost V*H floats of memory). No scratch.
/// - Throws config_error if H or V is < 1.
template <class T>
void lm_head_logits(const host_context& ctx, float* logits, const T* x_row, const T* wlm,
                    std::int64_t H, std::int64_t V) {
  using A = accum_t<T>;
  (void)ctx;
  TESSERA_THROW_IF(H <= 0 || V <= 0, config_error, "lm_head_logits: H=", H, " and V=", V,
                   " must be >= 1");
  if constexpr (std::is_same_v<T, float>) {
    gemm<float>(transpose::no, transpose::yes, 1, V, H, 1.0f, x_row, H, wlm, H, 0.0f, logits, V);
  } else {
#pragma omp parallel for schedule(static) if (V * H >= ce_parallel_min_elems)
    for (std::int64_t v = 0; v < V; ++v) {
      const T* w = wlm + v * H;
      A acc = 0;
      for (std::int64_t h = 0; h < H; ++h) acc += to<A>(x_row[h]) * to<A>(w[h]);
      logits[v] = static_cast<float>(acc);
    }
  }
}

}  // namespace tessera::kernels
