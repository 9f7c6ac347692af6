#pragma once
/// \file kernels/cuda/adafactor.cuh
/// Multi-tensor Adafactor over a flat buffer on the GPU (declared and
/// documented in kernels/cuda/kernels.hpp): the six passes of the host
/// kernels::adafactor_step (kernels/adafactor.hpp) as six kernels, each
/// over every tensor of the table at once, with the per-element arithmetic
/// of kernels/detail/adafactor.hpp:
///
///   adafactor_rows          one block a row: the row statistic (a matrix's
///                           mean of g^2 + eps1) or each element's (a
///                           vector); the row's sum of p^2 (scale_parameter)
///   adafactor_cols          one thread a column of a matrix, down its rows
///   adafactor_tensor_lr     one block a tensor: the mean of its row
///                           statistics, its lr
///   adafactor_rows_u2       one block a row: its sum of u^2
///   adafactor_tensor_clip   one block a tensor: its clip divisor
///   adafactor_apply         one thread an element: the update
///
/// Sums are float64: a column's in row order, as the host's; a row's and a
/// tensor's over 256 threads then CUB's block tree, a fixed order that is
/// not the host's, so the statistics agree with the host's to float64
/// rounding of the sums (to float rounding once stored). Deterministic: no
/// atomics, each order fixed by the sizes. The bodies are written over the
/// primitive interface of kernels/cuda/block.hpp, so the host tests run
/// them under the block emulator (tests/kernels/emulated_optimizer.cpp). A
/// non-finite clip coefficient makes every kernel return before it writes.

#include <math.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "tessera/core/error.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/kernels/cuda/block.hpp"
#include "tessera/kernels/detail/adafactor.hpp"

#if defined(__CUDACC__)
#include "tessera/kernels/cuda/kernels.hpp"
#endif

namespace tessera::kernels::cuda {

/// Threads per block of the Adafactor kernels.
inline constexpr int adafactor_threads = 256;
/// Most blocks a row or tensor pass uses (each block then loops, grid-stride).
inline constexpr std::int64_t adafactor_max_blocks = std::int64_t(1) << 20;
/// Bound on a row or tensor pass's shared_storage (a CUB BlockReduce of doubles).
inline constexpr std::size_t adafactor_smem_bound = 512;

/// One block a row (or a tensor) of `count`, grid-stride beyond adafactor_max_blocks.
constexpr launch_config adafactor_block_config(std::int64_t count) {
  if (count < 0) throw config_error("adafactor (cuda): negative size");
  launch_config c;
  c.block = adafactor_threads;
  c.grid_x = std::clamp<std::int64_t>(count, 1, adafactor_max_blocks);
  c.smem = adafactor_smem_bound;
  return c;
}

namespace detail {

using kernels::adafactor_buffers;
using kernels::adafactor_tensor;
using step_params = kernels::detail::adafactor_step_params<float>;

/// The last tensor of tensors[0, nt) whose `field` is <= x (the field is
/// non-decreasing along the table); -1 if none.
template <class Ops>
TESSERA_BLOCK_FN int adafactor_find(const adafactor_tensor* tensors, int nt,
                                    std::int64_t adafactor_tensor::*field, std::int64_t x) {
  int lo = 0, hi = nt;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (Ops::ld(&(tensors[mid].*field)) <= x)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo - 1;
}

/// What the kernels read of one tensor.
struct adafactor_view {
  std::int64_t begin, end, rows, cols, stat, row, col, param_shift, grad_shift;
  bool factored, decay;
};
template <class Ops>
TESSERA_BLOCK_FN adafactor_view adafactor_load(const adafactor_tensor* t) {
  return {Ops::ld(&t->begin),         Ops::ld(&t->end),         Ops::ld(&t->rows),
          Ops::ld(&t->cols),          Ops::ld(&t->stat),        Ops::ld(&t->row),
          Ops::ld(&t->col),           Ops::ld(&t->param_shift), Ops::ld(&t->grad_shift),
          Ops::ld(&t->factored) != 0, Ops::ld(&t->decay) != 0};
}

/// Applies the device clip coefficient to s.grad_scale; false (the step is
/// skipped: write nothing) when it is not finite.
template <class Ops>
TESSERA_BLOCK_FN bool adafactor_scale(const float* grad_scale, step_params& s) {
  if (grad_scale) {
    const float c = Ops::ld(grad_scale);
    if (!isfinite(c)) return false;
    s.grad_scale *= c;
  }
  return true;
}

/// Element i's scaled gradient and current parameter (its master weight with Master).
template <class Ops, class Grad>
TESSERA_BLOCK_FN float adafactor_grad(const Grad* grads, const adafactor_view& t, std::int64_t i,
                                      const step_params& s) {
  return to<float>(Ops::ld(grads + i + t.grad_shift)) * s.grad_scale;
}
template <class Ops, bool Master, class Param>
TESSERA_BLOCK_FN float adafactor_param(const Param* params, const float* master,
                                       const adafactor_view& t, std::int64_t i) {
  if constexpr (Master)
    return Ops::ld(master + i);
  else
    return to<float>(Ops::ld(params + i + t.param_shift));
}

/// Element i's unclipped update (row r of tensor t, its column i - first).
template <class Ops, class Grad>
TESSERA_BLOCK_FN float adafactor_unclipped(const Grad* grads, const float* stats,
                                           const adafactor_view& t, std::int64_t i, std::int64_t r,
                                           std::int64_t first, float row_mean,
                                           const step_params& s) {
  const float g = adafactor_grad<Ops>(grads, t, i, s);
  if (t.factored)
    return kernels::detail::adafactor_factored_update(
        g, Ops::ld(stats + t.stat + r), row_mean, Ops::ld(stats + t.stat + t.rows + (i - first)));
  return kernels::detail::adafactor_vector_update(g, Ops::ld(stats + t.stat + (i - t.begin)));
}

/// Pass 1: one block a row.
template <class Param, class Grad, bool Master>
struct adafactor_rows_body {
  static constexpr int threads = adafactor_threads;
  static constexpr std::size_t smem_bound = adafactor_smem_bound;
  static constexpr const char* name = "adafactor_rows";
  template <class Ops>
  struct shared_storage {
    typename Ops::template block_reduce<double, threads>::storage reduce;
  };

  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index& b, shared_storage<Ops>& sm,
                                   const Param* params, const float* master, const Grad* grads,
                                   const adafactor_tensor* tensors, int nt, std::int64_t rows,
                                   adafactor_buffers<float> buf, step_params s,
                                   const float* grad_scale) {
    using reduce = typename Ops::template block_reduce<double, threads>;
    if (!adafactor_scale<Ops>(grad_scale, s)) return;
    for (std::int64_t g = b.x; g < rows; g += b.grid_x) {
      const adafactor_view t = adafactor_load<Ops>(
          tensors + adafactor_find<Ops>(tensors, nt, &adafactor_tensor::row, g));
      const std::int64_t r = g - t.row, first = t.begin + r * t.cols;
      const std::int64_t last = first + t.cols < t.end ? first + t.cols : t.end;
      double sq = 0, p2 = 0;
      for (std::int64_t i = first + b.tid; i < last; i += threads) {
        const float q = kernels::detail::adafactor_square(adafactor_grad<Ops>(grads, t, i, s), s);
        if (t.factored) {
          sq += static_cast<double>(q);
        } else {
          float* v = buf.stats + t.stat + (i - t.begin);
          Ops::st(v,
                  kernels::detail::adafactor_average(Ops::ld(static_cast<const float*>(v)), q, s));
        }
        if (s.scale_parameter) {
          const double p = static_cast<double>(adafactor_param<Ops, Master>(params, master, t, i));
          p2 += p * p;
        }
      }
      if (t.factored) {
        const double total = reduce::sum(sm.reduce, sq);
        if (b.tid == 0) {
          float* v = buf.stats + t.stat + r;
          Ops::st(v, kernels::detail::adafactor_average(
                         Ops::ld(static_cast<const float*>(v)),
                         static_cast<float>(total / static_cast<double>(t.cols)), s));
        }
        Ops::sync();
      }
      const double total_p2 = reduce::sum(sm.reduce, p2);
      if (b.tid == 0) Ops::st(buf.partial + g, total_p2);
      Ops::sync();
    }
  }
};

/// Pass 2: one thread a column of a matrix, its rows in order.
template <class Grad>
struct adafactor_cols_body {
  static constexpr int threads = adafactor_threads;
  static constexpr std::size_t smem_bound = 0;
  static constexpr const char* name = "adafactor_cols";
  template <class Ops>
  using shared_storage = no_shared;

  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index& b, no_shared&, const Grad* grads,
                                   const adafactor_tensor* tensors, int nt, std::int64_t cols,
                                   adafactor_buffers<float> buf, step_params s,
                                   const float* grad_scale) {
    if (!adafactor_scale<Ops>(grad_scale, s)) return;
    const std::int64_t stride = b.grid_x * b.threads;
    for (std::int64_t c = b.x * b.threads + b.tid; c < cols; c += stride) {
      const adafactor_view t = adafactor_load<Ops>(
          tensors + adafactor_find<Ops>(tensors, nt, &adafactor_tensor::col, c));
      const std::int64_t j = c - t.col;
      double sq = 0;
      for (std::int64_t r = 0; r < t.rows; ++r)
        sq += static_cast<double>(kernels::detail::adafactor_square(
            adafactor_grad<Ops>(grads, t, t.begin + r * t.cols + j, s), s));
      float* v = buf.stats + t.stat + t.rows + j;
      Ops::st(v, kernels::detail::adafactor_average(
                     Ops::ld(static_cast<const float*>(v)),
                     static_cast<float>(sq / static_cast<double>(t.rows)), s));
    }
  }
};

/// Pass 3: one block a tensor: the mean of its row statistics, its lr.
struct adafactor_tensor_lr_body {
  static constexpr int threads = adafactor_threads;
  static constexpr std::size_t smem_bound = adafactor_smem_bound;
  static constexpr const char* name = "adafactor_tensor_lr";
  template <class Ops>
  struct shared_storage {
    typename Ops::template block_reduce<double, threads>::storage reduce;
  };

  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index& b, shared_storage<Ops>& sm,
                                   const adafactor_tensor* tensors, int nt,
                                   adafactor_buffers<float> buf, step_params s,
                                   const float* grad_scale) {
    using reduce = typename Ops::template block_reduce<double, threads>;
    if (!adafactor_scale<Ops>(grad_scale, s)) return;
    for (std::int64_t k = b.x; k < nt; k += b.grid_x) {
      const adafactor_view t = adafactor_load<Ops>(tensors + k);
      double rows = 0, p2 = 0;
      for (std::int64_t r = b.tid; r < t.rows; r += threads) {
        if (t.factored)
          rows += static_cast<double>(Ops::ld(static_cast<const float*>(buf.stats + t.stat + r)));
        p2 += Ops::ld(static_cast<const double*>(buf.partial + t.row + r));
      }
      const double total_rows = reduce::sum(sm.reduce, rows);
      if (b.tid == 0)
        Ops::st(buf.scalars + 3 * k, static_cast<float>(total_rows / static_cast<double>(t.rows)));
      Ops::sync();
      const double total_p2 = reduce::sum(sm.reduce, p2);
      if (b.tid == 0)
        Ops::st(buf.scalars + 3 * k + 1,
                kernels::detail::adafactor_tensor_lr(total_p2, t.end - t.begin, s));
      Ops::sync();
    }
  }
};

/// Pass 4: one block a row: its sum of u^2.
template <class Grad>
struct adafactor_rows_u2_body {
  static constexpr int threads = adafactor_threads;
  static constexpr std::size_t smem_bound = adafactor_smem_bound;
  static constexpr const char* name = "adafactor_rows_u2";
  template <class Ops>
  struct shared_storage {
    typename Ops::template block_reduce<double, threads>::storage reduce;
  };

  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index& b, shared_storage<Ops>& sm, const Grad* grads,
                                   const adafactor_tensor* tensors, int nt, std::int64_t rows,
                                   adafactor_buffers<float> buf, step_params s,
                                   const float* grad_scale) {
    using reduce = typename Ops::template block_reduce<double, threads>;
    if (!adafactor_scale<Ops>(grad_scale, s)) return;
    for (std::int64_t g = b.x; g < rows; g += b.grid_x) {
      const int k = adafactor_find<Ops>(tensors, nt, &adafactor_tensor::row, g);
      const adafactor_view t = adafactor_load<Ops>(tensors + k);
      const std::int64_t r = g - t.row, first = t.begin + r * t.cols;
      const std::int64_t last = first + t.cols < t.end ? first + t.cols : t.end;
      const float row_mean = Ops::ld(static_cast<const float*>(buf.scalars + 3 * k));
      double u2 = 0;
      for (std::int64_t i = first + b.tid; i < last; i += threads) {
        const double u = static_cast<double>(
            adafactor_unclipped<Ops>(grads, buf.stats, t, i, r, first, row_mean, s));
        u2 += u * u;
      }
      const double total = reduce::sum(sm.reduce, u2);
      if (b.tid == 0) Ops::st(buf.partial + g, total);
      Ops::sync();
    }
  }
};

/// Pass 5: one block a tensor: its clip divisor.
struct adafactor_tensor_clip_body {
  static constexpr int threads = adafactor_threads;
  static constexpr std::size_t smem_bound = adafactor_smem_bound;
  static constexpr const char* name = "adafactor_tensor_clip";
  template <class Ops>
  struct shared_storage {
    typename Ops::template block_reduce<double, threads>::storage reduce;
  };

  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index& b, shared_storage<Ops>& sm,
                                   const adafactor_tensor* tensors, int nt,
                                   adafactor_buffers<float> buf, step_params s,
                                   const float* grad_scale) {
    using reduce = typename Ops::template block_reduce<double, threads>;
    if (!adafactor_scale<Ops>(grad_scale, s)) return;
    for (std::int64_t k = b.x; k < nt; k += b.grid_x) {
      const adafactor_view t = adafactor_load<Ops>(tensors + k);
      double u2 = 0;
      for (std::int64_t r = b.tid; r < t.rows; r += threads)
        u2 += Ops::ld(static_cast<const double*>(buf.partial + t.row + r));
      const double total = reduce::sum(sm.reduce, u2);
      if (b.tid == 0)
        Ops::st(buf.scalars + 3 * k + 2,
                kernels::detail::adafactor_clip_divisor(total, t.end - t.begin, s));
      Ops::sync();
    }
  }
};

/// Pass 6: one thread an element of the optimizer's [0, n): the update;
/// elements in no tensor are left alone.
template <class Param, class Grad, bool Master>
struct adafactor_apply_body {
  static constexpr int threads = adafactor_threads;
  static constexpr std::size_t smem_bound = 0;
  static constexpr const char* name = "adafactor_apply";
  template <class Ops>
  using shared_storage = no_shared;

  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index& b, no_shared&, Param* params, float* master,
                                   const Grad* grads, const adafactor_tensor* tensors, int nt,
                                   std::int64_t n, adafactor_buffers<float> buf, step_params s,
                                   const float* grad_scale) {
    if (!adafactor_scale<Ops>(grad_scale, s)) return;
    const std::int64_t stride = b.grid_x * b.threads;
    for (std::int64_t i = b.x * b.threads + b.tid; i < n; i += stride) {
      const int k = adafactor_find<Ops>(tensors, nt, &adafactor_tensor::begin, i);
      if (k < 0) continue;
      const adafactor_view t = adafactor_load<Ops>(tensors + k);
      if (i >= t.end) continue;
      const std::int64_t r = (i - t.begin) / t.cols, first = t.begin + r * t.cols;
      const float* sc = buf.scalars + 3 * k;
      const float u = adafactor_unclipped<Ops>(grads, buf.stats, t, i, r, first, Ops::ld(sc), s);
      float m = s.first_moment ? Ops::ld(static_cast<const float*>(buf.exp_avg + i)) : 0.0f;
      float p = adafactor_param<Ops, Master>(params, master, t, i);
      kernels::detail::adafactor_apply(p, m, u, Ops::ld(sc + 2), Ops::ld(sc + 1), s, t.decay);
      if (s.first_moment) Ops::st(buf.exp_avg + i, m);
      if constexpr (Master) Ops::st(master + i, p);
      Ops::st(params + i + t.param_shift, to<Param>(p));
    }
  }
};

}  // namespace detail

/// adafactor_step (kernels.hpp) on `launch`: the argument checks, then the
/// six passes; no launch without tensors.
template <class Launcher, class Param, class Grad>
void adafactor_step_launch(const Launcher& launch, Param* d_params, float* d_master,
                           const Grad* d_grads, const adafactor_tensor* d_tensors,
                           const adafactor_sizes& sizes, const adafactor_buffers<float>& buf,
                           const kernels::detail::adafactor_step_params<float>& step,
                           const float* d_grad_scale) {
  constexpr bool has_master = !std::is_same_v<Param, float>;
  kernels::detail::check_adafactor_step<Param, float>("adafactor_step (cuda)", d_master, buf, sizes,
                                                      step.first_moment);
  if (sizes.tensors == 0) return;
  const Param* cparams = d_params;
  launch.template run<detail::adafactor_rows_body<Param, Grad, has_master>>(
      adafactor_block_config(sizes.rows), cparams, static_cast<const float*>(d_master), d_grads,
      d_tensors, sizes.tensors, sizes.rows, buf, step, d_grad_scale);
  if (sizes.cols > 0)
    launch.template run<detail::adafactor_cols_body<Grad>>(elementwise_config(sizes.cols, 1),
                                                           d_grads, d_tensors, sizes.tensors,
                                                           sizes.cols, buf, step, d_grad_scale);
  launch.template run<detail::adafactor_tensor_lr_body>(
      adafactor_block_config(sizes.tensors), d_tensors, sizes.tensors, buf, step, d_grad_scale);
  launch.template run<detail::adafactor_rows_u2_body<Grad>>(adafactor_block_config(sizes.rows),
                                                            d_grads, d_tensors, sizes.tensors,
                                                            sizes.rows, buf, step, d_grad_scale);
  launch.template run<detail::adafactor_tensor_clip_body>(
      adafactor_block_config(sizes.tensors), d_tensors, sizes.tensors, buf, step, d_grad_scale);
  launch.template run<detail::adafactor_apply_body<Param, Grad, has_master>>(
      elementwise_config(sizes.n, 1), d_params, d_master, d_grads, d_tensors, sizes.tensors,
      sizes.n, buf, step, d_grad_scale);
}

#if defined(__CUDACC__)

template <class Param, class Grad>
void adafactor_step(Param* d_params, float* d_master, const Grad* d_grads,
                    const adafactor_tensor* d_tensors, const adafactor_sizes& sizes,
                    const adafactor_buffers<float>& buf,
                    const kernels::detail::adafactor_step_params<float>& step,
                    const float* d_grad_scale, cudaStream_t stream) {
  adafactor_step_launch(device_launcher{stream}, d_params, d_master, d_grads, d_tensors, sizes, buf,
                        step, d_grad_scale);
}

#endif  // __CUDACC__

}  // namespace tessera::kernels::cuda
