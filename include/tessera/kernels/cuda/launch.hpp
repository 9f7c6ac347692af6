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

/// Stage 1: min(ceil(n / (256 * 8)), 1024) blocks each reduce a grid-stride
/// share in float64 and write one partial (scratch: 8 bytes a block); stage 2
/// (one block) adds the partials in a fixed tree. Deterministic for a given n.
constexpr launch_config grad_norm_partial_config(std::int64_t n) {
  if (n < 0) throw config_error("grad_sum_squares (cuda): negative n");
  launch_config c;
  c.block = grad_norm_threads;
  c.grid_x = std::clamp<std::int64_t>(detail::ceil_div(n, std::int64_t(grad_norm_threads) * 8), 1,
                                      grad_norm_max_blocks);
  c.smem = grad_norm_smem_bound;
  c.scratch_bytes = static_cast<std::size_t>(c.grid_x) * sizeof(double);
  return c;
}

/// Device scratch bytes grad_sum_squares needs for n elements.
constexpr std::size_t grad_sum_squares_scratch_bytes(std::int64_t n) {
  return grad_norm_partial_config(n).scratch_bytes;
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

}  // namespace tessera::kernels::cuda
