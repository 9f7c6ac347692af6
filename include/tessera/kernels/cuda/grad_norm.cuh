#pragma once
/// \file kernels/cuda/grad_norm.cuh
/// Global gradient sum of squares (float64, deterministic) and the clip
/// coefficient on the GPU (declared and documented in kernels/cuda/kernels.hpp).
///
/// Stage 1: grad_norm_partial_config(n).grid_x blocks (a function of n only)
/// each sum a grid-stride share in float64 with a CUB block reduction and
/// write one partial. Stage 2: one block adds the partials, each thread a
/// fixed strided subset in order, then a CUB block reduction. Same n, same
/// bits, on any GPU.

#include <cub/block/block_reduce.cuh>

#include <math.h>

#include "tessera/kernels/cuda/common.cuh"
#include "tessera/kernels/detail/clip.hpp"
#include "tessera/kernels/cuda/kernels.hpp"

namespace tessera::kernels::cuda {

namespace detail {

template <class G, int V>
__global__ void __launch_bounds__(grad_norm_threads)
    sum_squares_partial_kernel(double* partial, const G* g, std::int64_t n) {
  using block_reduce = cub::BlockReduce<double, grad_norm_threads>;
  struct shared_storage {
    typename block_reduce::TempStorage reduce;
  };
  static_assert(sizeof(shared_storage) <= grad_norm_smem_bound);
  __shared__ shared_storage sm;
  double s = 0.0;
  elementwise_apply<V>(n, [&]<int W>(std::int64_t i) {
    const pack<G, W> p = load_pack<W>(g + i);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const double x = static_cast<double>(to<float>(p.v[k]));
      s += x * x;
    }
  });
  const double total = block_reduce(sm.reduce).Sum(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

__global__ void __launch_bounds__(grad_norm_threads)
    sum_squares_final_kernel(double* out, const double* partial, std::int64_t count,
                             bool accumulate) {
  using block_reduce = cub::BlockReduce<double, grad_norm_threads>;
  struct shared_storage {
    typename block_reduce::TempStorage reduce;
  };
  static_assert(sizeof(shared_storage) <= grad_norm_smem_bound);
  __shared__ shared_storage sm;
  double s = 0.0;
  for (std::int64_t i = threadIdx.x; i < count; i += grad_norm_threads) s += partial[i];
  const double total = block_reduce(sm.reduce).Sum(s);
  if (threadIdx.x == 0) *out = accumulate ? *out + total : total;
}

__global__ void clip_coefficient_kernel(float* coef, const double* sum_squares, double max_norm) {
  *coef = static_cast<float>(clip_coefficient_of(sqrt(*sum_squares), max_norm));
}

}  // namespace detail

template <class G>
void grad_sum_squares(double* d_out, const G* d_g, std::int64_t n, void* d_scratch,
                      std::size_t scratch_bytes, cudaStream_t stream, bool accumulate) {
  const launch_config c = grad_norm_partial_config(n);
  TESSERA_THROW_IF(scratch_bytes < c.scratch_bytes, config_error,
                   "grad_sum_squares (cuda): scratch of ", scratch_bytes, " bytes is below the ",
                   c.scratch_bytes, " that n=", n, " needs (grad_sum_squares_scratch_bytes)");
  double* partial = static_cast<double*>(d_scratch);
  constexpr int V = detail::vec_width<G>;
  if (detail::all_aligned(16, d_g))
    detail::sum_squares_partial_kernel<G, V>
        <<<detail::grid_of(c), c.block, 0, stream>>>(partial, d_g, n);
  else
    detail::sum_squares_partial_kernel<G, 1>
        <<<detail::grid_of(c), c.block, 0, stream>>>(partial, d_g, n);
  TESSERA_CUDA_CHECK_LAUNCH("sum_squares_partial_kernel");
  detail::sum_squares_final_kernel<<<1, grad_norm_threads, 0, stream>>>(d_out, partial, c.grid_x,
                                                                        accumulate);
  TESSERA_CUDA_CHECK_LAUNCH("sum_squares_final_kernel");
}

template <class F>
void clip_coefficient(F* d_coef, const double* d_sum_squares, double max_norm,
                      cudaStream_t stream) {
  static_assert(std::is_same_v<F, float>, "clip_coefficient writes a float");
  detail::clip_coefficient_kernel<<<1, 1, 0, stream>>>(d_coef, d_sum_squares, max_norm);
  TESSERA_CUDA_CHECK_LAUNCH("clip_coefficient_kernel");
}

}  // namespace tessera::kernels::cuda
