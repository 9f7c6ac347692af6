#pragma once
/// \file kernels/cuda/cross_entropy.cuh
/// The kernels of the fused LM head and cross-entropy (declared and
/// documented in kernels/cuda/cross_entropy.hpp) and the chunk loop that
/// calls them between the cuBLASLt GEMMs. nvcc only; cuda/kernels_cross_entropy.cu
/// compiles it once into tessera::cuda_kernels. Per-element arithmetic:
/// kernels/detail/cross_entropy.hpp, the same functions as the host loop.
///
/// Gradient contract (llm.c): dwlm accumulates (+=), dx is written (=).
///
/// Per chunk of C rows (the scratch layout is lm_head_ce_scratch_layout):
///   logits (C, V) f32 = x_chunk (C, H) wlm (V, H)^T           linear_forward
///   row_loss[r0 + i], dlogits (C, V) bf16                      ce_softmax_kernel
///   dx_chunk (C, H) bf16 = dlogits wlm                         linear_backward_input
///   dwlm (V, H) f32 += dlogits^T x_chunk                       linear_backward_weight
/// then once: dx rows of ignored positions = 0 (ce_zero_ignored_rows_kernel)
/// and *loss_sum = sum of row_loss in a fixed order (ce_loss_sum_kernel).
///
/// The vocabulary-parallel form (its chunk loop is in kernels/cuda/ops.hpp,
/// between the tp group's all-reduces) over this rank's logits (C, Vl):
///   row maxima (C) f32 over the real columns    vp_ce_row_max_kernel
///   all-reduce(max)
///   sums of exp (C) and owned target logits (C)  vp_ce_row_sums_kernel
///   all-reduce(sum) of the 2C values
///   row_loss, dlogits (C, Vl) bf16, padding 0    vp_ce_row_grad_kernel
///   dx partial sum, dwlm += as above, then lm_head_ce_finish_impl.

#include <cub/block/block_reduce.cuh>

#include "tessera/kernels/cuda/common.cuh"
#include "tessera/kernels/cuda/cross_entropy.hpp"
#include "tessera/kernels/detail/cross_entropy.hpp"

namespace tessera::kernels::cuda {

namespace detail {

using ce_state = kernels::detail::ce_online<float>;

/// CUB reduction operator of the online softmax normaliser.
struct ce_combine_op {
  __device__ __forceinline__ ce_state operator()(const ce_state& a, const ce_state& b) const {
    return kernels::detail::ce_online_combine(a, b);
  }
};

/// One block per row of the chunk: row r of `logits` (rows, V) float32 with
/// target targets[r]. Writes row_loss[r] (float64; 0 when ignored, NaN when
/// the target is outside [0, V)) and, if `dlogits` is not null, row r of
/// dlogits (rows, V) bf16 = grad_scale * (softmax - onehot) (0 when ignored,
/// NaN when the target is outside [0, V)). W logits per access (4: 16-byte
/// loads, 8-byte bf16 stores; 1: any V and alignment).
template <int W>
__global__ void __launch_bounds__(lm_head_ce_threads)
    ce_softmax_kernel(double* row_loss, bf16* dlogits, const float* logits,
                      const std::int32_t* targets, std::int64_t rows, std::int64_t V,
                      std::int32_t ignore_index, float grad_scale) {
  using block_reduce = cub::BlockReduce<ce_state, lm_head_ce_threads>;
  struct shared_storage {
    typename block_reduce::TempStorage reduce;
    float max;
    float inv_sum;
  };
  static_assert(sizeof(shared_storage) <= lm_head_ce_smem_bound);
  __shared__ shared_storage sm;
  constexpr std::int64_t step = static_cast<std::int64_t>(lm_head_ce_threads) * W;
  const std::int64_t first = static_cast<std::int64_t>(threadIdx.x) * W;
  for (std::int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const float* z = logits + row * V;
    bf16* dz = dlogits != nullptr ? dlogits + row * V : nullptr;
    const std::int32_t y = targets[row];  // the same for every thread: uniform branches
    if (y == ignore_index) {
      if (threadIdx.x == 0) row_loss[row] = 0.0;
      if (dz != nullptr)
        for (std::int64_t i = first; i < V; i += step) {
          pack<bf16, W> o;
#pragma unroll
          for (int k = 0; k < W; ++k) o.v[k] = bf16::from_bits(0);
          store_pack<W>(dz + i, o);
        }
      continue;  // no shared memory touched: no barrier needed
    }

    // Pass 1: running (max, sum exp) per thread, merged by a CUB block tree.
    ce_state s{-INFINITY, 0.f};
    for (std::int64_t i = first; i < V; i += step) {
      const pack<float, W> p = load_pack<W>(z + i);
#pragma unroll
      for (int k = 0; k < W; ++k) s = kernels::detail::ce_online_update(s, p.v[k]);
    }
    const ce_state total = block_reduce(sm.reduce).Reduce(s, ce_combine_op{});
    if (threadIdx.x == 0) {
      const bool valid = y >= 0 && y < V;
      const float nan = __int_as_float(0x7fc00000);
      row_loss[row] =
          valid ? static_cast<double>(kernels::detail::ce_row_loss(total.max, total.sum, z[y]))
                : static_cast<double>(nan);
      sm.max = total.max;
      sm.inv_sum = valid ? 1.f / total.sum : nan;  // NaN: the whole gradient row shows it
    }
    __syncthreads();

    // Pass 2 (training): grad_scale * (softmax - onehot), rounded once to bf16.
    if (dz != nullptr) {
      const float mx = sm.max, inv = sm.inv_sum;
      for (std::int64_t i = first; i < V; i += step) {
        const pack<float, W> p = load_pack<W>(z + i);
        pack<bf16, W> o;
#pragma unroll
        for (int k = 0; k < W; ++k)
          o.v[k] = to<bf16>(kernels::detail::ce_dlogit(kernels::detail::ce_exp(p.v[k], mx), inv,
                                                       i + k == y, grad_scale));
        store_pack<W>(dz + i, o);
      }
    }
    __syncthreads();  // sm is reused by the block's next row
  }
}

/// dx rows (N, H) bf16 of ignored positions set to 0 (whatever the GEMM made
/// of 0 * wlm, e.g. with a non-finite weight), as the host does. W bf16 per
/// 16-byte store, or 1.
template <int W>
__global__ void __launch_bounds__(lm_head_ce_threads)
    ce_zero_ignored_rows_kernel(bf16* dx, const std::int32_t* targets, std::int64_t N,
                                std::int64_t H, std::int32_t ignore_index) {
  constexpr std::int64_t step = static_cast<std::int64_t>(lm_head_ce_threads) * W;
  for (std::int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    if (targets[row] != ignore_index) continue;
    bf16* d = dx + row * H;
    for (std::int64_t i = static_cast<std::int64_t>(threadIdx.x) * W; i < H; i += step) {
      pack<bf16, W> o;
#pragma unroll
      for (int k = 0; k < W; ++k) o.v[k] = bf16::from_bits(0);
      store_pack<W>(d + i, o);
    }
  }
}

/// *loss_sum = sum of row_loss[0, N): thread t adds rows t, t + 256, ... in
/// order (float64), then a CUB block tree. One block; the order depends on N only.
__global__ void __launch_bounds__(lm_head_ce_threads)
    ce_loss_sum_kernel(double* loss_sum, const double* row_loss, std::int64_t N) {
  using block_reduce = cub::BlockReduce<double, lm_head_ce_threads>;
  struct shared_storage {
    typename block_reduce::TempStorage reduce;
  };
  static_assert(sizeof(shared_storage) <= lm_head_ce_smem_bound);
  __shared__ shared_storage sm;
  double s = 0.0;
  for (std::int64_t i = threadIdx.x; i < N; i += lm_head_ce_threads) s += row_loss[i];
  const double total = block_reduce(sm.reduce).Sum(s);
  if (threadIdx.x == 0) *loss_sum = total;
}

/// CUB reduction operator: the larger of two floats.
struct ce_max_op {
  __device__ __forceinline__ float operator()(float a, float b) const { return a > b ? a : b; }
};

/// vocab_parallel_ce_row_max (cross_entropy.hpp): one block per row.
__global__ void __launch_bounds__(lm_head_ce_threads)
    vp_ce_row_max_kernel(float* row_max, const float* logits, std::int64_t rows, std::int64_t Vl,
                         std::int64_t real) {
  using block_reduce = cub::BlockReduce<float, lm_head_ce_threads>;
  __shared__ typename block_reduce::TempStorage tmp;
  for (std::int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const float* z = logits + row * Vl;
    float m = -INFINITY;
    for (std::int64_t i = threadIdx.x; i < real; i += lm_head_ce_threads) m = m > z[i] ? m : z[i];
    const float total = block_reduce(tmp).Reduce(m, ce_max_op{});
    if (threadIdx.x == 0) row_max[row] = total;
    __syncthreads();  // tmp is reused by the block's next row
  }
}

/// vocab_parallel_ce_row_sums (cross_entropy.hpp): one block per row.
__global__ void __launch_bounds__(lm_head_ce_threads)
    vp_ce_row_sums_kernel(float* sums, const float* logits, const float* row_max,
                          const std::int32_t* targets, std::int64_t rows, std::int64_t V,
                          std::int64_t v_begin, std::int64_t Vl, std::int64_t real,
                          std::int32_t ignore_index) {
  using block_reduce = cub::BlockReduce<float, lm_head_ce_threads>;
  __shared__ typename block_reduce::TempStorage tmp;
  for (std::int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const std::int32_t y = targets[row];  // uniform over the block
    if (y == ignore_index) {
      if (threadIdx.x == 0) sums[row] = sums[rows + row] = 0.f;
      continue;  // no shared memory touched
    }
    const float* z = logits + row * Vl;
    const float mx = row_max[row];
    float s = 0.f;
    for (std::int64_t i = threadIdx.x; i < real; i += lm_head_ce_threads)
      s += kernels::detail::ce_exp(z[i], mx);
    const float total = block_reduce(tmp).Sum(s);
    if (threadIdx.x == 0) {
      const std::int64_t yl = static_cast<std::int64_t>(y) - v_begin;
      const bool valid = y >= 0 && y < V;
      sums[row] = total;
      sums[rows + row] = !valid ? __int_as_float(0x7fc00000) : (yl >= 0 && yl < real) ? z[yl] : 0.f;
    }
    __syncthreads();
  }
}

/// vocab_parallel_ce_row_grad (cross_entropy.hpp): one block per row.
__global__ void __launch_bounds__(lm_head_ce_threads)
    vp_ce_row_grad_kernel(double* row_loss, bf16* dlogits, const float* logits,
                          const float* row_max, const float* sums, const std::int32_t* targets,
                          std::int64_t rows, std::int64_t v_begin, std::int64_t Vl,
                          std::int64_t real, std::int32_t ignore_index, float grad_scale) {
  for (std::int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const std::int32_t y = targets[row];
    bf16* dz = dlogits != nullptr ? dlogits + row * Vl : nullptr;
    if (y == ignore_index) {
      if (threadIdx.x == 0) row_loss[row] = 0.0;
      if (dz != nullptr)
        for (std::int64_t i = threadIdx.x; i < Vl; i += lm_head_ce_threads)
          dz[i] = bf16::from_bits(0);
      continue;
    }
    const float mx = row_max[row], se = sums[row], target = sums[rows + row];
    if (threadIdx.x == 0)
      row_loss[row] = static_cast<double>(kernels::detail::ce_row_loss(mx, se, target));
    if (dz == nullptr) continue;
    // A NaN target logit (a target outside [0, V)) makes the whole row NaN.
    const float inv = (target == target) ? 1.f / se : target;
    const float* z = logits + row * Vl;
    const std::int64_t yl = static_cast<std::int64_t>(y) - v_begin;
    for (std::int64_t i = threadIdx.x; i < Vl; i += lm_head_ce_threads)
      dz[i] = i < real ? to<bf16>(kernels::detail::ce_dlogit(kernels::detail::ce_exp(z[i], mx),
                                                             inv, i == yl, grad_scale))
                       : bf16::from_bits(0);  // padding: no gradient
  }
}

/// Throws config_error unless rows >= 0, Vl >= 1 and 0 <= real <= Vl.
inline void vp_check(const char* who, std::int64_t rows, std::int64_t Vl, std::int64_t real) {
  TESSERA_THROW_IF(rows < 0 || Vl < 1 || real < 0 || real > Vl, config_error, who, ": rows=", rows,
                   " Vl=", Vl, " real=", real, " must satisfy rows >= 0, Vl >= 1, 0 <= real <= Vl");
}

inline void vocab_parallel_ce_row_max_impl(float* d_max, const float* d_logits, std::int64_t rows,
                                           std::int64_t Vl, std::int64_t real,
                                           cudaStream_t stream) {
  vp_check("vocab_parallel_ce_row_max", rows, Vl, real);
  if (rows == 0) return;
  const launch_config rc = lm_head_ce_row_config(rows, Vl);
  vp_ce_row_max_kernel<<<grid_of(rc), rc.block, 0, stream>>>(d_max, d_logits, rows, Vl, real);
  TESSERA_CUDA_CHECK_LAUNCH("vp_ce_row_max_kernel");
}

inline void vocab_parallel_ce_row_sums_impl(float* d_sums, const float* d_logits,
                                            const float* d_max, const std::int32_t* d_targets,
                                            std::int64_t rows, std::int64_t V,
                                            std::int64_t v_begin, std::int64_t Vl,
                                            std::int64_t real, std::int32_t ignore_index,
                                            cudaStream_t stream) {
  vp_check("vocab_parallel_ce_row_sums", rows, Vl, real);
  if (rows == 0) return;
  const launch_config rc = lm_head_ce_row_config(rows, Vl);
  vp_ce_row_sums_kernel<<<grid_of(rc), rc.block, 0, stream>>>(
      d_sums, d_logits, d_max, d_targets, rows, V, v_begin, Vl, real, ignore_index);
  TESSERA_CUDA_CHECK_LAUNCH("vp_ce_row_sums_kernel");
}

inline void vocab_parallel_ce_row_grad_impl(double* d_row_loss, bf16* d_dlogits,
                                            const float* d_logits, const float* d_max,
                                            const float* d_sums, const std::int32_t* d_targets,
                                            std::int64_t rows, std::int64_t v_begin,
                                            std::int64_t Vl, std::int64_t real,
                                            std::int32_t ignore_index, float grad_scale,
                                            cudaStream_t stream) {
  vp_check("vocab_parallel_ce_row_grad", rows, Vl, real);
  if (rows == 0) return;
  const launch_config rc = lm_head_ce_row_config(rows, Vl);
  vp_ce_row_grad_kernel<<<grid_of(rc), rc.block, 0, stream>>>(
      d_row_loss, d_dlogits, d_logits, d_max, d_sums, d_targets, rows, v_begin, Vl, real,
      ignore_index, grad_scale);
  TESSERA_CUDA_CHECK_LAUNCH("vp_ce_row_grad_kernel");
}

/// The end of the chunk loop: ignored dx rows zeroed, the loss summed.
inline void lm_head_ce_finish_impl(double* d_loss_sum, const double* d_row_loss, bf16* d_dx,
                                   const std::int32_t* d_targets, std::int64_t N, std::int64_t H,
                                   std::int32_t ignore_index, cudaStream_t stream) {
  if (d_dx != nullptr && N > 0) {
    const launch_config zc = lm_head_ce_zero_rows_config(N);
    constexpr int W = vec_width<bf16>;
    if (H % W == 0 && all_aligned(16, d_dx))
      ce_zero_ignored_rows_kernel<W>
          <<<grid_of(zc), zc.block, 0, stream>>>(d_dx, d_targets, N, H, ignore_index);
    else
      ce_zero_ignored_rows_kernel<1>
          <<<grid_of(zc), zc.block, 0, stream>>>(d_dx, d_targets, N, H, ignore_index);
    TESSERA_CUDA_CHECK_LAUNCH("ce_zero_ignored_rows_kernel");
  }
  const launch_config lc = lm_head_ce_loss_config(N);
  ce_loss_sum_kernel<<<grid_of(lc), lc.block, 0, stream>>>(d_loss_sum, d_row_loss, N);
  TESSERA_CUDA_CHECK_LAUNCH("ce_loss_sum_kernel");
}

/// The chunk loop of lm_head_cross_entropy (arguments and contract there).
inline void lm_head_cross_entropy_impl(cublaslt_context& ctx, double* d_loss_sum, const bf16* d_x,
                                       const bf16* d_wlm, const std::int32_t* d_targets,
                                       std::int64_t N, std::int64_t V, std::int64_t H,
                                       std::int32_t ignore_index, float grad_scale, bf16* d_dx,
                                       float* d_dwlm, std::int64_t chunk, void* d_scratch,
                                       std::size_t scratch_bytes, cudaStream_t stream) {
  // Every check before any work (the layout throws for bad sizes).
  const lm_head_ce_scratch lay = lm_head_ce_scratch_layout(N, V, H, chunk);
  TESSERA_THROW_IF(d_loss_sum == nullptr, config_error,
                   "lm_head_cross_entropy (cuda): d_loss_sum is null");
  TESSERA_THROW_IF(N > 0 && (d_x == nullptr || d_wlm == nullptr || d_targets == nullptr),
                   config_error, "lm_head_cross_entropy (cuda): N=", N,
                   " rows but d_x, d_wlm or d_targets is null");
  TESSERA_THROW_IF((d_dx == nullptr) != (d_dwlm == nullptr), config_error,
                   "lm_head_cross_entropy (cuda): pass both d_dx and d_dwlm (training) or neither "
                   "(evaluation); got d_dx ",
                   d_dx ? "set" : "null", ", d_dwlm ", d_dwlm ? "set" : "null");
  TESSERA_THROW_IF(scratch_bytes < lay.bytes || d_scratch == nullptr, config_error,
                   "lm_head_cross_entropy (cuda): scratch of ", scratch_bytes, " bytes",
                   d_scratch == nullptr ? " (null)" : "", " is below the ", lay.bytes,
                   " that N=", N, " V=", V, " H=", H, " chunk=", chunk,
                   " need (lm_head_cross_entropy_scratch_bytes)");
  TESSERA_THROW_IF(!all_aligned(lm_head_ce_scratch_align, d_scratch), config_error,
                   "lm_head_cross_entropy (cuda): scratch pointer is not aligned to ",
                   lm_head_ce_scratch_align, " bytes");
  const bool grad = d_dx != nullptr;

  auto* base = static_cast<unsigned char*>(d_scratch);
  float* logits = reinterpret_cast<float*>(base + lay.logits);
  bf16* dlogits = grad ? reinterpret_cast<bf16*>(base + lay.dlogits) : nullptr;
  double* row_loss = reinterpret_cast<double*>(base + lay.row_loss);

  // Rows start at multiples of V elements from 256-byte aligned regions.
  const bool vec = V % 4 == 0;
  for (std::int64_t r0 = 0; r0 < N; r0 += lay.rows) {
    const std::int64_t c = std::min(lay.rows, N - r0);
    const bf16* xc = d_x + r0 * H;
    linear_forward<float>(ctx, logits, xc, d_wlm, c, V, H, stream);
    const launch_config rc = lm_head_ce_row_config(c, V);
    if (vec)
      ce_softmax_kernel<4><<<grid_of(rc), rc.block, 0, stream>>>(
          row_loss + r0, dlogits, logits, d_targets + r0, c, V, ignore_index, grad_scale);
    else
      ce_softmax_kernel<1><<<grid_of(rc), rc.block, 0, stream>>>(
          row_loss + r0, dlogits, logits, d_targets + r0, c, V, ignore_index, grad_scale);
    TESSERA_CUDA_CHECK_LAUNCH("ce_softmax_kernel");
    if (!grad) continue;
    linear_backward_input<bf16>(ctx, d_dx + r0 * H, dlogits, d_wlm, c, V, H, stream);
    linear_backward_weight(ctx, d_dwlm, dlogits, xc, c, V, H, stream);
  }

  lm_head_ce_finish_impl(d_loss_sum, row_loss, grad ? d_dx : nullptr, d_targets, N, H,
                         ignore_index, stream);
}

}  // namespace detail

}  // namespace tessera::kernels::cuda
