#pragma once
/// \file kernels/cuda/adafactor.cuh
/// Multi-tensor Adafactor over a flat buffer on the GPU (declared and
/// documented in kernels/cuda/kernels.hpp): the nine passes of the host
/// kernels::adafactor_step (kernels/adafactor.hpp) as ten kernels in its
/// three phases, each over every tensor of the table at once, with the
/// per-element arithmetic of kernels/detail/adafactor.hpp:
///
///   sums        adafactor_zero         one thread a double: the sums areas zeroed
///               adafactor_rows         one block a step row: a matrix row's sum
///                                      of g^2 + eps1, a vector's statistics; the
///                                      row's sum of p^2 (scale_parameter)
///               adafactor_cols         one thread a column of a matrix, down its rows
///               adafactor_tensor_p2    one block a tensor: its sum of p^2
///   statistics  adafactor_stats        one thread a statistic of a matrix
///               adafactor_tensor_lr    one block a tensor: the mean of its row
///                                      statistics, its lr
///               adafactor_rows_u2      one block a step row: its sum of u^2
///               adafactor_tensor_u2    one block a tensor: its sum of u^2
///   update      adafactor_tensor_clip  one thread a tensor: its clip divisor
///               adafactor_apply        one thread an element: the update
///
/// and adafactor_sum_ranks, one thread a double, adds the ranks' gathered
/// sums areas in rank order (optim::adafactor_optimizer between the phases).
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

/// One tensor of the table, every field read through Ops.
template <class Ops>
TESSERA_BLOCK_FN adafactor_tensor adafactor_load(const adafactor_tensor* p) {
  adafactor_tensor t;
  t.begin = Ops::ld(&p->begin);
  t.end = Ops::ld(&p->end);
  t.rows = Ops::ld(&p->rows);
  t.cols = Ops::ld(&p->cols);
  t.first = Ops::ld(&p->first);
  t.full_rows = Ops::ld(&p->full_rows);
  t.full_cols = Ops::ld(&p->full_cols);
  t.row_off = Ops::ld(&p->row_off);
  t.col_off = Ops::ld(&p->col_off);
  t.numel = Ops::ld(&p->numel);
  t.stat = Ops::ld(&p->stat);
  t.sum = Ops::ld(&p->sum);
  t.row = Ops::ld(&p->row);
  t.nrows = Ops::ld(&p->nrows);
  t.col = Ops::ld(&p->col);
  t.param_shift = Ops::ld(&p->param_shift);
  t.grad_shift = Ops::ld(&p->grad_shift);
  t.factored = Ops::ld(&p->factored);
  t.decay = Ops::ld(&p->decay);
  return t;
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
TESSERA_BLOCK_FN float adafactor_grad(const Grad* grads, const adafactor_tensor& t, std::int64_t i,
                                      const step_params& s) {
  return to<float>(Ops::ld(grads + i + t.grad_shift)) * s.grad_scale;
}
template <class Ops, bool Master, class Param>
TESSERA_BLOCK_FN float adafactor_param(const Param* params, const float* master,
                                       const adafactor_tensor& t, std::int64_t i) {
  if constexpr (Master)
    return Ops::ld(master + i);
  else
    return to<float>(Ops::ld(params + i + t.param_shift));
}

/// Element i's unclipped update (in step row x of tensor t).
template <class Ops, class Grad>
TESSERA_BLOCK_FN float adafactor_unclipped(const Grad* grads, const float* stats,
                                           const adafactor_tensor& t, std::int64_t i,
                                           const kernels::detail::adafactor_row& x, float row_mean,
                                           const step_params& s) {
  const float g = adafactor_grad<Ops>(grads, t, i, s);
  if (t.factored != 0)
    return kernels::detail::adafactor_factored_update(
        g, Ops::ld(stats + t.stat + t.row_off + x.r), row_mean,
        Ops::ld(stats + t.stat + t.full_rows + t.col_off + (i - x.lead)));
  return kernels::detail::adafactor_vector_update(g, Ops::ld(stats + t.stat + (i - t.begin)));
}

/// The block-per-row and block-per-tensor bodies' common members.
struct adafactor_block_body {
  static constexpr int threads = adafactor_threads;
  static constexpr std::size_t smem_bound = adafactor_smem_bound;
  template <class Ops>
  struct shared_storage {
    typename Ops::template block_reduce<double, threads>::storage reduce;
  };
};
/// The thread-per-item bodies' common members.
struct adafactor_thread_body {
  static constexpr int threads = adafactor_threads;
  static constexpr std::size_t smem_bound = 0;
  template <class Ops>
  using shared_storage = no_shared;
};

/// Sums, 0: one thread a double of the sums areas, zeroed.
struct adafactor_zero_body : adafactor_thread_body {
  static constexpr const char* name = "adafactor_zero";
  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index& b, no_shared&, std::int64_t n,
                                   adafactor_buffers<float> buf, step_params s,
                                   const float* grad_scale) {
    if (!adafactor_scale<Ops>(grad_scale, s)) return;
    const std::int64_t stride = b.grid_x * b.threads;
    for (std::int64_t j = b.x * b.threads + b.tid; j < n; j += stride) Ops::st(buf.sums + j, 0.0);
  }
};

/// Sums, 1: one block a step row.
template <class Param, class Grad, bool Master>
struct adafactor_rows_body : adafactor_block_body {
  static constexpr const char* name = "adafactor_rows";
  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index& b, shared_storage<Ops>& sm,
                                   const Param* params, const float* master, const Grad* grads,
                                   const adafactor_tensor* tensors, int nt, std::int64_t rows,
                                   adafactor_buffers<float> buf, step_params s,
                                   const float* grad_scale) {
    using reduce = typename Ops::template block_reduce<double, threads>;
    if (!adafactor_scale<Ops>(grad_scale, s)) return;
    for (std::int64_t g = b.x; g < rows; g += b.grid_x) {
      const adafactor_tensor t = adafactor_load<Ops>(
          tensors + adafactor_find<Ops>(tensors, nt, &adafactor_tensor::row, g));
      const kernels::detail::adafactor_row x = kernels::detail::adafactor_row_of(t, g - t.row);
      double sq = 0, p2 = 0;
      if (!x.pad)
        for (std::int64_t i = x.first + b.tid; i < x.last; i += threads) {
          const float q = kernels::detail::adafactor_square(adafactor_grad<Ops>(grads, t, i, s), s);
          if (t.factored != 0) {
            sq += static_cast<double>(q);
          } else {
            float* v = buf.stats + t.stat + (i - t.begin);
            Ops::st(
                v, kernels::detail::adafactor_average(Ops::ld(static_cast<const float*>(v)), q, s));
          }
          if (s.scale_parameter) {
            const double p =
                static_cast<double>(adafactor_param<Ops, Master>(params, master, t, i));
            p2 += p * p;
          }
        }
      if (t.factored != 0) {
        const double total = reduce::sum(sm.reduce, sq);
        if (b.tid == 0 && !x.pad) Ops::st(buf.sums + t.sum + t.row_off + x.r, total);
        Ops::sync();
      }
      const double total_p2 = reduce::sum(sm.reduce, p2);
      if (b.tid == 0) Ops::st(buf.partial + g, total_p2);
      Ops::sync();
    }
  }
};

/// Sums, 2: one thread a column of a matrix, its rows in order.
template <class Grad>
struct adafactor_cols_body : adafactor_thread_body {
  static constexpr const char* name = "adafactor_cols";
  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index& b, no_shared&, const Grad* grads,
                                   const adafactor_tensor* tensors, int nt, std::int64_t cols,
                                   adafactor_buffers<float> buf, step_params s,
                                   const float* grad_scale) {
    if (!adafactor_scale<Ops>(grad_scale, s)) return;
    const std::int64_t stride = b.grid_x * b.threads;
    for (std::int64_t c = b.x * b.threads + b.tid; c < cols; c += stride) {
      const adafactor_tensor t = adafactor_load<Ops>(
          tensors + adafactor_find<Ops>(tensors, nt, &adafactor_tensor::col, c));
      const std::int64_t j = c - t.col;
      double sq = 0;
      for (std::int64_t r = 0; r < t.nrows; ++r) {
        const kernels::detail::adafactor_row x = kernels::detail::adafactor_row_of(t, r);
        const std::int64_t i = x.lead + j;
        if (x.pad || i < x.first || i >= x.last) continue;
        sq += static_cast<double>(
            kernels::detail::adafactor_square(adafactor_grad<Ops>(grads, t, i, s), s));
      }
      Ops::st(buf.sums + t.sum + t.full_rows + t.col_off + j, sq);
    }
  }
};

/// Sums, 3 and statistics, 7: one block a tensor: the sum of its rows'
/// partial sums (p^2, then u^2) into sums slot `slot` from the area's end
/// (2: p^2, 1: u^2).
template <int Slot>
struct adafactor_tensor_sum_body : adafactor_block_body {
  static constexpr const char* name = Slot == 2 ? "adafactor_tensor_p2" : "adafactor_tensor_u2";
  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index& b, shared_storage<Ops>& sm,
                                   const adafactor_tensor* tensors, int nt,
                                   adafactor_buffers<float> buf, step_params s,
                                   const float* grad_scale) {
    using reduce = typename Ops::template block_reduce<double, threads>;
    if (!adafactor_scale<Ops>(grad_scale, s)) return;
    for (std::int64_t k = b.x; k < nt; k += b.grid_x) {
      const adafactor_tensor t = adafactor_load<Ops>(tensors + k);
      double acc = 0;
      for (std::int64_t r = b.tid; r < t.nrows; r += threads)
        acc += Ops::ld(static_cast<const double*>(buf.partial + t.row + r));
      const double total = reduce::sum(sm.reduce, acc);
      if (b.tid == 0) Ops::st(buf.sums + t.sum + adafactor_sum_slots(t) - Slot, total);
      Ops::sync();
    }
  }
};

/// Statistics, 4: one thread a statistic of a matrix (its row and column
/// means of the summed areas); a vector's were updated in pass 1.
struct adafactor_stats_body : adafactor_thread_body {
  static constexpr const char* name = "adafactor_stats";
  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index& b, no_shared&,
                                   const adafactor_tensor* tensors, int nt, std::int64_t stats,
                                   adafactor_buffers<float> buf, step_params s,
                                   const float* grad_scale) {
    if (!adafactor_scale<Ops>(grad_scale, s)) return;
    const std::int64_t stride = b.grid_x * b.threads;
    for (std::int64_t j = b.x * b.threads + b.tid; j < stats; j += stride) {
      const adafactor_tensor t = adafactor_load<Ops>(
          tensors + adafactor_find<Ops>(tensors, nt, &adafactor_tensor::stat, j));
      if (t.factored == 0) continue;
      const std::int64_t q = j - t.stat;
      const double over = static_cast<double>(q < t.full_rows ? t.full_cols : t.full_rows);
      float* v = buf.stats + j;
      Ops::st(v, kernels::detail::adafactor_average(
                     Ops::ld(static_cast<const float*>(v)),
                     static_cast<float>(Ops::ld(static_cast<const double*>(buf.sums + t.sum + q)) /
                                        over),
                     s));
    }
  }
};

/// Statistics, 5: one block a tensor: the mean of its row statistics, its lr.
struct adafactor_tensor_lr_body : adafactor_block_body {
  static constexpr const char* name = "adafactor_tensor_lr";
  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index& b, shared_storage<Ops>& sm,
                                   const adafactor_tensor* tensors, int nt,
                                   adafactor_buffers<float> buf, step_params s,
                                   const float* grad_scale) {
    using reduce = typename Ops::template block_reduce<double, threads>;
    if (!adafactor_scale<Ops>(grad_scale, s)) return;
    for (std::int64_t k = b.x; k < nt; k += b.grid_x) {
      const adafactor_tensor t = adafactor_load<Ops>(tensors + k);
      double rows = 0;
      if (t.factored != 0)
        for (std::int64_t r = b.tid; r < t.full_rows; r += threads)
          rows += static_cast<double>(Ops::ld(static_cast<const float*>(buf.stats + t.stat + r)));
      const double total_rows = reduce::sum(sm.reduce, rows);
      if (b.tid == 0) {
        Ops::st(buf.scalars + 3 * k,
                t.factored != 0 ? static_cast<float>(total_rows / static_cast<double>(t.full_rows))
                                : 0.0f);
        const double p2 =
            Ops::ld(static_cast<const double*>(buf.sums + t.sum + adafactor_sum_slots(t) - 2));
        Ops::st(buf.scalars + 3 * k + 1, kernels::detail::adafactor_tensor_lr(p2, t.numel, s));
      }
      Ops::sync();
    }
  }
};

/// Statistics, 6: one block a step row: its sum of u^2.
template <class Grad>
struct adafactor_rows_u2_body : adafactor_block_body {
  static constexpr const char* name = "adafactor_rows_u2";
  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index& b, shared_storage<Ops>& sm, const Grad* grads,
                                   const adafactor_tensor* tensors, int nt, std::int64_t rows,
                                   adafactor_buffers<float> buf, step_params s,
                                   const float* grad_scale) {
    using reduce = typename Ops::template block_reduce<double, threads>;
    if (!adafactor_scale<Ops>(grad_scale, s)) return;
    for (std::int64_t g = b.x; g < rows; g += b.grid_x) {
      const int k = adafactor_find<Ops>(tensors, nt, &adafactor_tensor::row, g);
      const adafactor_tensor t = adafactor_load<Ops>(tensors + k);
      const kernels::detail::adafactor_row x = kernels::detail::adafactor_row_of(t, g - t.row);
      const float row_mean = Ops::ld(static_cast<const float*>(buf.scalars + 3 * k));
      double u2 = 0;
      if (!x.pad)
        for (std::int64_t i = x.first + b.tid; i < x.last; i += threads) {
          const double u =
              static_cast<double>(adafactor_unclipped<Ops>(grads, buf.stats, t, i, x, row_mean, s));
          u2 += u * u;
        }
      const double total = reduce::sum(sm.reduce, u2);
      if (b.tid == 0) Ops::st(buf.partial + g, total);
      Ops::sync();
    }
  }
};

/// Update, 8: one thread a tensor: its clip divisor.
struct adafactor_tensor_clip_body : adafactor_thread_body {
  static constexpr const char* name = "adafactor_tensor_clip";
  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index& b, no_shared&,
                                   const adafactor_tensor* tensors, int nt,
                                   adafactor_buffers<float> buf, step_params s,
                                   const float* grad_scale) {
    if (!adafactor_scale<Ops>(grad_scale, s)) return;
    const std::int64_t stride = b.grid_x * b.threads;
    for (std::int64_t k = b.x * b.threads + b.tid; k < nt; k += stride) {
      const adafactor_tensor t = adafactor_load<Ops>(tensors + k);
      const double u2 =
          Ops::ld(static_cast<const double*>(buf.sums + t.sum + adafactor_sum_slots(t) - 1));
      Ops::st(buf.scalars + 3 * k + 2, kernels::detail::adafactor_clip_divisor(u2, t.numel, s));
    }
  }
};

/// Update, 9: one thread an element of the optimizer's [0, n): the update;
/// elements in no tensor, and vocabulary padding, are left alone.
template <class Param, class Grad, bool Master>
struct adafactor_apply_body : adafactor_thread_body {
  static constexpr const char* name = "adafactor_apply";
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
      const adafactor_tensor t = adafactor_load<Ops>(tensors + k);
      if (i >= t.end) continue;
      // Its step row: a matrix's local row less the piece's first, a vector's row of cols.
      const std::int64_t row = t.factored != 0
                                   ? (t.first + (i - t.begin)) / t.cols - t.first / t.cols
                                   : (i - t.begin) / t.cols;
      const kernels::detail::adafactor_row x = kernels::detail::adafactor_row_of(t, row);
      if (x.pad) continue;
      const float* sc = buf.scalars + 3 * k;
      const float u = adafactor_unclipped<Ops>(grads, buf.stats, t, i, x, Ops::ld(sc), s);
      float m = s.first_moment ? Ops::ld(static_cast<const float*>(buf.exp_avg + i)) : 0.0f;
      float p = adafactor_param<Ops, Master>(params, master, t, i);
      kernels::detail::adafactor_apply(p, m, u, Ops::ld(sc + 2), Ops::ld(sc + 1), s, t.decay != 0);
      if (s.first_moment) Ops::st(buf.exp_avg + i, m);
      if constexpr (Master) Ops::st(master + i, p);
      Ops::st(params + i + t.param_shift, to<Param>(p));
    }
  }
};

/// One thread a double: out[j] = the sum over r of gathered[r stride + j], in rank order.
struct adafactor_sum_ranks_body : adafactor_thread_body {
  static constexpr const char* name = "adafactor_sum_ranks";
  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index& b, no_shared&, double* out,
                                   const double* gathered, int ranks, std::int64_t n,
                                   std::int64_t stride) {
    const std::int64_t step = b.grid_x * b.threads;
    for (std::int64_t j = b.x * b.threads + b.tid; j < n; j += step) {
      double acc = Ops::ld(gathered + j);
      for (int r = 1; r < ranks; ++r) acc += Ops::ld(gathered + r * stride + j);
      Ops::st(out + j, acc);
    }
  }
};

}  // namespace detail

/// adafactor_step (kernels.hpp) on `launch`: the argument checks, then
/// the kernels of `phase` (all of them for adafactor_phase::all); no launch
/// without tensors.
template <class Launcher, class Param, class Grad>
void adafactor_step_launch(const Launcher& launch, Param* d_params, float* d_master,
                           const Grad* d_grads, const adafactor_tensor* d_tensors,
                           const adafactor_sizes& sizes, const adafactor_buffers<float>& buf,
                           const kernels::detail::adafactor_step_params<float>& step,
                           const float* d_grad_scale,
                           kernels::adafactor_phase phase = kernels::adafactor_phase::all) {
  constexpr bool has_master = !std::is_same_v<Param, float>;
  using kernels::adafactor_phase;
  kernels::detail::check_adafactor_step<Param, float>("adafactor_step (cuda)", d_master, buf, sizes,
                                                      step.first_moment);
  if (sizes.tensors == 0) return;
  const int nt = sizes.tensors;
  const bool all = phase == adafactor_phase::all;
  if (all || phase == adafactor_phase::sums) {
    launch.template run<detail::adafactor_zero_body>(elementwise_config(sizes.sums, 1), sizes.sums,
                                                     buf, step, d_grad_scale);
    const Param* cparams = d_params;
    launch.template run<detail::adafactor_rows_body<Param, Grad, has_master>>(
        adafactor_block_config(sizes.rows), cparams, static_cast<const float*>(d_master), d_grads,
        d_tensors, nt, sizes.rows, buf, step, d_grad_scale);
    if (sizes.cols > 0)
      launch.template run<detail::adafactor_cols_body<Grad>>(elementwise_config(sizes.cols, 1),
                                                             d_grads, d_tensors, nt, sizes.cols,
                                                             buf, step, d_grad_scale);
    launch.template run<detail::adafactor_tensor_sum_body<2>>(adafactor_block_config(nt), d_tensors,
                                                              nt, buf, step, d_grad_scale);
  }
  if (all || phase == adafactor_phase::statistics) {
    if (sizes.stats > 0)
      launch.template run<detail::adafactor_stats_body>(
          elementwise_config(sizes.stats, 1), d_tensors, nt, sizes.stats, buf, step, d_grad_scale);
    launch.template run<detail::adafactor_tensor_lr_body>(adafactor_block_config(nt), d_tensors, nt,
                                                          buf, step, d_grad_scale);
    launch.template run<detail::adafactor_rows_u2_body<Grad>>(adafactor_block_config(sizes.rows),
                                                              d_grads, d_tensors, nt, sizes.rows,
                                                              buf, step, d_grad_scale);
    launch.template run<detail::adafactor_tensor_sum_body<1>>(adafactor_block_config(nt), d_tensors,
                                                              nt, buf, step, d_grad_scale);
  }
  if (all || phase == adafactor_phase::update) {
    launch.template run<detail::adafactor_tensor_clip_body>(elementwise_config(nt, 1), d_tensors,
                                                            nt, buf, step, d_grad_scale);
    launch.template run<detail::adafactor_apply_body<Param, Grad, has_master>>(
        elementwise_config(sizes.n, 1), d_params, d_master, d_grads, d_tensors, nt, sizes.n, buf,
        step, d_grad_scale);
  }
}

/// adafactor_sum_ranks (kernels.hpp) on `launch`. Throws config_error for
/// ranks < 1, n < 0 or stride < n; no launch for n == 0.
template <class Launcher>
void adafactor_sum_ranks_launch(const Launcher& launch, double* d_out, const double* d_gathered,
                                int ranks, std::int64_t n, std::int64_t stride) {
  TESSERA_THROW_IF(ranks < 1 || n < 0 || stride < n, config_error,
                   "adafactor_sum_ranks (cuda): ranks=", ranks, " must be >= 1, n=", n,
                   " >= 0 and stride=", stride, " >= n");
  if (n == 0) return;
  launch.template run<detail::adafactor_sum_ranks_body>(elementwise_config(n, 1), d_out, d_gathered,
                                                        ranks, n, stride);
}

#if defined(__CUDACC__)

template <class Param, class Grad>
void adafactor_step(Param* d_params, float* d_master, const Grad* d_grads,
                    const adafactor_tensor* d_tensors, const adafactor_sizes& sizes,
                    const adafactor_buffers<float>& buf,
                    const kernels::detail::adafactor_step_params<float>& step,
                    const float* d_grad_scale, kernels::adafactor_phase phase,
                    cudaStream_t stream) {
  adafactor_step_launch(device_launcher{stream}, d_params, d_master, d_grads, d_tensors, sizes, buf,
                        step, d_grad_scale, phase);
}

template <class T>
void adafactor_sum_ranks(T* d_out, const T* d_gathered, int ranks, std::int64_t n,
                         std::int64_t stride, cudaStream_t stream) {
  static_assert(std::is_same_v<T, double>, "adafactor_sum_ranks (cuda): the sums are float64");
  adafactor_sum_ranks_launch(device_launcher{stream}, d_out, d_gathered, ranks, n, stride);
}

#endif  // __CUDACC__

}  // namespace tessera::kernels::cuda
