#pragma once
/// \file kernels/cuda/swiglu.cuh
/// SwiGLU forward and backward on the GPU (declared and documented in
/// kernels/cuda/kernels.hpp). Per-element arithmetic: kernels/detail/swiglu.hpp,
/// the same functions as the host loop. Element-wise, grid-stride, 16-byte
/// accesses when every pointer is aligned.
///
/// Gradient contract (llm.c): no parameters; dgate and dup are written (=).

#include "tessera/kernels/cuda/common.cuh"
#include "tessera/kernels/cuda/kernels.hpp"
#include "tessera/kernels/detail/swiglu.hpp"

namespace tessera::kernels::cuda {

namespace detail {

template <class T, int V>
__global__ void __launch_bounds__(elementwise_threads)
    swiglu_forward_kernel(T* out, const T* gate, const T* up, std::int64_t n) {
  elementwise_apply<V>(n, [&]<int W>(std::int64_t i) {
    const pack<T, W> g = load_pack<W>(gate + i);
    const pack<T, W> u = load_pack<W>(up + i);
    pack<T, W> o;
#pragma unroll
    for (int k = 0; k < W; ++k)
      o.v[k] = to<T>(kernels::detail::swiglu_out(to<float>(g.v[k]), to<float>(u.v[k])));
    store_pack<W>(out + i, o);
  });
}

template <class T, class G, int V>
__global__ void __launch_bounds__(elementwise_threads)
    swiglu_backward_kernel(G* dgate, G* dup, const G* dout, const T* gate, const T* up,
                           std::int64_t n) {
  elementwise_apply<V>(n, [&]<int W>(std::int64_t i) {
    const pack<T, W> g = load_pack<W>(gate + i);
    const pack<T, W> u = load_pack<W>(up + i);
    const pack<G, W> dy = load_pack<W>(dout + i);
    pack<G, W> dg, du;
#pragma unroll
    for (int k = 0; k < W; ++k) {
      float a, b;
      kernels::detail::swiglu_grad(to<float>(dy.v[k]), to<float>(g.v[k]), to<float>(u.v[k]), a, b);
      dg.v[k] = to<G>(a);
      du.v[k] = to<G>(b);
    }
    store_pack<W>(dgate + i, dg);
    store_pack<W>(dup + i, du);
  });
}

}  // namespace detail

template <class T>
void swiglu_forward(T* d_out, const T* d_gate, const T* d_up, std::int64_t n, cudaStream_t stream) {
  constexpr int V = detail::vec_width<T>;
  const launch_config c = elementwise_config(n, V);
  if (n == 0) return;
  if (detail::all_aligned(16, d_out, d_gate, d_up))
    detail::swiglu_forward_kernel<T, V>
        <<<detail::grid_of(c), c.block, 0, stream>>>(d_out, d_gate, d_up, n);
  else
    detail::swiglu_forward_kernel<T, 1>
        <<<detail::grid_of(c), c.block, 0, stream>>>(d_out, d_gate, d_up, n);
  TESSERA_CUDA_CHECK_LAUNCH("swiglu_forward_kernel");
}

template <class T, class G>
void swiglu_backward(G* d_dgate, G* d_dup, const G* d_dout, const T* d_gate, const T* d_up,
                     std::int64_t n, cudaStream_t stream) {
  static_assert(std::is_same_v<G, float> || (std::is_same_v<T, bf16> && std::is_same_v<G, bf16>),
                "tessera::kernels::cuda::swiglu_backward: G must be float, or bf16 with bf16 T");
  constexpr int V = detail::vec_width<T, G>;
  const launch_config c = elementwise_config(n, V);
  if (n == 0) return;
  if (detail::all_aligned(V * sizeof(G), d_dgate, d_dup, d_dout) &&
      detail::all_aligned(V * sizeof(T), d_gate, d_up))
    detail::swiglu_backward_kernel<T, G, V>
        <<<detail::grid_of(c), c.block, 0, stream>>>(d_dgate, d_dup, d_dout, d_gate, d_up, n);
  else
    detail::swiglu_backward_kernel<T, G, 1>
        <<<detail::grid_of(c), c.block, 0, stream>>>(d_dgate, d_dup, d_dout, d_gate, d_up, n);
  TESSERA_CUDA_CHECK_LAUNCH("swiglu_backward_kernel");
}

}  // namespace tessera::kernels::cuda
