#pragma once
/// \file kernels/cuda/attention.hpp
/// Causal flash attention with grouped-query heads on the GPU, forward and
/// backward. The kernels and these launchers are defined in
/// kernels/cuda/attention.cuh: under nvcc this header includes it
/// (header-only), else the launchers are tessera::cuda_kernels'
/// (cuda/kernels_attention.cu; kernels/cuda/linkage.hpp). The host version,
/// with the same layouts and the same per-element arithmetic
/// (kernels/detail/attention.hpp), is kernels/attention.hpp.
///
/// Layout (row-major, contiguous, device pointers), T the 16-bit storage type,
/// bf16 or fp16 (one overload each, the same kernels):
/// - q, out, dq, dout: (B, S, nh, hd) T
/// - k, v, dk, dv:     (B, S, nkv, hd) T
/// - lse:              (B, nh, S) float32, natural-log log-sum-exp of each
///                     query row's scaled scores (scale 1/sqrt(hd))
/// Query head h reads key/value head h / (nh / nkv); position t attends to
/// keys s <= t (causal). A block of ring attention (the overloads with an
/// attention_span, below) takes k, v, dk, dv as (B, Sk, nkv, hd) at global
/// offsets and writes float32 outputs, for flash_attention_merge.
///
/// Arithmetic: Q K^T, P V and the backward products on T's tensor cores
/// (mma.sync m16n8k16, .bf16 or .f16 operands) with float32 accumulation;
/// softmax, lse, D and dS in float32; P and dS are rounded to T before they
/// multiply V, dO, K or Q, as in FlashAttention-2. (fp16 holds magnitudes from
/// about 6e-8 to 65504: the loss scale must keep the attention gradients in
/// that range, as it must for every fp16 activation gradient.) Neither the S x S scores nor the
/// probabilities are ever stored: the forward saves only out and lse.
///
/// Determinism: no atomics; every output element is reduced by one thread in
/// an order fixed by the sizes, so two runs give the same bits on any GPU.
///
/// Gradient contract (llm.c): attention has no parameters; dq, dk, dv are
/// activation gradients and are written (`=`).
///
/// Source: Tri Dao, "FlashAttention-2: Faster Attention with Better
/// Parallelism and Work Partitioning", 2023, Algorithm 1 (forward) and
/// Algorithm 2 (backward, here split into a dK/dV pass and a dQ pass so that
/// no float atomics are needed).

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "tessera/core/numeric.hpp"
#include "tessera/kernels/cuda/attention_launch.hpp"
#include "tessera/kernels/cuda/linkage.hpp"

namespace tessera::kernels::cuda {

/// Causal attention forward: out = softmax(q k^T / sqrt(hd) + mask) v,
/// per (b, query head h), with key/value head h / (nh / nkv); the mask is
/// causal, and with `d_doc_start` also confined to each query's document.
/// - `d_q` (B, S, nh, hd), `d_k`, `d_v` (B, S, nkv, hd) T; `d_out`
///   (B, S, nh, hd) T, written; `d_lse` (B, nh, S) float32, written
///   (natural log; what flash_attention_backward needs besides q, k, v, out).
/// - Sizes: B, S, nh, nkv >= 1, nkv divides nh, hd in {32, 64, 128} (the 7B
///   models use 128), S <= attention_max_S (8388480). Any S: the last tile is
///   masked, no padding needed.
/// - `d_doc_start` (B, S) int32, device memory, or null: the document mask
///   (kernels::attention_mask: query t sees keys doc_start[t] .. t;
///   nondecreasing in t). Key tiles wholly before a warp's documents are
///   skipped; a query with nothing to attend to gets out 0 and lse -inf.
///   Null: plain causal attention, the same bits as before it existed.
/// - Pointers: device memory; the 16-bit ones aligned to 16 bytes, lse and
///   doc_start to 4. Outputs must not overlap the inputs.
/// - One launch on `stream`, grid (B nh, ceil(S / 128)) of 256 threads, 96 KiB
///   of dynamic shared memory at hd 128 (attention_forward_config); no host
///   synchronisation, no scratch.
/// - Throws config_error (before any launch) for bad or unsupported sizes or a
///   null or misaligned pointer; cuda_error if the launch fails.
/// - Source: FlashAttention-2 (Dao 2023), Algorithm 1.
TESSERA_CUDA_ENTRY void flash_attention_forward(bf16* d_out, float* d_lse, const bf16* d_q,
                                                const bf16* d_k, const bf16* d_v, std::int64_t B,
                                                std::int64_t S, std::int64_t nh, std::int64_t nkv,
                                                std::int64_t hd, cudaStream_t stream,
                                                const std::int32_t* d_doc_start = nullptr);
TESSERA_CUDA_ENTRY void flash_attention_forward(fp16* d_out, float* d_lse, const fp16* d_q,
                                                const fp16* d_k, const fp16* d_v, std::int64_t B,
                                                std::int64_t S, std::int64_t nh, std::int64_t nkv,
                                                std::int64_t hd, cudaStream_t stream,
                                                const std::int32_t* d_doc_start = nullptr);

/// Bytes of device scratch flash_attention_backward needs: D = rowsum(dout * out),
/// B nh S float32 (512 KiB at B 1, S 4096, nh 32). Throws config_error for
/// sizes flash_attention_backward would refuse.
inline std::size_t flash_attention_backward_scratch_bytes(std::int64_t B, std::int64_t S,
                                                          std::int64_t nh, std::int64_t nkv,
                                                          std::int64_t hd) {
  attention_check_args("flash_attention_backward_scratch_bytes", B, S, nh, nkv, hd);
  return attention_backward_scratch_bytes(B, S, nh, nkv, hd);
}

/// Causal attention backward, recomputing the probabilities tile by tile
/// from `d_lse` (FlashAttention-2 Algorithm 2).
/// - `d_dq` (B, S, nh, hd), `d_dk`, `d_dv` (B, S, nkv, hd) T: written (`=`);
///   dk and dv sum over the nh / nkv query heads sharing a key/value head.
/// - `d_dout` (B, S, nh, hd) T: dLoss/dout. `d_q`, `d_k`, `d_v`, `d_out`,
///   `d_lse`, `d_doc_start`: as given to and returned by flash_attention_forward.
/// - `d_scratch`: at least flash_attention_backward_scratch_bytes(...) bytes
///   of device memory, 4-byte aligned, overwritten (D).
/// - Sizes and alignment as flash_attention_forward. The outputs must not
///   overlap each other, the inputs or the scratch.
/// - Three launches on `stream`, no host synchronisation: D = rowsum(dout *
///   out) (float32); dK, dV: a block per (b, kv head, 128 keys) walks every
///   query tile of every query head of its group in a fixed order; dQ: a block
///   per (b, head, 128 queries) walks its key tiles. No atomics: deterministic.
///   The scores and dP are computed in both passes (7 S^2 hd multiply-adds
///   per head against the 5 of flash_attention_backward_flops).
/// - Throws config_error (before any launch) for bad or unsupported sizes, a
///   null or misaligned pointer, or `scratch_bytes` below the requirement
///   (naming both); cuda_error if a launch fails.
/// - Source: FlashAttention-2 (Dao 2023), Algorithm 2.
TESSERA_CUDA_ENTRY void flash_attention_backward(
    bf16* d_dq, bf16* d_dk, bf16* d_dv, const bf16* d_dout, const bf16* d_q, const bf16* d_k,
    const bf16* d_v, const bf16* d_out, const float* d_lse, std::int64_t B, std::int64_t S,
    std::int64_t nh, std::int64_t nkv, std::int64_t hd, void* d_scratch, std::size_t scratch_bytes,
    cudaStream_t stream, const std::int32_t* d_doc_start = nullptr);
TESSERA_CUDA_ENTRY void flash_attention_backward(
    fp16* d_dq, fp16* d_dk, fp16* d_dv, const fp16* d_dout, const fp16* d_q, const fp16* d_k,
    const fp16* d_v, const fp16* d_out, const float* d_lse, std::int64_t B, std::int64_t S,
    std::int64_t nh, std::int64_t nkv, std::int64_t hd, void* d_scratch, std::size_t scratch_bytes,
    cudaStream_t stream, const std::int32_t* d_doc_start = nullptr);

// ---- blocks of context-parallel (ring) attention --------------------------------------------

/// One block of ring attention's forward: the S queries at global positions
/// span.q0 .. against the Sk keys at span.k0 .. (kernels::attention_span;
/// key k0 + s visible to query q0 + t iff k0 + s <= q0 + t, and with
/// `d_doc_start` (global positions) at or after the query's document
/// start), written as a float32 partial output for flash_attention_merge.
/// - `d_q` (B, S, nh, hd), `d_k`, `d_v` (B, Sk, nkv, hd) T; `d_out`
///   (B, S, nh, hd) float32, written, unrounded (the attention of this
///   block's keys only); `d_lse` (B, nh, S) float32, written. A query that
///   sees no key of the block gets out 0 and lse -inf, never NaN (a block
///   wholly in the future writes only those).
/// - The block form of the kernels (attention.cuh: attention_form::block):
///   the causal kernels' code and registers are not touched by it. Keys
///   past Sk are masked; key tiles after a query tile's last query and
///   before its documents are skipped; a block wholly in the past has no
///   causal mask.
/// - Sizes as flash_attention_forward, plus attention_check_span (offsets
///   >= 0, Sk >= 1 or -1 for S, positions below 2^30); `d_out` 4-byte aligned.
/// - Throws config_error (before any launch) naming the value; cuda_error if
///   the launch fails.
/// - Source: Liu et al. 2023, "Ring Attention with Blockwise Transformers";
///   FlashAttention-2 (Dao 2023), Algorithm 1.
TESSERA_CUDA_ENTRY void flash_attention_forward(float* d_out, float* d_lse, const bf16* d_q,
                                                const bf16* d_k, const bf16* d_v, std::int64_t B,
                                                std::int64_t S, std::int64_t nh, std::int64_t nkv,
                                                std::int64_t hd, cudaStream_t stream,
                                                const std::int32_t* d_doc_start,
                                                kernels::attention_span span);
TESSERA_CUDA_ENTRY void flash_attention_forward(float* d_out, float* d_lse, const fp16* d_q,
                                                const fp16* d_k, const fp16* d_v, std::int64_t B,
                                                std::int64_t S, std::int64_t nh, std::int64_t nkv,
                                                std::int64_t hd, cudaStream_t stream,
                                                const std::int32_t* d_doc_start,
                                                kernels::attention_span span);

/// One block of ring attention's backward, from the FINAL out and lse (after
/// flash_attention_merge of every block; out rounded to T as the forward
/// saves it): this block's contribution to dq and the block's dk, dv.
/// - `d_dq` (B, S, nh, hd) float32: written (`=`), or with
///   kernels::attention_dq::accumulate the block's contribution added
///   (`+=`): a ring sums its blocks unrounded.
/// - `d_dk`, `d_dv` (B, Sk, nkv, hd) float32: written, this block's (a ring
///   sums a key block's over the ranks that saw it).
/// - `d_dout`, `d_q`, `d_out` (B, S, nh, hd), `d_k`, `d_v` (B, Sk, nkv, hd)
///   T; `d_lse` (B, nh, S) float32; `d_doc_start`, `span`: the forward's.
/// - `d_scratch`: flash_attention_backward_scratch_bytes(B, S, nh, nkv, hd)
///   bytes at least (D over the S queries).
/// - Three launches as flash_attention_backward's, in the block form; the
///   dK/dV grid is over the Sk keys. Deterministic; no atomics.
/// - Throws config_error (before any launch) as flash_attention_backward and
///   the block forward; cuda_error if a launch fails.
/// - Source: FlashAttention-2 (Dao 2023), Algorithm 2; Liu et al. 2023.
TESSERA_CUDA_ENTRY void flash_attention_backward(
    float* d_dq, float* d_dk, float* d_dv, const bf16* d_dout, const bf16* d_q, const bf16* d_k,
    const bf16* d_v, const bf16* d_out, const float* d_lse, std::int64_t B, std::int64_t S,
    std::int64_t nh, std::int64_t nkv, std::int64_t hd, void* d_scratch, std::size_t scratch_bytes,
    cudaStream_t stream, const std::int32_t* d_doc_start, kernels::attention_span span,
    kernels::attention_dq dq_mode);
TESSERA_CUDA_ENTRY void flash_attention_backward(
    float* d_dq, float* d_dk, float* d_dv, const fp16* d_dout, const fp16* d_q, const fp16* d_k,
    const fp16* d_v, const fp16* d_out, const float* d_lse, std::int64_t B, std::int64_t S,
    std::int64_t nh, std::int64_t nkv, std::int64_t hd, void* d_scratch, std::size_t scratch_bytes,
    cudaStream_t stream, const std::int32_t* d_doc_start, kernels::attention_span span,
    kernels::attention_dq dq_mode);

/// Merges one block's partial attention into a running accumulator, as the
/// host kernels::attention_merge (the same per-element functions): per row
/// lse = log(exp(lse_acc) + exp(lse_part)) (max + log1p, stable) and
/// out = out_acc exp(lse_acc - lse) + out_part exp(lse_part - lse); -inf
/// exact (an empty block keeps the accumulator's bits; two empty rows give
/// 0 and -inf), never NaN.
/// - `d_out_acc` (B, S, nh, hd), `d_lse_acc` (B, nh, S) float32: in place;
///   `d_out_part`, `d_lse_part` likewise, one block's (flash_attention_forward
///   with a span); not overlapping the accumulator. 4-byte aligned.
/// - Two launches on `stream` (attention_merge.cuh): the outputs, then lse.
///   Deterministic, element-wise.
/// - Throws config_error for a size < 1; cuda_error if a launch fails.
/// - Source: Liu et al. 2023; FlashAttention-2, Algorithm 1, lines 8-13.
TESSERA_CUDA_ENTRY void flash_attention_merge(float* d_out_acc, float* d_lse_acc,
                                              const float* d_out_part, const float* d_lse_part,
                                              std::int64_t B, std::int64_t S, std::int64_t nh,
                                              std::int64_t hd, cudaStream_t stream);

/// FLOPs of the causal forward, counting a multiply-add as 2 and the causal
/// square once (half of S^2, the convention of the FlashAttention papers):
/// two products of (S x hd) by (hd x S) shape, Q K^T and P V, each
/// 2 S^2 hd / 2, so 2 B nh S^2 hd. Softmax work is not counted.
/// (Llama-2 7B layer, B 1, S 4096, nh 32, hd 128: 1.37e11.)
inline double flash_attention_forward_flops(std::int64_t B, std::int64_t S, std::int64_t nh,
                                            std::int64_t hd) {
  const double s = static_cast<double>(S);
  return 2.0 * static_cast<double>(B) * static_cast<double>(nh) * s * s * static_cast<double>(hd);
}

/// FLOPs of the causal backward, same convention: five products of the
/// forward's size (S = Q K^T recomputed, dP = dO V^T, dV = P^T dO,
/// dQ = dS K, dK = dS^T Q), 2.5 times the forward: 5 B nh S^2 hd. (The
/// kernels recompute S and dP in both passes, doing 7 products' work;
/// this function counts the algorithm's 5, as FlashAttention-2 does.)
inline double flash_attention_backward_flops(std::int64_t B, std::int64_t S, std::int64_t nh,
                                             std::int64_t hd) {
  return 2.5 * flash_attention_forward_flops(B, S, nh, hd);
}

}  // namespace tessera::kernels::cuda

#if TESSERA_CUDA_HEADER_ONLY_KERNELS
#include "tessera/kernels/cuda/attention.cuh"
#endif
