#pragma once
/// \file kernels/cuda/cross_entropy.hpp
/// The LM head fused with the softmax cross-entropy on the GPU, in chunks of
/// token rows, so that the full (N, V) float32 logits never exist: per chunk
/// the logits (a cuBLASLt GEMM), the softmax, the loss and the logit
/// gradient (one kernel), and the two GEMMs of the backward run on a
/// (chunk, V) scratch block, which the next chunk reuses. Declarations for
/// any C++ compiler (with the CUDA headers); the kernels are in
/// kernels/cuda/cross_entropy.cuh (bodies over kernels/cuda/block.hpp and
/// their `*_launch` functions, which the host tests run under the block
/// emulator: tests/kernels/emulated_cross_entropy.cpp), and the entry points
/// below are defined there too: under nvcc this header includes it (header-
/// only), else they are tessera::cuda_kernels' (cuda/kernels_cross_entropy.cu;
/// kernels/cuda/linkage.hpp). The scratch
/// layout and launch configurations are host functions in
/// kernels/cuda/launch.hpp (tested in tests/kernels/cuda_cross_entropy_launch.cpp).
///
/// Gradient contract (llm.c): dwlm accumulates (`+=`), dx is written (`=`).
///
/// Source: llm.c's fused classifier (`fused_classifier_kernel`, train_gpt2.cu)
/// and Liger-kernel's fused linear cross-entropy (chunking over tokens); the
/// host version is kernels::lm_head_cross_entropy (kernels/cross_entropy.hpp),
/// and both call the per-element arithmetic of kernels/detail/cross_entropy.hpp.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "tessera/core/numeric.hpp"
#include "tessera/kernels/cuda/gemm.cuh"
#include "tessera/kernels/cuda/launch.hpp"
#include "tessera/kernels/cuda/linkage.hpp"

namespace tessera::kernels::cuda {

// lm_head_cross_entropy_scratch_bytes(N, V, H, chunk) and the recommended
// lm_head_cross_entropy_default_chunk(V) are constexpr in launch.hpp:
//   std::size_t lm_head_cross_entropy_scratch_bytes(std::int64_t N, std::int64_t V,
//                                                   std::int64_t H, std::int64_t chunk);

/// LM head + softmax cross-entropy, fused and chunked, on `stream`.
///
/// x (N, H) final-normed hidden states and wlm (V, H) of the 16-bit storage type T (bf16 or
/// fp16; one overload each, the same kernels); targets (N) int32 (position n scored
/// unless targets[n] == ignore_index). Writes *d_loss_sum (one double on the device) = sum over
/// scored n of -log softmax(x wlm^T)[n, targets[n]] (natural log). If d_dx != nullptr (training;
/// d_dwlm then required): d_dx (N, H) T WRITTEN = grad_scale * d(loss_sum)/dx (rows of ignored
/// positions exactly 0); d_dwlm (V, H) float32 ACCUMULATED (+=) grad_scale * d(loss_sum)/dwlm.
/// grad_scale is typically 1 / (global count of scored tokens over all micro-batches and ranks),
/// known on the host.
///
/// - Per chunk of C = min(chunk, N) rows: logits (C, V) float32 = x_chunk wlm^T
///   (linear_forward: T operands, float32 accumulation); one block per row
///   computes the max and sum of exp online in float32, the row's loss
///   (float32, stored as float64) and, when training, grad_scale * (softmax -
///   onehot) rounded once to T; then dx_chunk = dlogits wlm
///   (linear_backward_input, T out) and dwlm += dlogits^T x_chunk
///   (linear_backward_weight, beta = 1, float32 accumulation). Against the
///   host's 16-bit path (float32 throughout) this adds two roundings: the logit
///   gradient to T (cuBLASLt has no float x T matmul) and dx to T.
/// - `ctx`: the GEMMs' cuBLASLt context; it must serve `stream` (its workspace
///   is shared). It caches a plan per GEMM shape and pointer alignment: a
///   handful per (N, chunk) (the last chunk may be shorter, and x_chunk's
///   alignment can change from chunk to chunk when C * H * 2 bytes is not a
///   multiple of 16).
/// - `chunk` >= 1 rows; lm_head_cross_entropy_default_chunk(V) is the
///   recommendation (2048 rows at V = 32000: 250 MiB of float logits).
/// - `d_scratch`: at least lm_head_cross_entropy_scratch_bytes(N, V, H, chunk)
///   bytes, aligned to 256 bytes (cudaMalloc and the caching allocator are);
///   contents on entry do not matter. No other device memory is allocated.
/// - Deterministic: the per-row losses are added by one block in a fixed
///   order after the last chunk (no float atomics), on the device (no host
///   synchronisation anywhere in the call); the row kernel's reduction tree
///   depends on V only. Two calls with the same inputs and chunk give the
///   same bits on one GPU (cuBLASLt's algorithms are deterministic).
/// - Targets outside [0, V) other than ignore_index cannot be reported from
///   the device without a host sync, so the call does not throw for them:
///   such a row's loss is NaN, and (training) its logit gradient is NaN, so
///   its dx row and all of dwlm become NaN (other rows' dx are unaffected). The loss
///   sum is then NaN and the step's inf/NaN check (count_nonfinite, or a
///   non-finite loss) rejects the step: the error is visible, never a
///   silent wrong gradient. The data loader validates token ids, so this
///   does not happen with its batches. Nothing is read out of bounds.
/// - N = 0 writes *d_loss_sum = 0 and touches nothing else.
/// - Aliasing: d_dx and d_dwlm must not overlap each other, the inputs or the
///   scratch.
/// - Throws config_error before any work for N < 0, V < 1, H < 1, chunk < 1,
///   a null d_loss_sum (or, with N > 0, a null input), only one of d_dx and
///   d_dwlm given, a scratch buffer too small or not 256-byte aligned;
///   cuda_error if a launch or cuBLASLt call fails.
TESSERA_CUDA_ENTRY void lm_head_cross_entropy(
    cublaslt_context& ctx, double* d_loss_sum, const bf16* d_x, const bf16* d_wlm,
    const std::int32_t* d_targets, std::int64_t N, std::int64_t V, std::int64_t H,
    std::int32_t ignore_index, float grad_scale, bf16* d_dx, float* d_dwlm, std::int64_t chunk,
    void* d_scratch, std::size_t scratch_bytes, cudaStream_t stream);
TESSERA_CUDA_ENTRY void lm_head_cross_entropy(
    cublaslt_context& ctx, double* d_loss_sum, const fp16* d_x, const fp16* d_wlm,
    const std::int32_t* d_targets, std::int64_t N, std::int64_t V, std::int64_t H,
    std::int32_t ignore_index, float grad_scale, fp16* d_dx, float* d_dwlm, std::int64_t chunk,
    void* d_scratch, std::size_t scratch_bytes, cudaStream_t stream);

// ---- vocabulary-parallel pieces (Megatron's vocab-parallel cross-entropy) ----------------
//
// kernels::lm_head_cross_entropy_vocab_parallel (kernels/cuda/ops.hpp) runs
// its chunk loop on the host side, because the two reductions over the tp
// group between these kernels are a callback (a template); per chunk of
// `rows` token rows, with this rank's logits (rows, Vl) float32 of the
// vocabulary slice [v_begin, v_begin + Vl), of which the first `real`
// columns are not padding (real = min(Vl, V - v_begin), >= 0):
//   row_max -> all-reduce(max) -> row_sums -> all-reduce(sum) -> row_grad
// then the dx and dwlm GEMMs, and once after the last chunk lm_head_ce_finish.
// One block of lm_head_ce_threads per row; every launcher throws
// config_error for rows < 0, Vl < 1 or real outside [0, Vl], cuda_error
// for a failed launch. Arithmetic: kernels/detail/cross_entropy.hpp, as
// the host.

/// d_max[r] = the largest of the row's `real` logits (-inf if real = 0).
TESSERA_CUDA_ENTRY void vocab_parallel_ce_row_max(float* d_max, const float* d_logits,
                                                  std::int64_t rows, std::int64_t Vl,
                                                  std::int64_t real, cudaStream_t stream);

/// d_sums[r] = sum of exp(z - max[r]) over the row's real logits, and
/// d_sums[rows + r] = the target's logit on the rank that holds it (0 on
/// the others); both 0 for an ignored row. A target outside [0, V) that is
/// not ignored gives NaN in d_sums[rows + r] on every rank, so the row's
/// loss and gradient are NaN (the step is rejected, never silently wrong).
TESSERA_CUDA_ENTRY void vocab_parallel_ce_row_sums(float* d_sums, const float* d_logits,
                                                   const float* d_max,
                                                   const std::int32_t* d_targets, std::int64_t rows,
                                                   std::int64_t V, std::int64_t v_begin,
                                                   std::int64_t Vl, std::int64_t real,
                                                   std::int32_t ignore_index, cudaStream_t stream);

/// From the reduced max and sums: d_row_loss[r] (float64; 0 when ignored)
/// and, if d_dlogits is not null, the row's (Vl) logit gradient (bf16 or fp16)
/// grad_scale (softmax - onehot) over the real columns, 0 over padding and
/// for ignored rows.
TESSERA_CUDA_ENTRY void vocab_parallel_ce_row_grad(double* d_row_loss, bf16* d_dlogits,
                                                   const float* d_logits, const float* d_max,
                                                   const float* d_sums,
                                                   const std::int32_t* d_targets, std::int64_t rows,
                                                   std::int64_t v_begin, std::int64_t Vl,
                                                   std::int64_t real, std::int32_t ignore_index,
                                                   float grad_scale, cudaStream_t stream);
TESSERA_CUDA_ENTRY void vocab_parallel_ce_row_grad(double* d_row_loss, fp16* d_dlogits,
                                                   const float* d_logits, const float* d_max,
                                                   const float* d_sums,
                                                   const std::int32_t* d_targets, std::int64_t rows,
                                                   std::int64_t v_begin, std::int64_t Vl,
                                                   std::int64_t real, std::int32_t ignore_index,
                                                   float grad_scale, cudaStream_t stream);

/// After the last chunk: dx rows (N, H) (bf16 or fp16) of ignored targets set to 0
/// (d_dx may be null: evaluation) and *d_loss_sum = the sum of d_row_loss
/// (N) in a fixed order, as lm_head_cross_entropy ends.
TESSERA_CUDA_ENTRY void lm_head_ce_finish(double* d_loss_sum, const double* d_row_loss, bf16* d_dx,
                                          const std::int32_t* d_targets, std::int64_t N,
                                          std::int64_t H, std::int32_t ignore_index,
                                          cudaStream_t stream);
TESSERA_CUDA_ENTRY void lm_head_ce_finish(double* d_loss_sum, const double* d_row_loss, fp16* d_dx,
                                          const std::int32_t* d_targets, std::int64_t N,
                                          std::int64_t H, std::int32_t ignore_index,
                                          cudaStream_t stream);

}  // namespace tessera::kernels::cuda

#if TESSERA_CUDA_HEADER_ONLY_KERNELS
#include "tessera/kernels/cuda/cross_entropy.cuh"
#endif
