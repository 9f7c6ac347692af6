#pragma once
/// \file kernels/cuda/elementwise.cuh
/// Element-wise kernels on the GPU (declared and documented in
/// kernels/cuda/kernels.hpp): casts between storage types, the residual add
/// and the inf/NaN check of the loss scaler. The arithmetic is tessera::to
/// and one float32 add, the same as the host kernels::cast and
/// kernels::residual_add, so the bits match.

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

template <class T, int V>
__global__ void __launch_bounds__(elementwise_threads)
    residual_add_kernel(T* out, const T* a, const T* b, std::int64_t n) {
  using A = accum_t<T>;
  elementwise_apply<V>(n, [&]<int W>(std::int64_t i) {
    const pack<T, W> x = load_pack<W>(a + i);
    const pack<T, W> y = load_pack<W>(b + i);
    pack<T, W> o;
#pragma unroll
    for (int k = 0; k < W; ++k) o.v[k] = to<T>(to<A>(x.v[k]) + to<A>(y.v[k]));
    store_pack<W>(out + i, o);  // after both loads: out may be a or b
  });
}

/// True when x is inf or NaN (all exponent bits set), by the bits, so no
/// compiler flag can fold the test away.
template <class G>
__device__ __forceinline__ bool nonfinite(G x) {
  if constexpr (std::is_same_v<G, bf16>)
    return (x.bits & 0x7f80u) == 0x7f80u;
  else
    return (::tessera::detail::float_bits(x) & 0x7f800000u) == 0x7f800000u;
}

template <class G, int V>
__global__ void __launch_bounds__(elementwise_threads)
    count_nonfinite_kernel(std::int32_t* flag, const G* g, std::int64_t n) {
  int found = 0;
  elementwise_apply<V>(n, [&]<int W>(std::int64_t i) {
    const pack<G, W> p = load_pack<W>(g + i);
#pragma unroll
    for (int k = 0; k < W; ++k) found |= nonfinite(p.v[k]) ? 1 : 0;
  });
  // One integer atomic per block that saw one (a plain store from several
  // blocks would be a data race); the result is 1 in any order.
  if (__syncthreads_or(found) && threadIdx.x == 0) atomicOr(flag, 1);
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

template <class T>
void residual_add(T* d_out, const T* d_a, const T* d_b, std::int64_t n, cudaStream_t stream) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, bf16>,
                "tessera::kernels::cuda::residual_add: T must be float or bf16");
  constexpr int V = detail::vec_width<T>;
  const launch_config c = elementwise_config(n, V);
  if (n == 0) return;
  if (detail::all_aligned(16, d_out, d_a, d_b))
    detail::residual_add_kernel<T, V>
        <<<detail::grid_of(c), c.block, 0, stream>>>(d_out, d_a, d_b, n);
  else
    detail::residual_add_kernel<T, 1>
        <<<detail::grid_of(c), c.block, 0, stream>>>(d_out, d_a, d_b, n);
  TESSERA_CUDA_CHECK_LAUNCH("residual_add_kernel");
}

template <class G>
void count_nonfinite(std::int32_t* d_flag, const G* d_g, std::int64_t n, cudaStream_t stream) {
  static_assert(std::is_same_v<G, float> || std::is_same_v<G, bf16>,
                "tessera::kernels::cuda::count_nonfinite: G must be float or bf16");
  constexpr int V = detail::vec_width<G>;
  const launch_config c = elementwise_config(n, V);
  TESSERA_THROW_IF(n > 0 && d_flag == nullptr, config_error,
                   "count_nonfinite (cuda): d_flag is null");
  if (n == 0) return;
  if (detail::all_aligned(16, d_g))
    detail::count_nonfinite_kernel<G, V>
        <<<detail::grid_of(c), c.block, 0, stream>>>(d_flag, d_g, n);
  else
    detail::count_nonfinite_kernel<G, 1>
        <<<detail::grid_of(c), c.block, 0, stream>>>(d_flag, d_g, n);
  TESSERA_CUDA_CHECK_LAUNCH("count_nonfinite_kernel");
}

}  // namespace tessera::kernels::cuda
