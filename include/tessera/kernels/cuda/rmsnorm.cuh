#pragma once
/// \file kernels/cuda/rmsnorm.cuh
/// RMSNorm forward and backward on the GPU (declared and documented in
/// kernels/cuda/kernels.hpp). Per-element arithmetic: kernels/detail/rmsnorm.hpp,
/// the same functions as the host loop.
///
/// Gradient contract (llm.c): dweight accumulates (+=), dinp is written (=)
/// unless accumulate_dinp. Forward and dinp: one block of 256 threads per
/// row, a CUB block reduction, 16-byte loads when aligned. dweight: partial
/// sums over 256-row chunks into scratch, then a per-column sum in chunk
/// order: deterministic, no atomics.

#include <cub/block/block_reduce.cuh>

#include "tessera/kernels/cuda/common.cuh"
#include "tessera/kernels/cuda/kernels.hpp"
#include "tessera/kernels/detail/rmsnorm.hpp"

namespace tessera::kernels::cuda {

namespace detail {

template <class T, int V>
__global__ void __launch_bounds__(rmsnorm_threads)
    rmsnorm_forward_kernel(T* out, float* rstd, const T* inp, const T* weight, std::int64_t N,
                           std::int64_t H, float eps) {
  using block_reduce = cub::BlockReduce<float, rmsnorm_threads>;
  struct shared_storage {
    typename block_reduce::TempStorage reduce;
    float rstd;
  };
  static_assert(sizeof(shared_storage) <= rmsnorm_smem_bound);
  __shared__ shared_storage sm;
  const float Hf = static_cast<float>(H);
  for (std::int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const T* x = inp + row * H;
    T* y = out + row * H;
    float ss = 0.f;
    for (std::int64_t i = static_cast<std::int64_t>(threadIdx.x) * V; i < H;
         i += static_cast<std::int64_t>(rmsnorm_threads) * V) {
      const pack<T, V> p = load_pack<V>(x + i);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float v = to<float>(p.v[k]);
        ss += v * v;
      }
    }
    const float total = block_reduce(sm.reduce).Sum(ss);
    if (threadIdx.x == 0) {
      const float r = kernels::detail::rmsnorm_rstd(total, Hf, eps);
      sm.rstd = r;
      rstd[row] = r;
    }
    __syncthreads();
    const float r = sm.rstd;
    for (std::int64_t i = static_cast<std::int64_t>(threadIdx.x) * V; i < H;
         i += static_cast<std::int64_t>(rmsnorm_threads) * V) {
      const pack<T, V> p = load_pack<V>(x + i);
      const pack<T, V> w = load_pack<V>(weight + i);
      pack<T, V> o;
#pragma unroll
      for (int k = 0; k < V; ++k)
        o.v[k] = to<T>(kernels::detail::rmsnorm_out(to<float>(p.v[k]), to<float>(w.v[k]), r));
      store_pack<V>(y + i, o);
    }
    __syncthreads();  // sm is reused by the next row
  }
}

template <class T, class G, int V>
__global__ void __launch_bounds__(rmsnorm_threads)
    rmsnorm_dinp_kernel(G* dinp, const G* dout, const T* inp, const T* weight, const float* rstd,
                        std::int64_t N, std::int64_t H, bool accumulate) {
  using block_reduce = cub::BlockReduce<float, rmsnorm_threads>;
  struct shared_storage {
    typename block_reduce::TempStorage reduce;
    float mean;
  };
  static_assert(sizeof(shared_storage) <= rmsnorm_smem_bound);
  __shared__ shared_storage sm;
  const float Hf = static_cast<float>(H);
  for (std::int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const T* x = inp + row * H;
    const G* dy = dout + row * H;
    G* dx = dinp + row * H;
    const float r = rstd[row];
    float dot = 0.f;  // sum_h w dy xhat
    for (std::int64_t i = static_cast<std::int64_t>(threadIdx.x) * V; i < H;
         i += static_cast<std::int64_t>(rmsnorm_threads) * V) {
      const pack<T, V> xp = load_pack<V>(x + i);
      const pack<T, V> wp = load_pack<V>(weight + i);
      const pack<G, V> gp = load_pack<V>(dy + i);
#pragma unroll
      for (int k = 0; k < V; ++k)
        dot += to<float>(wp.v[k]) * to<float>(gp.v[k]) * (to<float>(xp.v[k]) * r);
    }
    const float total = block_reduce(sm.reduce).Sum(dot);
    if (threadIdx.x == 0) sm.mean = total / Hf;
    __syncthreads();
    const float mean = sm.mean;
    for (std::int64_t i = static_cast<std::int64_t>(threadIdx.x) * V; i < H;
         i += static_cast<std::int64_t>(rmsnorm_threads) * V) {
      const pack<T, V> xp = load_pack<V>(x + i);
      const pack<T, V> wp = load_pack<V>(weight + i);
      const pack<G, V> gp = load_pack<V>(dy + i);
      pack<G, V> o;
      if (accumulate) o = load_pack<V>(dx + i);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float g = kernels::detail::rmsnorm_dx(to<float>(gp.v[k]), to<float>(wp.v[k]),
                                                    to<float>(xp.v[k]) * r, r, mean);
        o.v[k] = to<G>(accumulate ? to<float>(o.v[k]) + g : g);
      }
      store_pack<V>(dx + i, o);
    }
    __syncthreads();
  }
}

// partial[c, h] = sum over rows n of chunk c of dout[n,h] * inp[n,h] * rstd[n], in order of n.
template <class T, class G>
__global__ void __launch_bounds__(rmsnorm_dweight_threads)
    rmsnorm_dweight_partial_kernel(float* partial, const G* dout, const T* inp, const float* rstd,
                                   std::int64_t N, std::int64_t H) {
  const std::int64_t h =
      static_cast<std::int64_t>(blockIdx.y) * rmsnorm_dweight_threads + threadIdx.x;
  if (h >= H) return;
  const std::int64_t n0 = static_cast<std::int64_t>(blockIdx.x) * rmsnorm_dweight_rows;
  const std::int64_t n1 = n0 + rmsnorm_dweight_rows < N ? n0 + rmsnorm_dweight_rows : N;
  float acc = 0.f;
  for (std::int64_t n = n0; n < n1; ++n)
    acc += to<float>(dout[n * H + h]) * (to<float>(inp[n * H + h]) * rstd[n]);
  partial[static_cast<std::int64_t>(blockIdx.x) * H + h] = acc;
}

// dweight[h] += sum_c partial[c, h], chunks in order.
__global__ void __launch_bounds__(rmsnorm_dweight_threads)
    rmsnorm_dweight_reduce_kernel(float* dweight, const float* partial, std::int64_t chunks,
                                  std::int64_t H) {
  const std::int64_t h =
      static_cast<std::int64_t>(blockIdx.x) * rmsnorm_dweight_threads + threadIdx.x;
  if (h >= H) return;
  float s = 0.f;
  for (std::int64_t c = 0; c < chunks; ++c) s += partial[c * H + h];
  dweight[h] += s;
}

}  // namespace detail

template <class T>
void rmsnorm_forward(T* d_out, float* d_rstd, const T* d_inp, const T* d_weight, std::int64_t N,
                     std::int64_t H, double eps, cudaStream_t stream) {
  TESSERA_THROW_IF(!(eps >= 0), config_error, "rmsnorm_forward (cuda): eps=", eps, " must be >= 0");
  const launch_config c = rmsnorm_row_config(N, H);
  if (N == 0) return;
  constexpr int V = detail::vec_width<T>;
  const float e = static_cast<float>(eps);
  if (H % V == 0 && detail::all_aligned(16, d_out, d_inp, d_weight))
    detail::rmsnorm_forward_kernel<T, V>
        <<<detail::grid_of(c), c.block, 0, stream>>>(d_out, d_rstd, d_inp, d_weight, N, H, e);
  else
    detail::rmsnorm_forward_kernel<T, 1>
        <<<detail::grid_of(c), c.block, 0, stream>>>(d_out, d_rstd, d_inp, d_weight, N, H, e);
  TESSERA_CUDA_CHECK_LAUNCH("rmsnorm_forward_kernel");
}

template <class T, class G>
void rmsnorm_backward(G* d_dinp, float* d_dweight, const G* d_dout, const T* d_inp,
                      const T* d_weight, const float* d_rstd, std::int64_t N, std::int64_t H,
                      void* d_scratch, std::size_t scratch_bytes, cudaStream_t stream,
                      bool accumulate_dinp) {
  static_assert(std::is_same_v<G, float> || (std::is_same_v<T, bf16> && std::is_same_v<G, bf16>),
                "tessera::kernels::cuda::rmsnorm_backward: G must be float, or bf16 with bf16 T");
  const launch_config rows = rmsnorm_row_config(N, H);
  const launch_config part = rmsnorm_dweight_partial_config(N, H);
  const launch_config red = rmsnorm_dweight_reduce_config(H);
  TESSERA_THROW_IF(scratch_bytes < part.scratch_bytes, config_error,
                   "rmsnorm_backward (cuda): scratch of ", scratch_bytes, " bytes is below the ",
                   part.scratch_bytes, " that N=", N, " H=", H,
                   " need (rmsnorm_backward_scratch_bytes)");
  if (N == 0) return;
  constexpr int V = detail::vec_width<T, G>;
  if (H % V == 0 && detail::all_aligned(16, d_dinp, d_dout) &&
      detail::all_aligned(V * sizeof(T), d_inp, d_weight))
    detail::rmsnorm_dinp_kernel<T, G, V><<<detail::grid_of(rows), rows.block, 0, stream>>>(
        d_dinp, d_dout, d_inp, d_weight, d_rstd, N, H, accumulate_dinp);
  else
    detail::rmsnorm_dinp_kernel<T, G, 1><<<detail::grid_of(rows), rows.block, 0, stream>>>(
        d_dinp, d_dout, d_inp, d_weight, d_rstd, N, H, accumulate_dinp);
  TESSERA_CUDA_CHECK_LAUNCH("rmsnorm_dinp_kernel");
  float* partial = static_cast<float*>(d_scratch);
  detail::rmsnorm_dweight_partial_kernel<T, G>
      <<<detail::grid_of(part), part.block, 0, stream>>>(partial, d_dout, d_inp, d_rstd, N, H);
  TESSERA_CUDA_CHECK_LAUNCH("rmsnorm_dweight_partial_kernel");
  detail::rmsnorm_dweight_reduce_kernel<<<detail::grid_of(red), red.block, 0, stream>>>(
      d_dweight, partial, part.grid_x, H);
  TESSERA_CUDA_CHECK_LAUNCH("rmsnorm_dweight_reduce_kernel");
}

}  // namespace tessera::kernels::cuda
