#pragma once
/// \file kernels/cuda/launch.hpp
/// Launch configurations of the CUDA kernels in kernels/cuda/*.cuh, as plain
/// host functions (no CUDA headers), so host tests can check grid sizes,
/// shared memory and scratch bytes for the 7B shapes without a GPU
/// (tests/kernels/cuda_launch.cpp). Each kernel's launcher calls the function
/// here; each .cuh static_asserts that its shared_storage fits the bound
/// declared here.
///
/// Every configuration depends on the problem sizes only, never on the
/// device, so a reduction's order (and so its bits) is the same on any GPU.

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "tessera/core/error.hpp"

namespace tessera::kernels::cuda {

/// Hardware limits the configurations are checked against.
struct launch_limits {
  static constexpr std::int64_t max_grid_x = 2147483647;  ///< 2^31 - 1
  static constexpr std::int64_t max_grid_y = 65535;
  static constexpr int max_block = 1024;
  /// Static shared memory without an opt-in (cudaFuncSetAttribute).
  static constexpr std::size_t default_smem = 48 * 1024;
  /// Largest opt-in shared memory per block: 227 KiB on sm_90, 163 KiB on sm_80.
  static constexpr std::size_t max_smem_sm90 = 227 * 1024;
  static constexpr std::size_t max_smem_sm80 = 163 * 1024;
};

/// A 1-D or 2-D launch: grid (grid_x, grid_y) of `block` threads, with
/// `smem` bytes of shared memory (static storage bound plus dynamic; the
/// dynamic part is `dynamic_smem`) and `scratch_bytes` of device workspace
/// the caller passes in.
struct launch_config {
  std::int64_t grid_x = 1;
  std::int64_t grid_y = 1;
  int block = 1;
  std::size_t smem = 0;
  std::size_t dynamic_smem = 0;
  std::size_t scratch_bytes = 0;

  /// True when the launch is within launch_limits (and not empty).
  constexpr bool valid() const {
    return grid_x >= 1 && grid_x <= launch_limits::max_grid_x && grid_y >= 1 &&
           grid_y <= launch_limits::max_grid_y && block >= 1 && block <= launch_limits::max_block &&
           smem <= launch_limits::default_smem;
  }
};

namespace detail {
constexpr std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}
}  // namespace detail

// ---- RMSNorm -----------------------------------------------------------------------------------

/// Threads per block of the RMSNorm row kernels (one block per row).
inline constexpr int rmsnorm_threads = 256;
/// Bound on the shared_storage of an RMSNorm row kernel (a CUB BlockReduce of
/// floats over 256 threads plus one broadcast float).
inline constexpr std::size_t rmsnorm_smem_bound = 256;
/// Rows summed by one block of the dweight partial-sum kernel.
inline constexpr std::int64_t rmsnorm_dweight_rows = 256;
/// Columns per block of the dweight kernels (one per thread).
inline constexpr int rmsnorm_dweight_threads = 256;

/// rmsnorm_forward and the dinp part of rmsnorm_backward: one block of
/// `rmsnorm_threads` per row; rows beyond the grid limit are taken by a
/// grid-stride loop. Throws config_error for N < 0 or H < 1.
constexpr launch_config rmsnorm_row_config(std::int64_t N, std::int64_t H) {
  if (N < 0 || H < 1) throw config_error("rmsnorm (cuda): need N >= 0 and H >= 1");
  launch_config c;
  c.grid_x = std::max<std::int64_t>(1, std::min(N, launch_limits::max_grid_x));
  c.block = rmsnorm_threads;
  c.smem = rmsnorm_smem_bound;
  return c;
}

/// The dweight part of rmsnorm_backward, stage 1: grid (row chunks of
/// rmsnorm_dweight_rows, column blocks of 256); each block writes the float
/// partial sums of its chunk into scratch (chunks x H floats, the returned
/// scratch_bytes). Stage 2 (rmsnorm_dweight_reduce_config) adds the chunks in
/// order into dweight, so the result is deterministic.
constexpr launch_config rmsnorm_dweight_partial_config(std::int64_t N, std::int64_t H) {
  if (N < 0 || H < 1) throw config_error("rmsnorm (cuda): need N >= 0 and H >= 1");
  launch_config c;
  const std::int64_t chunks = std::max<std::int64_t>(1, detail::ceil_div(N, rmsnorm_dweight_rows));
  c.grid_x = chunks;
  c.grid_y = detail::ceil_div(H, rmsnorm_dweight_threads);
  c.block = rmsnorm_dweight_threads;
  c.scratch_bytes = static_cast<std::size_t>(chunks * H) * sizeof(float);
  return c;
}

/// Stage 2 of the dweight reduction: one thread per column.
constexpr launch_config rmsnorm_dweight_reduce_config(std::int64_t H) {
  launch_config c;
  c.grid_x = detail::ceil_div(std::max<std::int64_t>(H, 1), rmsnorm_dweight_threads);
  c.block = rmsnorm_dweight_threads;
  return c;
}

/// Device scratch bytes rmsnorm_backward needs for (N, H).
constexpr std::size_t rmsnorm_backward_scratch_bytes(std::int64_t N, std::int64_t H) {
  return rmsnorm_dweight_partial_config(N, H).scratch_bytes;
}

// ---- element-wise (SwiGLU, casts, AdamW) ------------------------------------------------------

/// Threads per block of the element-wise kernels.
inline constexpr int elementwise_threads = 256;
/// Most blocks an element-wise launch uses; beyond that each thread loops
/// (grid-stride), so an index never overflows and n up to 2^63 works.
inline constexpr std::int64_t elementwise_max_blocks = std::int64_t(1) << 20;

/// An element-wise kernel over n elements, `vec` per thread per iteration.
constexpr launch_config elementwise_config(std::int64_t n, int vec) {
  if (n < 0 || vec < 1) throw config_error("elementwise (cuda): need n >= 0 and vec >= 1");
  launch_config c;
  c.block = elementwise_threads;
  c.grid_x = std::clamp<std::int64_t>(detail::ceil_div(n, std::int64_t(elementwise_threads) * vec),
                                      1, elementwise_max_blocks);
  return c;
}

// ---- global gradient norm ---------------------------------------------------------------------

/// Threads per block of the sum-of-squares kernels.
inline constexpr int grad_norm_threads = 256;
/// Partial sums (blocks of stage 1): fixed by n, never by the device.
inline constexpr std::int64_t grad_norm_max_blocks = 1024;
/// Bound on a sum-of-squares kernel's shared_storage (CUB BlockReduce of doubles).
inline constexpr std::size_t grad_norm_smem_bound = 512;

namespace detail {
/// Stage 1 of a two-stage reduction over n elements: min(ceil(n / (threads
/// 8)), max_blocks) blocks of `threads`, each writing one partial of
/// `partial_bytes` into the scratch; the count depends on n only. Throws
/// config_error naming `who` for n < 0.
constexpr launch_config partial_reduction_config(const char* who, std::int64_t n, int threads,
                                                 std::int64_t max_blocks, std::size_t smem,
                                                 std::size_t partial_bytes) {
  if (n < 0) throw config_error(who);
  launch_config c;
  c.block = threads;
  c.grid_x = std::clamp<std::int64_t>(ceil_div(n, std::int64_t(threads) * 8), 1, max_blocks);
  c.smem = smem;
  c.scratch_bytes = static_cast<std::size_t>(c.grid_x) * partial_bytes;
  return c;
}
/// One block of one thread (a scalar computed on the device, no host sync).
constexpr launch_config one_thread_config() {
  launch_config c;
  c.block = 1;
  return c;
}
}  // namespace detail

/// Stage 1: min(ceil(n / (256 * 8)), 1024) blocks each reduce a grid-stride
/// share in float64 and write one partial (scratch: 8 bytes a block); stage 2
/// (one block) adds the partials in a fixed tree. Deterministic for a given n.
constexpr launch_config grad_norm_partial_config(std::int64_t n) {
  return detail::partial_reduction_config("grad_sum_squares (cuda): negative n", n,
                                          grad_norm_threads, grad_norm_max_blocks,
                                          grad_norm_smem_bound, sizeof(double));
}

/// Device scratch bytes grad_sum_squares needs for n elements.
constexpr std::size_t grad_sum_squares_scratch_bytes(std::int64_t n) {
  return grad_norm_partial_config(n).scratch_bytes;
}

/// Stage 2: one block of grad_norm_threads adds the stage-1 partials (thread
/// t the partials t, t + 256, ... in order, then a CUB block tree) into the
/// one double of the result.
constexpr launch_config grad_norm_final_config() {
  launch_config c;
  c.block = grad_norm_threads;
  c.smem = grad_norm_smem_bound;
  return c;
}

/// The clip coefficient: one thread reads the sum of squares and writes the
/// coefficient (on the device, so the step needs no host sync).
constexpr launch_config clip_coefficient_config() {
  return detail::one_thread_config();
}

// ---- FP8 scaled casts ---------------------------------------------------------------------------

/// Threads per block of the FP8 amax reduction and the transposed cast (the
/// cast itself is element-wise: elementwise_config).
inline constexpr int fp8_threads = 256;
/// Partial maxima (blocks of the amax's stage 1): fixed by n, never by the device.
inline constexpr std::int64_t fp8_amax_max_blocks = 1024;
/// Bound on an amax kernel's shared_storage (a CUB BlockReduce of floats).
inline constexpr std::size_t fp8_amax_smem_bound = 256;
/// The transposed cast's tile: 32 x 32 elements through shared memory, as
/// float (32 rows of 33, the pad keeps the column reads off one bank).
inline constexpr int fp8_transpose_tile = 32;
inline constexpr std::size_t fp8_transpose_smem_bound =
    sizeof(float) * fp8_transpose_tile * (fp8_transpose_tile + 1);

/// fp8_amax_accumulate, stage 1: min(ceil(n / (256 * 8)), 1024) blocks each
/// take the maximum of a grid-stride share and write one partial (scratch:
/// 4 bytes a block); stage 2 (fp8_amax_final_config, one block) folds the
/// partials into the amax. A maximum is exact, so the result does not
/// depend on the partition; it is fixed by n all the same.
constexpr launch_config fp8_amax_partial_config(std::int64_t n) {
  return detail::partial_reduction_config("fp8_amax_accumulate (cuda): negative n", n,
                                          fp8_threads, fp8_amax_max_blocks, fp8_amax_smem_bound,
                                          sizeof(float));
}

/// Device scratch bytes fp8_amax_accumulate needs for n elements.
constexpr std::size_t fp8_amax_scratch_bytes(std::int64_t n) {
  return fp8_amax_partial_config(n).scratch_bytes;
}

/// fp8_amax_accumulate, stage 2: one block folds the stage-1 partials into
/// the one float of the amax.
constexpr launch_config fp8_amax_final_config() {
  launch_config c;
  c.block = fp8_threads;
  c.smem = fp8_amax_smem_bound;
  return c;
}

/// fp8_update_scale: one thread reads the amax and writes the scale.
constexpr launch_config fp8_update_scale_config() {
  return detail::one_thread_config();
}

/// fp8_quantize_transposed on x (rows, cols): one block of 256 threads (32
/// columns x 8 rows) per 32 x 32 tile, grid (column tiles, row tiles); tiles
/// beyond the grid limits are taken by grid-stride loops. Throws
/// config_error for rows or cols < 0.
constexpr launch_config fp8_transpose_config(std::int64_t rows, std::int64_t cols) {
  if (rows < 0 || cols < 0)
    throw config_error("fp8_quantize_transposed (cuda): need rows >= 0 and cols >= 0");
  launch_config c;
  c.block = fp8_threads;
  c.grid_x = std::clamp<std::int64_t>(detail::ceil_div(cols, fp8_transpose_tile), 1,
                                      launch_limits::max_grid_x);
  c.grid_y = std::clamp<std::int64_t>(detail::ceil_div(rows, fp8_transpose_tile), 1,
                                      launch_limits::max_grid_y);
  c.smem = fp8_transpose_smem_bound;
  return c;
}

// ---- embedding --------------------------------------------------------------------------------

/// Threads per block of the embedding kernels.
inline constexpr int embedding_threads = 256;
/// Vocabulary rows owned by one block of embedding_backward.
inline constexpr std::int64_t embedding_backward_rows = 64;
/// Columns of dwte one block of embedding_backward owns (4 per thread).
inline constexpr std::int64_t embedding_backward_cols = 1024;
/// Tokens scanned per step by one block of embedding_backward (4 per thread).
inline constexpr int embedding_backward_tile = 1024;
/// Bound on embedding_backward's shared_storage: the tile's matched
/// positions (4 KiB) plus a CUB BlockScan (raking: about 1.2 KiB on sm_80/90).
inline constexpr std::size_t embedding_backward_smem_bound = 4096 + 2048;

/// embedding_forward: one block per token row (grid-stride beyond the limit).
constexpr launch_config embedding_forward_config(std::int64_t N, std::int64_t H) {
  if (N < 0 || H < 0) throw config_error("embedding_forward (cuda): need N >= 0 and H >= 0");
  launch_config c;
  c.block = embedding_threads;
  c.grid_x = std::max<std::int64_t>(1, std::min(N, launch_limits::max_grid_x));
  return c;
}

/// embedding_backward: grid (vocabulary chunks of 64 rows, column blocks of
/// 1024). Each block owns its rows of dwte outright, scans every token in
/// order and adds the matching dout rows, so no two blocks touch one
/// element and the sums run in increasing token position: deterministic,
/// no float atomics, and bit-for-bit the host's order.
constexpr launch_config embedding_backward_config(std::int64_t N, std::int64_t V, std::int64_t H) {
  if (N < 0 || V < 1 || H < 0)
    throw config_error("embedding_backward (cuda): need N >= 0, V >= 1 and H >= 0");
  launch_config c;
  c.block = embedding_threads;
  c.grid_x = detail::ceil_div(V, embedding_backward_rows);
  c.grid_y = std::max<std::int64_t>(1, detail::ceil_div(H, embedding_backward_cols));
  c.smem = embedding_backward_smem_bound;
  return c;
}

/// embedding_local_ids: one position per thread, blocks of embedding_threads
/// (grid-stride beyond the grid limit). Throws config_error for N < 0.
constexpr launch_config embedding_local_ids_config(std::int64_t N) {
  if (N < 0) throw config_error("embedding_local_ids (cuda): need N >= 0");
  launch_config c;
  c.block = embedding_threads;
  c.grid_x = std::clamp<std::int64_t>(detail::ceil_div(N, embedding_threads), 1,
                                      launch_limits::max_grid_x);
  return c;
}

// ---- RoPE -------------------------------------------------------------------------------------

/// Threads per block of the RoPE kernels.
inline constexpr int rope_threads = 256;

/// rope_forward / rope_backward on x (B, T, nh, hd): one work item is `vec`
/// consecutive pairs (i, i + hd/2) of one head vector, B*T*nh*(hd/2)/vec
/// items over at most elementwise_max_blocks blocks of rope_threads (beyond
/// that each thread loops, 64-bit indices). No shared memory, no scratch.
/// Throws config_error for a negative size, hd odd or <= 0, or vec < 1.
constexpr launch_config rope_config(std::int64_t B, std::int64_t T, std::int64_t nh,
                                    std::int64_t hd, int vec) {
  if (B < 0 || T < 0 || nh < 0) throw config_error("rope (cuda): need B, T, nh >= 0");
  if (hd <= 0 || hd % 2 != 0) throw config_error("rope (cuda): head dim must be positive and even");
  if (vec < 1) throw config_error("rope (cuda): need vec >= 1");
  launch_config c;
  c.block = rope_threads;
  const std::int64_t pairs = B * T * nh * (hd / 2);
  c.grid_x = std::clamp<std::int64_t>(detail::ceil_div(pairs, std::int64_t(rope_threads) * vec), 1,
                                      elementwise_max_blocks);
  return c;
}

// ==== begin: fused LM head and cross-entropy (kernels/cuda/cross_entropy.hpp) ==================

/// Threads per block of the softmax cross-entropy row kernel (one block per
/// token row of a chunk) and of the final loss reduction (one block).
inline constexpr int lm_head_ce_threads = 256;
/// Bound on the row kernel's shared_storage (a CUB BlockReduce of a
/// (max, sum) float pair over 256 threads plus two broadcast floats) and on
/// the loss reduction's (a BlockReduce of doubles).
inline constexpr std::size_t lm_head_ce_smem_bound = 256;
/// Alignment of each region inside the caller's scratch (and of the scratch
/// pointer itself): 256 bytes, as cudaMalloc gives, which also satisfies
/// cuBLASLt's 16-byte preference and the kernel's 16-byte loads.
inline constexpr std::size_t lm_head_ce_scratch_align = 256;
/// The recommended float32 logits block: 256 MiB (the bf16 logit-gradient
/// block adds half of it again).
inline constexpr std::size_t lm_head_ce_logits_budget = std::size_t(256) << 20;

/// Where lm_head_cross_entropy keeps its work inside the caller's scratch
/// (byte offsets from the scratch pointer, each a multiple of
/// lm_head_ce_scratch_align) and how many token rows one chunk holds.
struct lm_head_ce_scratch {
  std::int64_t rows = 0;     ///< C = min(chunk, max(N, 1)): token rows per chunk
  std::size_t logits = 0;    ///< (C, V) float32 logits of the chunk
  std::size_t dlogits = 0;   ///< (C, V) bf16 gradient of the loss w.r.t. the logits, scaled
  std::size_t row_loss = 0;  ///< (max(N, 1)) float64 loss of every row of the call
  std::size_t bytes = 0;     ///< total scratch bytes
};

namespace detail {
constexpr std::size_t ce_align_up(std::size_t b) {
  return (b + lm_head_ce_scratch_align - 1) / lm_head_ce_scratch_align * lm_head_ce_scratch_align;
}
}  // namespace detail

/// The scratch layout for N token rows, vocabulary V, hidden size H and
/// `chunk` rows per step: C (V floats + V bf16) + N doubles, each region
/// rounded up to 256 bytes. H does not enter (x and wlm go to cuBLASLt as
/// they are); it is checked so that one call validates every size. A chunk
/// above N costs no more than chunk = N. Throws config_error for N < 0,
/// V < 1, H < 1 or chunk < 1.
constexpr lm_head_ce_scratch lm_head_ce_scratch_layout(std::int64_t N, std::int64_t V,
                                                       std::int64_t H, std::int64_t chunk) {
  if (N < 0 || V < 1 || H < 1 || chunk < 1)
    throw config_error(
        "lm_head_cross_entropy (cuda): need N >= 0, V >= 1, H >= 1 and chunk >= 1 token rows");
  lm_head_ce_scratch s;
  const std::int64_t n = std::max<std::int64_t>(N, 1);
  s.rows = std::min(chunk, n);
  const auto cv = static_cast<std::size_t>(s.rows) * static_cast<std::size_t>(V);
  s.logits = 0;
  s.dlogits = detail::ce_align_up(cv * sizeof(float));
  s.row_loss = s.dlogits + detail::ce_align_up(cv * 2);  // bf16: 2 bytes
  s.bytes = s.row_loss + detail::ce_align_up(static_cast<std::size_t>(n) * sizeof(double));
  return s;
}

/// Device scratch bytes lm_head_cross_entropy needs (training or not; the
/// same layout serves both). Independent of how many rows are ignored.
constexpr std::size_t lm_head_cross_entropy_scratch_bytes(std::int64_t N, std::int64_t V,
                                                          std::int64_t H, std::int64_t chunk) {
  return lm_head_ce_scratch_layout(N, V, H, chunk).bytes;
}

/// The recommended `chunk` for vocabulary V: as many rows as keep the float32
/// logits block within lm_head_ce_logits_budget (256 MiB), rounded down to a
/// multiple of 64 (whole GEMM tiles) when that leaves at least 64, and at
/// least 1. V = 32000 (Llama 2): 2048 rows, 250 MiB of float logits plus
/// 125 MiB of bf16 gradient; V = 128256 (Llama 3): 512 rows, 250 + 125 MiB.
/// Larger chunks do not make the GEMMs faster in a way that matters (at
/// H = 4096 a 2048-row chunk is already 0.5 TFLOP per GEMM); smaller ones add
/// per-chunk launch and cuBLASLt overhead. Throws config_error for V < 1.
constexpr std::int64_t lm_head_cross_entropy_default_chunk(std::int64_t V) {
  if (V < 1) throw config_error("lm_head_cross_entropy (cuda): need V >= 1");
  const std::int64_t r = static_cast<std::int64_t>(lm_head_ce_logits_budget / sizeof(float)) / V;
  if (r >= 64) return r - r % 64;
  return std::max<std::int64_t>(r, 1);
}

/// The softmax cross-entropy row kernel over `rows` rows of one chunk: one
/// block of lm_head_ce_threads per row (rows beyond the grid limit are taken
/// by a grid-stride loop). The block's reduction tree depends on V only.
constexpr launch_config lm_head_ce_row_config(std::int64_t rows, std::int64_t V) {
  if (rows < 0 || V < 1) throw config_error("lm_head_cross_entropy (cuda): need rows >= 0, V >= 1");
  launch_config c;
  c.grid_x = std::max<std::int64_t>(1, std::min(rows, launch_limits::max_grid_x));
  c.block = lm_head_ce_threads;
  c.smem = lm_head_ce_smem_bound;
  return c;
}

/// The final loss reduction: one block adds the N per-row losses (float64),
/// thread t the rows t, t + 256, ... in order, then a CUB block tree: the
/// same N gives the same bits, whatever the chunk.
constexpr launch_config lm_head_ce_loss_config(std::int64_t N) {
  if (N < 0) throw config_error("lm_head_cross_entropy (cuda): need N >= 0");
  launch_config c;
  c.block = lm_head_ce_threads;
  c.smem = lm_head_ce_smem_bound;
  return c;
}

/// Zeroing the dx rows of ignored positions after the input-gradient GEMM:
/// one block per token row (grid-stride beyond the limit); a block whose
/// row is scored returns at once.
constexpr launch_config lm_head_ce_zero_rows_config(std::int64_t N) {
  if (N < 0) throw config_error("lm_head_cross_entropy (cuda): need N >= 0");
  launch_config c;
  c.grid_x = std::max<std::int64_t>(1, std::min(N, launch_limits::max_grid_x));
  c.block = lm_head_ce_threads;
  return c;
}

// ==== end: fused LM head and cross-entropy ======================================================

}  // namespace tessera::kernels::cuda
