#pragma once
/// \file kernels/cuda/common.cuh
/// Device helpers shared by the CUDA kernels: 16-byte vector packs, the
/// grid-stride element loop with a vectorised body and a scalar tail, and the
/// launch helpers. nvcc only.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "tessera/core/cuda.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/kernels/cuda/block.hpp"
#include "tessera/kernels/cuda/launch.hpp"

namespace tessera::kernels::cuda::detail {

/// Loads a pack from `p` (aligned to sizeof(pack)).
template <int N, class T>
__device__ __forceinline__ pack<T, N> load_pack(const T* p) {
  return *reinterpret_cast<const pack<T, N>*>(p);
}
/// Stores a pack to `p` (aligned to sizeof(pack)).
template <int N, class T>
__device__ __forceinline__ void store_pack(T* p, const pack<T, N>& x) {
  *reinterpret_cast<pack<T, N>*>(p) = x;
}

/// Grid-stride loop over [0, n): `f.template operator()<V>(i)` handles
/// elements [i, i + V) for i a multiple of V, then `operator()<1>` the tail.
/// 64-bit indices throughout.
template <int V, class F>
__device__ __forceinline__ void elementwise_apply(std::int64_t n, F&& f) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t nv = n / V;
  for (std::int64_t v = t; v < nv; v += stride) f.template operator()<V>(v * V);
  if constexpr (V > 1)
    for (std::int64_t i = nv * V + t; i < n; i += stride) f.template operator()<1>(i);
}

/// The dim3 grid of a launch_config.
inline dim3 grid_of(const launch_config& c) {
  return dim3(static_cast<unsigned>(c.grid_x), static_cast<unsigned>(c.grid_y), 1u);
}

}  // namespace tessera::kernels::cuda::detail
