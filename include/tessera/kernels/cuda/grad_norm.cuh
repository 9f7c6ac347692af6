#pragma once
/// \file kernels/cuda/grad_norm.cuh
/// Global gradient sum of squares (float64, deterministic) and the clip
/// coefficient on the GPU (declared and documented in kernels/cuda/kernels.hpp).
/// The bodies are written over the primitive interface of
/// kernels/cuda/block.hpp, so the host tests run them under the block
/// emulator (tests/kernels/emulated_grad_norm.cpp) against the host kernels
/// of kernels/optimizer.hpp.
///
/// Stage 1: grad_norm_partial_config(n).grid_x blocks (a function of n only)
/// each sum a grid-stride share in float64 with a CUB block reduction and
/// write one partial. Stage 2: one block adds the partials, each thread a
/// fixed strided subset in order, then a CUB block reduction. Same n, same
/// bits, on any GPU, for a g as aligned (a g not 16-byte aligned takes the
/// scalar variant, whose grid-stride shares differ, so its last bit may).
/// The host adds blocks of 4096 in order: another order, so the two agree to
/// float64 rounding, not bit for bit.

#include <math.h>

#include <cstdint>
#include <type_traits>

#include "tessera/core/error.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/kernels/cuda/block.hpp"
#include "tessera/kernels/detail/clip.hpp"

#if defined(__CUDACC__)
#include "tessera/kernels/cuda/kernels.hpp"
#endif

namespace tessera::kernels::cuda {

namespace detail {

/// partial[block] = sum of g[i]^2 (float64) over the block's grid-stride
/// share of [0, n), g of G in {float, bf16} widened exactly; V elements per
/// access.
template <class G, int V>
struct sum_squares_partial_body {
  static constexpr int threads = grad_norm_threads;
  static constexpr std::size_t smem_bound = grad_norm_smem_bound;
  static constexpr const char* name = "sum_squares_partial";
  template <class Ops>
  struct shared_storage {
    typename Ops::template block_reduce<double, threads>::storage reduce;
  };

  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index& b, shared_storage<Ops>& sm, double* partial,
                                   const G* g, std::int64_t n) {
    using reduce = typename Ops::template block_reduce<double, threads>;
    double s = 0.0;
    elementwise_apply<V>(b, n, [&]<int W>(std::int64_t i) {
      const pack<G, W> p = Ops::template ld_pack<W>(g + i);
      TESSERA_UNROLL
      for (int k = 0; k < W; ++k) {
        const double x = static_cast<double>(to<float>(p.v[k]));
        s += x * x;
      }
    });
    const double total = reduce::sum(sm.reduce, s);
    if (b.tid == 0) Ops::st(partial + b.x, total);
  }
};

/// *out = (accumulate ? *out : 0) + the sum of partial[0, count): thread t
/// the partials t, t + 256, ... in order, then the block reduction.
struct sum_squares_final_body {
  static constexpr int threads = grad_norm_threads;
  static constexpr std::size_t smem_bound = grad_norm_smem_bound;
  static constexpr const char* name = "sum_squares_final";
  template <class Ops>
  struct shared_storage {
    typename Ops::template block_reduce<double, threads>::storage reduce;
  };

  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index& b, shared_storage<Ops>& sm, double* out,
                                   const double* partial, std::int64_t count, bool accumulate) {
    using reduce = typename Ops::template block_reduce<double, threads>;
    double s = 0.0;
    for (std::int64_t i = b.tid; i < count; i += threads) s += Ops::ld(partial + i);
    const double total = reduce::sum(sm.reduce, s);
    if (b.tid == 0)
      Ops::st(out, accumulate ? Ops::ld(static_cast<const double*>(out)) + total : total);
  }
};

/// *coef = unscaled_clip_coefficient_of(*sum_squares, max_norm, inv_loss_scale)
/// as a float: one thread.
struct clip_coefficient_body {
  static constexpr int threads = 1;
  static constexpr std::size_t smem_bound = 0;
  static constexpr const char* name = "clip_coefficient";
  template <class Ops>
  using shared_storage = no_shared;

  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index&, no_shared&, float* coef,
                                   const double* sum_squares, double max_norm,
                                   double inv_loss_scale) {
    Ops::st(coef, static_cast<float>(
                      unscaled_clip_coefficient_of(Ops::ld(sum_squares), max_norm, inv_loss_scale)));
  }
};

}  // namespace detail

/// grad_sum_squares (kernels.hpp) on `launch`: the partial sums into the
/// scratch (16-byte loads when g is aligned; the partial count does not
/// depend on it, each thread's share does), then their sum into *d_out.
template <class Launcher, class G>
void grad_sum_squares_launch(const Launcher& launch, double* d_out, const G* d_g, std::int64_t n,
                             void* d_scratch, std::size_t scratch_bytes, bool accumulate) {
  const launch_config c = grad_norm_partial_config(n);
  TESSERA_THROW_IF(scratch_bytes < c.scratch_bytes, config_error,
                   "grad_sum_squares (cuda): scratch of ", scratch_bytes, " bytes is below the ",
                   c.scratch_bytes, " that n=", n, " needs (grad_sum_squares_scratch_bytes)");
  double* partial = static_cast<double*>(d_scratch);
  constexpr int V = detail::vec_width<G>;
  if (detail::all_aligned(16, d_g))
    launch.template run<detail::sum_squares_partial_body<G, V>>(c, partial, d_g, n);
  else
    launch.template run<detail::sum_squares_partial_body<G, 1>>(c, partial, d_g, n);
  launch.template run<detail::sum_squares_final_body>(
      grad_norm_final_config(), d_out, static_cast<const double*>(partial), c.grid_x, accumulate);
}

/// clip_coefficient (kernels.hpp) on `launch`.
template <class Launcher>
void clip_coefficient_launch(const Launcher& launch, float* d_coef, const double* d_sum_squares,
                             double max_norm, double inv_loss_scale = 1.0) {
  launch.template run<detail::clip_coefficient_body>(clip_coefficient_config(), d_coef,
                                                     d_sum_squares, max_norm, inv_loss_scale);
}

#if defined(__CUDACC__)

template <class G>
void grad_sum_squares(double* d_out, const G* d_g, std::int64_t n, void* d_scratch,
                      std::size_t scratch_bytes, cudaStream_t stream, bool accumulate) {
  grad_sum_squares_launch(device_launcher{stream}, d_out, d_g, n, d_scratch, scratch_bytes,
                          accumulate);
}

template <class F>
void clip_coefficient(F* d_coef, const double* d_sum_squares, double max_norm,
                      cudaStream_t stream, double inv_loss_scale) {
  static_assert(std::is_same_v<F, float>, "clip_coefficient writes a float");
  clip_coefficient_launch(device_launcher{stream}, d_coef, d_sum_squares, max_norm,
                          inv_loss_scale);
}

#endif  // __CUDACC__

}  // namespace tessera::kernels::cuda
