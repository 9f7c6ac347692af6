#pragma once
/// \file kernels/cuda/rope.cuh
/// RoPE forward and backward on the GPU, in place on x (B, T, nh, hd)
/// (declared and documented in kernels/cuda/kernels.hpp). Per-pair
/// arithmetic: kernels/detail/rope.hpp (rope_rotate, rope_rotate_transpose),
/// the same functions as the host loop of kernels/rope.hpp, in float32.
/// One work item is V consecutive pairs (i, i + hd/2) of one head vector:
/// 16-byte accesses to both halves when hd/2 is a multiple of V and every
/// pointer is aligned, one pair per item otherwise. Grid-stride, 64-bit
/// indices.
///
/// Gradient contract (llm.c): no parameters; dx is overwritten in place.

#include <type_traits>

#include "tessera/kernels/cuda/common.cuh"
#include "tessera/kernels/cuda/kernels.hpp"
#include "tessera/kernels/detail/rope.hpp"

namespace tessera::kernels::cuda {

namespace detail {

/// Applies `rotate(a1, a2, c, s, y1, y2)` in float32 to every pair of x,
/// W pairs per item, each read and written once.
template <int W, class T, class Rotate>
__device__ __forceinline__ void rope_apply(T* x, const float* cos, const float* sin,
                                           std::int64_t T_, std::int64_t nh, std::int64_t half,
                                           std::int64_t items, Rotate rotate) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t g = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       g < items; g += stride) {
    const std::int64_t p = g * W;  // first pair of the item
    const std::int64_t row = p / half;
    const std::int64_t i = p - row * half;
    const std::int64_t t = (row / nh) % T_;
    T* v1 = x + row * 2 * half + i;
    T* v2 = v1 + half;
    const float* c = cos + t * half + i;
    const float* s = sin + t * half + i;
    pack<T, W> a = load_pack<W>(v1);
    pack<T, W> b = load_pack<W>(v2);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      float y1, y2;
      rotate(to<float>(a.v[k]), to<float>(b.v[k]), __ldg(c + k), __ldg(s + k), y1, y2);
      a.v[k] = to<T>(y1);
      b.v[k] = to<T>(y2);
    }
    store_pack<W>(v1, a);
    store_pack<W>(v2, b);
  }
}

template <class T, int W>
__global__ void __launch_bounds__(rope_threads)
    rope_forward_kernel(T* x, const float* cos, const float* sin, std::int64_t T_, std::int64_t nh,
                        std::int64_t half, std::int64_t items) {
  rope_apply<W>(x, cos, sin, T_, nh, half, items,
                [](float a, float b, float c, float s, float& y1, float& y2) {
                  kernels::detail::rope_rotate(a, b, c, s, y1, y2);
                });
}

template <class G, int W>
__global__ void __launch_bounds__(rope_threads)
    rope_backward_kernel(G* dx, const float* cos, const float* sin, std::int64_t T_,
                         std::int64_t nh, std::int64_t half, std::int64_t items) {
  rope_apply<W>(dx, cos, sin, T_, nh, half, items,
                [](float a, float b, float c, float s, float& y1, float& y2) {
                  kernels::detail::rope_rotate_transpose(a, b, c, s, y1, y2);
                });
}

/// Launches `kv` (V pairs an item) when hd/2 is a multiple of V and x is
/// 16-byte aligned, `k1` (one pair) otherwise. The tables are read per
/// element (cached), so they need no alignment. Returns whether it launched.
template <class T, class KV, class K1>
bool rope_dispatch(T* x, const float* cos, const float* sin, std::int64_t B, std::int64_t T_,
                   std::int64_t nh, std::int64_t hd, cudaStream_t stream, KV kv, K1 k1) {
  constexpr int V = vec_width<T>;
  const std::int64_t half = hd / 2;
  const bool vec = half % V == 0 && all_aligned(V * sizeof(T), x);
  const launch_config c = rope_config(B, T_, nh, hd, vec ? V : 1);
  const std::int64_t pairs = B * T_ * nh * half;
  if (pairs == 0) return false;
  if (vec)
    kv<<<grid_of(c), c.block, 0, stream>>>(x, cos, sin, T_, nh, half, pairs / V);
  else
    k1<<<grid_of(c), c.block, 0, stream>>>(x, cos, sin, T_, nh, half, pairs);
  return true;
}

}  // namespace detail

template <class T>
void rope_forward(T* d_x, const float* d_cos, const float* d_sin, std::int64_t B, std::int64_t T_,
                  std::int64_t nh, std::int64_t hd, cudaStream_t stream) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, bf16>,
                "tessera::kernels::cuda::rope_forward: T must be float or bf16");
  constexpr int V = detail::vec_width<T>;
  const bool launched =
      detail::rope_dispatch(d_x, d_cos, d_sin, B, T_, nh, hd, stream,
                            detail::rope_forward_kernel<T, V>, detail::rope_forward_kernel<T, 1>);
  if (launched) TESSERA_CUDA_CHECK_LAUNCH("rope_forward_kernel");
}

template <class G>
void rope_backward(G* d_dx, const float* d_cos, const float* d_sin, std::int64_t B,
                   std::int64_t T_, std::int64_t nh, std::int64_t hd, cudaStream_t stream) {
  static_assert(std::is_same_v<G, float> || std::is_same_v<G, bf16>,
                "tessera::kernels::cuda::rope_backward: G must be float or bf16");
  constexpr int V = detail::vec_width<G>;
  const bool launched =
      detail::rope_dispatch(d_dx, d_cos, d_sin, B, T_, nh, hd, stream,
                            detail::rope_backward_kernel<G, V>, detail::rope_backward_kernel<G, 1>);
  if (launched) TESSERA_CUDA_CHECK_LAUNCH("rope_backward_kernel");
}

}  // namespace tessera::kernels::cuda
