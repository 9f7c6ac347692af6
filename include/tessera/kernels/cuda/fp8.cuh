#pragma once
/// \file kernels/cuda/fp8.cuh
/// The FP8 scaling kernels on the GPU (declared and documented in
/// kernels/cuda/kernels.hpp): a tensor's amax folded into a running one, the
/// scale set from an amax, the scaled cast (with the inverse scale for the
/// GEMM) and the cast with a transpose. Every kernel reads the scale and the
/// amax from device memory, so current scaling (amax, then scale, then
/// cast) runs without a host sync. The arithmetic is the host's
/// (kernels/detail/fp8.hpp, core/fp8_scale.hpp), so the bytes match the host
/// kernels of kernels/fp8.hpp; the bodies are written over the primitive
/// interface of kernels/cuda/block.hpp, so the host tests run them under the
/// block emulator (tests/kernels/emulated_fp8.cpp).
///
/// - amax: stage 1, fp8_amax_partial_config(n).grid_x blocks each take the
///   maximum of a grid-stride share (16-byte loads when x is aligned) and
///   write one partial; stage 2, one block folds the partials into *amax.
///   A maximum rounds nothing, so any partition and order give the same
///   bits; a NaN counts as +inf (fp8_amax_max: fmaxf would drop it).
/// - the cast: element-wise (elementwise_config), 16-byte loads of x and
///   stores of 4 or 8 FP8 bytes when both pointers are aligned.
/// - the transposed cast: Transformer Engine's cast_transpose as a plain
///   tiled transpose. A block of 32 x 8 threads moves a 32 x 32 tile of x
///   through shared memory as float (rows padded to 33, so the column reads
///   fall in 32 banks): each warp reads 32 consecutive elements of a row of
///   x (64 or 128 bytes) and writes 32 consecutive bytes of a row of qt (one
///   32-byte sector when rows is a multiple of 32 and qt is aligned); the
///   edge tiles of sizes that are no multiple of 32 are masked.
/// Sources: Micikevicius et al. 2022, "FP8 Formats for Deep Learning";
/// the OCP 8-bit floating point specification; Transformer Engine's
/// common/transpose/cast_transpose.cu.

#include <cstdint>
#include <type_traits>

#include "tessera/core/error.hpp"
#include "tessera/core/fp8_scale.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/kernels/cuda/block.hpp"
#include "tessera/kernels/detail/fp8.hpp"

#if defined(__CUDACC__)
#include "tessera/kernels/cuda/kernels.hpp"
#endif

namespace tessera::kernels::cuda {

namespace detail {

/// The input types of the FP8 kernels on the GPU.
template <class T>
inline constexpr bool fp8_input_v = std::is_same_v<T, float> || is_half_v<T>;

/// Block-reduction operator: the larger of two amaxes (fp8_amax_max: NaN as +inf).
struct fp8_amax_op {
  TESSERA_BLOCK_FN float operator()(float a, float b) const {
    return ::tessera::fp8_amax_max(a, b);
  }
};

/// partial[block] = the maximum of |x[i]| (fp8_amax_max: +inf for NaN) over the block's
/// grid-stride share of [0, n) (0 for an empty share); V elements per access.
template <class T, int V>
struct fp8_amax_partial_body {
  static constexpr int threads = fp8_threads;
  static constexpr std::size_t smem_bound = fp8_amax_smem_bound;
  static constexpr const char* name = "fp8_amax_partial";
  template <class Ops>
  struct shared_storage {
    typename Ops::template block_reduce<float, threads>::storage reduce;
  };

  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index& b, shared_storage<Ops>& sm, float* partial,
                                   const T* x, std::int64_t n) {
    using reduce = typename Ops::template block_reduce<float, threads>;
    float m = 0.0f;
    elementwise_apply<V>(b, n, [&]<int W>(std::int64_t i) {
      const pack<T, W> p = Ops::template ld_pack<W>(x + i);
      TESSERA_UNROLL
      for (int k = 0; k < W; ++k)
        m = ::tessera::fp8_amax_max(m, kernels::detail::fp8_abs(to<float>(p.v[k])));
    });
    const float total = reduce::reduce(sm.reduce, m, fp8_amax_op{});
    if (b.tid == 0) Ops::st(partial + b.x, total);
  }
};

/// *amax = fp8_amax_max(*amax, the maximum of partial[0, count)): thread t
/// the partials t, t + 256, ..., then the block reduction.
struct fp8_amax_final_body {
  static constexpr int threads = fp8_threads;
  static constexpr std::size_t smem_bound = fp8_amax_smem_bound;
  static constexpr const char* name = "fp8_amax_final";
  template <class Ops>
  struct shared_storage {
    typename Ops::template block_reduce<float, threads>::storage reduce;
  };

  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index& b, shared_storage<Ops>& sm, float* amax,
                                   const float* partial, std::int64_t count) {
    using reduce = typename Ops::template block_reduce<float, threads>;
    float m = 0.0f;
    for (std::int64_t i = b.tid; i < count; i += threads)
      m = ::tessera::fp8_amax_max(m, Ops::ld(partial + i));
    const float total = reduce::reduce(sm.reduce, m, fp8_amax_op{});
    if (b.tid == 0)
      Ops::st(amax, ::tessera::fp8_amax_max(Ops::ld(static_cast<const float*>(amax)), total));
  }
};

/// *scale = fp8_scale_of(*amax, fp8_max, margin, *scale): one thread.
struct fp8_update_scale_body {
  static constexpr int threads = 1;
  static constexpr std::size_t smem_bound = 0;
  static constexpr const char* name = "fp8_update_scale";
  template <class Ops>
  using shared_storage = no_shared;

  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index&, no_shared&, float* scale, const float* amax,
                                   float fp8_max, int margin) {
    const float previous = Ops::ld(static_cast<const float*>(scale));
    Ops::st(scale, ::tessera::fp8_scale_of(Ops::ld(amax), fp8_max, margin, previous));
  }
};

/// q[i] = F8(float(x[i]) * *scale), V elements per access; thread 0 of
/// block 0 writes *inv_scale = 1 / *scale when inv_scale is not null.
template <class F8, class T, int V>
struct fp8_quantize_body {
  static constexpr int threads = elementwise_threads;
  static constexpr std::size_t smem_bound = 0;
  static constexpr const char* name = "fp8_quantize";
  template <class Ops>
  using shared_storage = no_shared;

  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index& b, no_shared&, F8* q, float* inv_scale,
                                   const T* x, std::int64_t n, const float* scale) {
    const float s = Ops::ld(scale);
    if (inv_scale != nullptr && b.x == 0 && b.y == 0 && b.tid == 0) Ops::st(inv_scale, 1.0f / s);
    elementwise_apply<V>(b, n, [&]<int W>(std::int64_t i) {
      const pack<T, W> p = Ops::template ld_pack<W>(x + i);
      pack<F8, W> o;
      TESSERA_UNROLL
      for (int k = 0; k < W; ++k) o.v[k] = kernels::detail::fp8_scaled_cast<F8>(p.v[k], s);
      Ops::template st_pack<W>(q + i, o);
    });
  }
};

/// qt (cols, rows) = the scaled cast of x (rows, cols) transposed, one
/// 32 x 32 tile at a time (file comment): thread (tx, ty) = (tid % 32,
/// tid / 32) reads x[i0 + ty + 8r][j0 + tx] and writes qt[j0 + ty + 8r][i0 + tx]
/// for r = 0..3. Tile (row tile, column tile) = (block y, block x), plus
/// multiples of the grid beyond its limits. Thread 0 of block (0, 0) writes
/// *inv_scale = 1 / *scale when inv_scale is not null.
template <class F8, class T>
struct fp8_quantize_transposed_body {
  static constexpr int threads = fp8_threads;
  static constexpr std::size_t smem_bound = fp8_transpose_smem_bound;
  static constexpr const char* name = "fp8_quantize_transposed";
  static constexpr int tile = fp8_transpose_tile;
  static constexpr int rows_per_pass = threads / tile;  // 8
  static_assert(threads % tile == 0 && tile % rows_per_pass == 0,
                "fp8_quantize_transposed: the block must cover a tile in whole passes of rows");
  template <class Ops>
  struct shared_storage {
    float t[tile][tile + 1];  // [row of x in the tile][column of x in the tile]
  };

  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index& b, shared_storage<Ops>& sm, F8* qt,
                                   float* inv_scale, const T* x, std::int64_t rows,
                                   std::int64_t cols, const float* scale) {
    const float s = Ops::ld(scale);
    if (inv_scale != nullptr && b.x == 0 && b.y == 0 && b.tid == 0) Ops::st(inv_scale, 1.0f / s);
    const int tx = b.tid % tile, ty = b.tid / tile;
    const std::int64_t tiles_r = (rows + tile - 1) / tile, tiles_c = (cols + tile - 1) / tile;
    TESSERA_NO_UNROLL
    for (std::int64_t tr = b.y; tr < tiles_r; tr += b.grid_y) {
      TESSERA_NO_UNROLL
      for (std::int64_t tc = b.x; tc < tiles_c; tc += b.grid_x) {
        const std::int64_t i0 = tr * tile, j0 = tc * tile;
        // A warp reads 32 consecutive elements of one row of x.
        TESSERA_UNROLL
        for (int r = 0; r < tile / rows_per_pass; ++r) {
          const int k = ty + r * rows_per_pass;
          const std::int64_t i = i0 + k, j = j0 + tx;
          if (i < rows && j < cols) sm.t[k][tx] = to<float>(Ops::ld(x + i * cols + j));
        }
        Ops::sync();
        // A warp writes 32 consecutive bytes of one row of qt (a column of x).
        TESSERA_UNROLL
        for (int r = 0; r < tile / rows_per_pass; ++r) {
          const int k = ty + r * rows_per_pass;
          const std::int64_t j = j0 + k, i = i0 + tx;
          if (i < rows && j < cols)
            Ops::st(qt + j * rows + i, kernels::detail::fp8_scaled_cast<F8>(sm.t[tx][k], s));
        }
        Ops::sync();  // the next tile overwrites sm.t
      }
    }
  }
};

}  // namespace detail

/// fp8_amax_accumulate (kernels.hpp) on `launch`: the partial maxima into
/// the scratch (16-byte loads when x is aligned; the partial count does not
/// depend on it), then their maximum folded into *d_amax. n = 0 launches
/// nothing.
template <class Launcher, class T>
void fp8_amax_accumulate_launch(const Launcher& launch, float* d_amax, const T* d_x, std::int64_t n,
                                void* d_scratch, std::size_t scratch_bytes) {
  static_assert(detail::fp8_input_v<T>,
                "tessera::kernels::cuda::fp8_amax_accumulate: T must be float, bf16 or fp16");
  constexpr const char* who = "fp8_amax_accumulate (cuda)";
  kernels::detail::check_fp8_size(who, n);
  kernels::detail::check_fp8_pointer(who, "d_amax", d_amax);
  const launch_config c = fp8_amax_partial_config(n);
  TESSERA_THROW_IF(scratch_bytes < c.scratch_bytes, config_error, who, ": scratch of ",
                   scratch_bytes, " bytes is below the ", c.scratch_bytes, " that n=", n,
                   " needs (fp8_amax_scratch_bytes)");
  if (n == 0) return;
  float* partial = static_cast<float*>(d_scratch);
  constexpr int V = detail::vec_width<T>;
  if (detail::all_aligned(16, d_x))
    launch.template run<detail::fp8_amax_partial_body<T, V>>(c, partial, d_x, n);
  else
    launch.template run<detail::fp8_amax_partial_body<T, 1>>(c, partial, d_x, n);
  launch.template run<detail::fp8_amax_final_body>(fp8_amax_final_config(), d_amax,
                                                   static_cast<const float*>(partial), c.grid_x);
}

/// fp8_update_scale (kernels.hpp) on `launch`: one thread.
template <class Launcher>
void fp8_update_scale_launch(const Launcher& launch, float* d_scale, const float* d_amax,
                             float fp8_max, int margin) {
  constexpr const char* who = "fp8_update_scale (cuda)";
  kernels::detail::check_fp8_pointer(who, "d_scale", d_scale);
  kernels::detail::check_fp8_pointer(who, "d_amax", d_amax);
  kernels::detail::check_fp8_update(who, fp8_max, margin);
  launch.template run<detail::fp8_update_scale_body>(fp8_update_scale_config(), d_scale, d_amax,
                                                     fp8_max, margin);
}

/// fp8_quantize (kernels.hpp) on `launch`: 16-byte loads of x and V-byte
/// stores of q when both are aligned for them, else one element per access.
/// n = 0 launches one block for the inverse scale, or nothing without one.
template <class Launcher, class F8, class T>
void fp8_quantize_launch(const Launcher& launch, F8* d_q, float* d_inv_scale, const T* d_x,
                         std::int64_t n, const float* d_scale) {
  static_assert(is_fp8_v<F8>,
                "tessera::kernels::cuda::fp8_quantize: F8 must be fp8_e4m3 or fp8_e5m2");
  static_assert(detail::fp8_input_v<T>,
                "tessera::kernels::cuda::fp8_quantize: T must be float, bf16 or fp16");
  constexpr const char* who = "fp8_quantize (cuda)";
  kernels::detail::check_fp8_size(who, n);
  kernels::detail::check_fp8_pointer(who, "d_scale", d_scale);
  constexpr int V = detail::vec_width<T>;
  const launch_config c = elementwise_config(n, V);
  if (n == 0 && d_inv_scale == nullptr) return;
  if (detail::all_aligned(V * sizeof(T), d_x) && detail::all_aligned(V * sizeof(F8), d_q))
    launch.template run<detail::fp8_quantize_body<F8, T, V>>(c, d_q, d_inv_scale, d_x, n, d_scale);
  else
    launch.template run<detail::fp8_quantize_body<F8, T, 1>>(c, d_q, d_inv_scale, d_x, n, d_scale);
}

/// fp8_quantize_transposed (kernels.hpp) on `launch`: fp8_transpose_config's
/// tiles; an empty x launches one block for the inverse scale, or nothing
/// without one.
template <class Launcher, class F8, class T>
void fp8_quantize_transposed_launch(const Launcher& launch, F8* d_qt, float* d_inv_scale,
                                    const T* d_x, std::int64_t rows, std::int64_t cols,
                                    const float* d_scale) {
  static_assert(is_fp8_v<F8>,
                "tessera::kernels::cuda::fp8_quantize_transposed: F8 must be fp8_e4m3 or fp8_e5m2");
  static_assert(detail::fp8_input_v<T>,
                "tessera::kernels::cuda::fp8_quantize_transposed: T must be float, bf16 or fp16");
  constexpr const char* who = "fp8_quantize_transposed (cuda)";
  kernels::detail::check_fp8_matrix(who, rows, cols);
  kernels::detail::check_fp8_pointer(who, "d_scale", d_scale);
  const bool empty = rows == 0 || cols == 0;
  if (empty && d_inv_scale == nullptr) return;
  const launch_config c = empty ? fp8_transpose_config(1, 1) : fp8_transpose_config(rows, cols);
  launch.template run<detail::fp8_quantize_transposed_body<F8, T>>(c, d_qt, d_inv_scale, d_x,
                                                                   rows, cols, d_scale);
}

#if defined(__CUDACC__)

template <class T>
void fp8_amax_accumulate(float* d_amax, const T* d_x, std::int64_t n, void* d_scratch,
                         std::size_t scratch_bytes, cudaStream_t stream) {
  fp8_amax_accumulate_launch(device_launcher{stream}, d_amax, d_x, n, d_scratch, scratch_bytes);
}

template <class F8, class T>
void fp8_quantize(F8* d_q, float* d_inv_scale, const T* d_x, std::int64_t n, const float* d_scale,
                  cudaStream_t stream) {
  fp8_quantize_launch(device_launcher{stream}, d_q, d_inv_scale, d_x, n, d_scale);
}

template <class F8, class T>
void fp8_quantize_transposed(F8* d_qt, float* d_inv_scale, const T* d_x, std::int64_t rows,
                             std::int64_t cols, const float* d_scale, cudaStream_t stream) {
  fp8_quantize_transposed_launch(device_launcher{stream}, d_qt, d_inv_scale, d_x, rows, cols,
                                 d_scale);
}

#if TESSERA_CUDA_DEFINES_ENTRIES  // header-only, or cuda/kernels_fp8.cu (kernels/cuda/linkage.hpp)
TESSERA_CUDA_ENTRY void fp8_update_scale(float* d_scale, const float* d_amax, float fp8_max,
                                         int margin, cudaStream_t stream) {
  fp8_update_scale_launch(device_launcher{stream}, d_scale, d_amax, fp8_max, margin);
}
#endif

#endif  // __CUDACC__

}  // namespace tessera::kernels::cuda
