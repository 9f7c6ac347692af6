#pragma once
/// \file kernels/cuda/embedding.cuh
/// Token embedding forward (row gather) and backward (scatter-add) on the GPU
/// (declared and documented in kernels/cuda/kernels.hpp).
///
/// Gradient contract (llm.c): dwte accumulates (+=).
///
/// The backward is deterministic without atomics and without sorting: block
/// (b, c) owns vocabulary rows [64 b, 64 b + 64) and columns
/// [1024 c, 1024 c + 1024) of dwte. It scans all tokens in tiles of 1024,
/// compacts the positions whose token it owns with a CUB block scan (which
/// keeps their order), and adds those dout rows one after another, so each
/// dwte element is the same sequence of float additions as on the host.
/// Cost: every block reads every token id (N * 4 bytes, from L2); dout is
/// read exactly once in all.

#include <cub/block/block_scan.cuh>

#include "tessera/kernels/cuda/common.cuh"
#include "tessera/kernels/cuda/kernels.hpp"

namespace tessera::kernels::cuda {

namespace detail {

template <class T, int V>
__global__ void __launch_bounds__(embedding_threads)
    embedding_forward_kernel(T* out, const std::int32_t* tokens, const T* wte, std::int64_t N,
                             std::int64_t V_rows, std::int64_t H) {
  for (std::int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const std::int64_t t = tokens[n];
    T* dst = out + n * H;
    const bool ok = t >= 0 && t < V_rows;
    const T* src = wte + (ok ? t : 0) * H;
    for (std::int64_t h = static_cast<std::int64_t>(threadIdx.x) * V; h < H;
         h += static_cast<std::int64_t>(embedding_threads) * V) {
      pack<T, V> p;
      if (ok) {
        p = load_pack<V>(src + h);
      } else {
#pragma unroll
        for (int k = 0; k < V; ++k) p.v[k] = to<T>(0.0f);
      }
      store_pack<V>(dst + h, p);
    }
  }
}

template <class G>
__global__ void __launch_bounds__(embedding_threads)
    embedding_backward_kernel(float* dwte, const G* dout, const std::int32_t* tokens,
                              std::int64_t N, std::int64_t V_rows, std::int64_t H) {
  constexpr int per_thread = embedding_backward_tile / embedding_threads;
  static_assert(per_thread * embedding_threads == embedding_backward_tile);
  using block_scan = cub::BlockScan<int, embedding_threads>;
  struct shared_storage {
    typename block_scan::TempStorage scan;
    int matched[embedding_backward_tile];  // tile positions whose token this block owns, in order
  };
  static_assert(sizeof(shared_storage) <= embedding_backward_smem_bound);
  __shared__ shared_storage sm;
  const std::int64_t v0 = static_cast<std::int64_t>(blockIdx.x) * embedding_backward_rows;
  const std::int64_t v1 =
      v0 + embedding_backward_rows < V_rows ? v0 + embedding_backward_rows : V_rows;
  const std::int64_t c0 = static_cast<std::int64_t>(blockIdx.y) * embedding_backward_cols;
  const std::int64_t c1 = c0 + embedding_backward_cols < H ? c0 + embedding_backward_cols : H;
  for (std::int64_t base = 0; base < N; base += embedding_backward_tile) {
    int flag[per_thread], offset[per_thread];
#pragma unroll
    for (int k = 0; k < per_thread; ++k) {  // blocked: thread t holds positions 4t..4t+3
      const std::int64_t n = base + threadIdx.x * per_thread + k;
      const std::int64_t t = n < N ? tokens[n] : -1;
      flag[k] = t >= v0 && t < v1;
    }
    int count;
    block_scan(sm.scan).ExclusiveSum(flag, offset, count);
#pragma unroll
    for (int k = 0; k < per_thread; ++k)
      if (flag[k]) sm.matched[offset[k]] = static_cast<int>(threadIdx.x) * per_thread + k;
    __syncthreads();
    for (int j = 0; j < count; ++j) {
      const std::int64_t n = base + sm.matched[j];
      const std::int64_t t = tokens[n];
      float* dst = dwte + t * H;
      const G* src = dout + n * H;
      for (std::int64_t h = c0 + threadIdx.x; h < c1; h += embedding_threads)
        dst[h] += to<float>(src[h]);
    }
    __syncthreads();  // sm is reused by the next tile
  }
}

__global__ void __launch_bounds__(embedding_threads)
    embedding_local_ids_kernel(std::int32_t* out, const std::int32_t* ids, std::int64_t N,
                               std::int64_t v_begin, std::int64_t Vl, std::int32_t ignore_index) {
  for (std::int64_t n = static_cast<std::int64_t>(blockIdx.x) * embedding_threads + threadIdx.x;
       n < N; n += static_cast<std::int64_t>(gridDim.x) * embedding_threads) {
    const std::int32_t id = ids[n];
    const std::int64_t l = static_cast<std::int64_t>(id) - v_begin;
    out[n] = (id != ignore_index && l >= 0 && l < Vl) ? static_cast<std::int32_t>(l)
                                                      : ignore_index;
  }
}

}  // namespace detail

/// The launcher of embedding_local_ids_kernel (declared in kernels.hpp;
/// not a template, so cuda/kernels.cu defines it once with this body).
inline void embedding_local_ids_launch(std::int32_t* d_out, const std::int32_t* d_ids,
                                       std::int64_t N, std::int64_t v_begin, std::int64_t Vl,
                                       std::int32_t ignore_index, cudaStream_t stream) {
  TESSERA_THROW_IF(N < 0 || Vl < 1 || v_begin < 0, config_error,
                   "embedding_local_ids (cuda): N=", N, " and the slice [", v_begin, ", ",
                   v_begin + Vl, ") must be N >= 0, Vl >= 1, v_begin >= 0");
  if (N == 0) return;
  const std::int64_t blocks = std::min<std::int64_t>(
      (N + embedding_threads - 1) / embedding_threads, launch_limits::max_grid_x);
  detail::embedding_local_ids_kernel<<<static_cast<unsigned>(blocks), embedding_threads, 0,
                                       stream>>>(d_out, d_ids, N, v_begin, Vl, ignore_index);
  TESSERA_CUDA_CHECK_LAUNCH("embedding_local_ids_kernel");
}

template <class T>
void embedding_forward(T* d_out, const std::int32_t* d_tokens, const T* d_wte, std::int64_t N,
                       std::int64_t V, std::int64_t H, cudaStream_t stream) {
  TESSERA_THROW_IF(V < 1, config_error, "embedding_forward (cuda): V=", V, " must be >= 1");
  const launch_config c = embedding_forward_config(N, H);
  if (N == 0 || H == 0) return;
  constexpr int W = detail::vec_width<T>;
  if (H % W == 0 && detail::all_aligned(16, d_out, d_wte))
    detail::embedding_forward_kernel<T, W>
        <<<detail::grid_of(c), c.block, 0, stream>>>(d_out, d_tokens, d_wte, N, V, H);
  else
    detail::embedding_forward_kernel<T, 1>
        <<<detail::grid_of(c), c.block, 0, stream>>>(d_out, d_tokens, d_wte, N, V, H);
  TESSERA_CUDA_CHECK_LAUNCH("embedding_forward_kernel");
}

template <class G>
void embedding_backward(float* d_dwte, const G* d_dout, const std::int32_t* d_tokens,
                        std::int64_t N, std::int64_t V, std::int64_t H, cudaStream_t stream) {
  const launch_config c = embedding_backward_config(N, V, H);
  if (N == 0 || H == 0) return;
  detail::embedding_backward_kernel<G>
      <<<detail::grid_of(c), c.block, 0, stream>>>(d_dwte, d_dout, d_tokens, N, V, H);
  TESSERA_CUDA_CHECK_LAUNCH("embedding_backward_kernel");
}

}  // namespace tessera::kernels::cuda
