#pragma once
/// \file kernels/cuda/block.hpp
/// The primitive interface every CUDA kernel body is written over, so that the
/// same body runs on a GPU and, in the host tests, under the block emulator
/// (tests/support/cuda_emulator.hpp), against the host implementation.
///
/// A kernel is a *body*: a struct with
/// - `static constexpr int threads`: the block size (its __launch_bounds__);
/// - `static constexpr const char* name`: the kernel's name in messages;
/// - `static constexpr std::size_t smem_bound`: the most bytes its
///   shared_storage may take on the GPU (the launch_config's `smem` less
///   the dynamic part; 0 with `no_shared`), checked at compile time by
///   block_kernel and at run time by the emulator's launcher;
/// - `template <class Ops> struct shared_storage`: its __shared__ memory
///   (`no_shared` when it has none);
/// - `template <class Ops> static void run(const block_index&, shared_storage<Ops>&, args...)`:
///   what one thread of one block does.
///
/// `Ops` is the primitive interface: global loads and stores (`ld`, `st`,
/// `ld_pack`, `st_pack`), block barriers (`sync`, `sync_or`), integer atomics
/// (`atomic_or`), and the block-wide reduce and scan the kernels take from
/// CUB (`block_reduce<T, Threads>`, `block_scan<Threads, Items>`). On the GPU
/// it is `device_ops` (below: CUDA intrinsics and CUB); the emulator maps
/// each to host code that also checks what the hardware would fault on or
/// silently get wrong (out-of-bounds and misaligned accesses, writes to
/// inputs, missing barriers, a reduction's result read outside thread 0).
///
/// A *launcher* runs a body over a grid: `launch.template run<Body>(config,
/// args...)` with a launch_config from kernels/cuda/launch.hpp. Each
/// kernel's launch function (`rmsnorm_forward_launch`, ...) is written once
/// over a launcher and decides the configuration and the variant (vector
/// width); the GPU entry points (`rmsnorm_forward(..., cudaStream_t)`) call it
/// with `device_launcher`, the emulator tests with theirs. So the emulator
/// checks the very geometry and shared memory a GPU gets.
///
/// This header compiles with a plain C++ compiler; what needs nvcc is under
/// `__CUDACC__`.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "tessera/core/config.hpp"
#include "tessera/core/error.hpp"
#include "tessera/kernels/cuda/launch.hpp"

#if defined(__CUDACC__)
#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "tessera/core/cuda.hpp"
#define TESSERA_BLOCK_FN __device__ __forceinline__
#define TESSERA_UNROLL _Pragma("unroll")
#define TESSERA_NO_UNROLL _Pragma("unroll 1")
#else
#define TESSERA_BLOCK_FN inline
#define TESSERA_UNROLL
#define TESSERA_NO_UNROLL
#endif

namespace tessera::kernels::cuda {

/// Where a thread is: block (x, y) of a grid_x x grid_y grid, thread `tid`
/// of a block of `threads` (1-D blocks). What blockIdx, gridDim, threadIdx
/// and blockDim say on a GPU, as 64-bit values.
struct block_index {
  std::int64_t x = 0;
  std::int64_t y = 0;
  std::int64_t grid_x = 1;
  std::int64_t grid_y = 1;
  int tid = 0;
  int threads = 1;
};

/// The shared_storage of a body that uses no shared memory.
struct no_shared {};

namespace detail {

/// `N` elements of `T` loaded or stored as one aligned access
/// (sizeof(T) * N bytes; 16 for the vector paths).
template <class T, int N>
struct alignas(sizeof(T) * N) pack {
  T v[N];
};

/// Elements per 16-byte access of the widest of `Ts`.
template <class... Ts>
inline constexpr int vec_width = static_cast<int>(16 / std::max({sizeof(Ts)...}));

/// True when every pointer is aligned to `bytes`.
template <class... Ps>
inline bool all_aligned(std::size_t bytes, const Ps*... ps) {
  return ((reinterpret_cast<std::uintptr_t>(ps) % bytes == 0) && ...);
}

/// Grid-stride loop over [0, n) of the whole grid: `f.template
/// operator()<V>(i)` handles elements [i, i + V) for i a multiple of V,
/// then `operator()<1>` the tail. 64-bit indices throughout.
template <int V, class F>
TESSERA_BLOCK_FN void elementwise_apply(const block_index& b, std::int64_t n, F&& f) {
  const std::int64_t stride = b.grid_x * b.threads;
  const std::int64_t t = b.x * b.threads + b.tid;
  const std::int64_t nv = n / V;
  // Not unrolled: with the block size a constant, nvcc would unroll the
  // grid-stride loop and spill (swiglu_forward's float body did).
  TESSERA_NO_UNROLL
  for (std::int64_t v = t; v < nv; v += stride) f.template operator()<V>(v * V);
  if constexpr (V > 1) {
    TESSERA_NO_UNROLL
    for (std::int64_t i = nv * V + t; i < n; i += stride) f.template operator()<1>(i);
  }
}

}  // namespace detail

#if defined(__CUDACC__)

/// The primitive interface on a GPU: plain loads and stores, __syncthreads,
/// atomicOr, and CUB's BlockReduce (its default algorithm,
/// BLOCK_REDUCE_WARP_REDUCTIONS) and BlockScan.
struct device_ops {
  template <class T>
  static __device__ __forceinline__ T ld(const T* p) {
    return *p;
  }
  template <class T>
  static __device__ __forceinline__ void st(T* p, T v) {
    *p = v;
  }
  /// Loads N elements at `p` (aligned to sizeof(pack)) as one access.
  template <int N, class T>
  static __device__ __forceinline__ detail::pack<T, N> ld_pack(const T* p) {
    return *reinterpret_cast<const detail::pack<T, N>*>(p);
  }
  template <int N, class T>
  static __device__ __forceinline__ void st_pack(T* p, const detail::pack<T, N>& x) {
    *reinterpret_cast<detail::pack<T, N>*>(p) = x;
  }
  static __device__ __forceinline__ void sync() { __syncthreads(); }
  /// A barrier that returns, to every thread, whether any thread passed true.
  static __device__ __forceinline__ bool sync_or(bool p) { return __syncthreads_or(p) != 0; }
  static __device__ __forceinline__ void atomic_or(std::int32_t* p, std::int32_t v) {
    atomicOr(p, v);
  }

  /// Block-wide reduction of one T per thread; every thread calls it; the
  /// result is defined in thread 0 only (CUB's contract). A second use of the
  /// same storage needs a sync() between.
  template <class T, int Threads>
  struct block_reduce {
    using cub_type = cub::BlockReduce<T, Threads>;
    using storage = typename cub_type::TempStorage;
    static __device__ __forceinline__ T sum(storage& s, T v) { return cub_type(s).Sum(v); }
    template <class Op>
    static __device__ __forceinline__ T reduce(storage& s, T v, Op op) {
      return cub_type(s).Reduce(v, op);
    }
  };

  /// Block-wide exclusive prefix sum of `Items` ints per thread (blocked:
  /// thread t holds items t * Items ...); `total` is the block's sum, in
  /// every thread.
  template <int Threads, int Items>
  struct block_scan {
    using cub_type = cub::BlockScan<int, Threads>;
    using storage = typename cub_type::TempStorage;
    static __device__ __forceinline__ void exclusive_sum(storage& s, int (&in)[Items],
                                                         int (&out)[Items], int& total) {
      cub_type(s).ExclusiveSum(in, out, total);
    }
  };
};

/// One CUDA kernel per body: the body's shared_storage as static shared
/// memory, its block size as the launch bound.
template <class Body, class... A>
__global__ void __launch_bounds__(Body::threads) block_kernel(A... a) {
  using storage = typename Body::template shared_storage<device_ops>;
  static_assert(std::is_empty_v<storage> || sizeof(storage) <= Body::smem_bound,
                "a body's shared_storage exceeds the smem_bound its launch_config declares");
  __shared__ storage sm;
  const block_index b{static_cast<std::int64_t>(blockIdx.x), static_cast<std::int64_t>(blockIdx.y),
                      static_cast<std::int64_t>(gridDim.x),  static_cast<std::int64_t>(gridDim.y),
                      static_cast<int>(threadIdx.x),         Body::threads};
  Body::template run<device_ops>(b, sm, a...);
}

/// Launches bodies on a CUDA stream. The launch_config's block must be the
/// body's; a bad configuration throws cuda_error naming the kernel.
struct device_launcher {
  cudaStream_t stream = nullptr;

  template <class Body, class... A>
  void run(const launch_config& c, A... a) const {
    TESSERA_THROW_IF(c.block != Body::threads, config_error, Body::name, ": launch of ", c.block,
                     " threads, the kernel is built for ", Body::threads);
    block_kernel<Body, A...>
        <<<dim3(static_cast<unsigned>(c.grid_x), static_cast<unsigned>(c.grid_y), 1u),
           static_cast<unsigned>(c.block), c.dynamic_smem, stream>>>(a...);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) ::tessera::detail::throw_cuda_error(e, Body::name, __FILE__, __LINE__);
  }
};

#endif  // __CUDACC__

}  // namespace tessera::kernels::cuda
