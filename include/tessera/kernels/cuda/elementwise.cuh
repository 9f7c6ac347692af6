#pragma once
/// \file kernels/cuda/elementwise.cuh
/// Casts between storage types on the GPU (declared and documented in
/// kernels/cuda/kernels.hpp). The conversion is tessera::to, the same
/// function as the host kernels::cast, so the bits match.

#include "tessera/kernels/cuda/common.cuh"
#include "tessera/kernels/cuda/kernels.hpp"

namespace tessera::kernels::cuda {

namespace detail {

template <class To, class From, int V>
__global__ void __launch_bounds__(elementwise_threads)
    cast_kernel(To* out, const From* in, std::int64_t n) {
  elementwise_apply<V>(n, [&]<int W>(std::int64_t i) {
    const pack<From, W> x = load_pack<W>(in + i);
    pack<To, W> y;
#pragma unroll
    for (int k = 0; k < W; ++k) y.v[k] = to<To>(x.v[k]);
    store_pack<W>(out + i, y);
  });
}

}  // namespace detail

template <class To, class From>
void cast(To* d_out, const From* d_in, std::int64_t n, cudaStream_t stream) {
  constexpr int V = detail::vec_width<To, From>;
  const launch_config c = elementwise_config(n, V);
  if (n == 0) return;
  if (detail::all_aligned(V * sizeof(To), d_out) && detail::all_aligned(V * sizeof(From), d_in))
    detail::cast_kernel<To, From, V><<<detail::grid_of(c), c.block, 0, stream>>>(d_out, d_in, n);
  else
    detail::cast_kernel<To, From, 1><<<detail::grid_of(c), c.block, 0, stream>>>(d_out, d_in, n);
  TESSERA_CUDA_CHECK_LAUNCH("cast_kernel");
}

}  // namespace tessera::kernels::cuda
