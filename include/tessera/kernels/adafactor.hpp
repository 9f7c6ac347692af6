#pragma once
/// \file kernels/adafactor.hpp
/// One Adafactor step over a flat buffer on the host: every tensor of a
/// tensor table (kernels/detail/adafactor.hpp) in nine passes, each a loop
/// over the rows, the columns, the statistics or the tensors of all of them
/// at once (one multi-tensor step), in three phases (adafactor_phase)
/// between which an optimizer whose tensors are split between ranks sums
/// each tensor's sums area over them (optim::adafactor_optimizer). The
/// CUDA overload (kernels/cuda/ops.hpp) takes the same arguments in the
/// same order, in device memory, and runs the same passes as kernels
/// (kernels/cuda/adafactor.cuh).
///
///   sums        0. the sums areas zeroed
///               1. rows: each matrix row's sum of g^2 + eps1 into its
///                  area, or each vector element's statistic; the row's
///                  sum of p^2 (scale_parameter)
///               2. columns: each matrix column's sum of g^2 + eps1
///               3. tensors: each tensor's sum of p^2
///   statistics  4. statistics: each matrix's row and column means (sums
///                  over full_cols and full_rows) into its statistics
///               5. tensors: the mean of each matrix's row statistics; its lr
///               6. rows: each row's sum of u^2, u the unclipped update
///               7. tensors: each tensor's sum of u^2
///   update      8. tensors: each tensor's clip divisor max(rms(u) / d, 1)
///               9. elements: the update, the first moment, the decay
///
/// Sums are in float64, each in a fixed order (a row's and a column's
/// element by element, a tensor's row by row), so any thread count gives
/// the same bits; the CUDA kernels sum in other fixed orders and agree to
/// float64 rounding of the sums, so to float rounding of the state.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/kernels/context.hpp"
#include "tessera/kernels/detail/adafactor.hpp"

namespace tessera::kernels {

namespace detail {

/// The tensor of `tensors` (sorted by row) that global row r belongs to.
inline int adafactor_tensor_of_row(const adafactor_tensor* tensors, int num_tensors,
                                   std::int64_t r) {
  int lo = 0, hi = num_tensors;  // first tensor whose first row is > r
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (tensors[mid].row <= r)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo - 1;
}

}  // namespace detail

/// One Adafactor step over a flat buffer, or one phase of it (file
/// comment for the passes).
/// - `params`, `master`, `grads`: as adamw_step's (element i's parameter
///   and gradient at its tensor's shifts; `master` null when Param == M).
/// - `tensors` (sizes.tensors entries, the context's memory): sorted by
///   begin, row and col; `buf`: the statistics, the first moment (null
///   unless step.first_moment), 3 scalars a tensor, one partial sum a row
///   and the sums areas (kernels/detail/adafactor.hpp).
/// - `grad_scale` (if not null, in the context's memory) multiplies
///   step.grad_scale; a non-finite value returns before anything is written.
/// - `phase`: `all`, or `sums`, `statistics`, `update` in that order with
///   the same arguments (the areas summed over ranks in between).
/// - Deterministic in any thread count; throws config_error as
///   detail::check_adafactor_step.
/// Source: Shazeer & Stern 2018, Algorithms 4 and 5; transformers'
/// Adafactor.step (kernels/detail/adafactor.hpp).
template <class Param, class Grad, class M>
void adafactor_step(const host_context& ctx, Param* params, M* master, const Grad* grads,
                    const adafactor_tensor* tensors, const adafactor_sizes& sizes,
                    adafactor_buffers<M> buf, detail::adafactor_step_params<M> step,
                    const M* grad_scale, adafactor_phase phase = adafactor_phase::all) {
  (void)ctx;
  constexpr bool has_master = !std::is_same_v<Param, M>;
  detail::check_adafactor_step<Param, M>("adafactor_step", master, buf, sizes, step.first_moment);
  if (grad_scale) {
    if (!std::isfinite(*grad_scale)) return;
    step.grad_scale *= *grad_scale;
  }
  const bool all = phase == adafactor_phase::all;
  const int nt = sizes.tensors;
  const auto grad = [&](const adafactor_tensor& t, std::int64_t i) {
    return to<M>(grads[i + t.grad_shift]) * step.grad_scale;
  };
  const auto param = [&](const adafactor_tensor& t, std::int64_t i) -> M {
    if constexpr (has_master)
      return master[i];
    else
      return params[i + t.param_shift];
  };
  // Step row g: its tensor and its place in it.
  struct row_of {
    const adafactor_tensor* t;
    detail::adafactor_row x;
  };
  const auto row = [&](std::int64_t g) {
    const adafactor_tensor& t = tensors[detail::adafactor_tensor_of_row(tensors, nt, g)];
    return row_of{&t, detail::adafactor_row_of(t, g - t.row)};
  };
  // The unclipped update of element i of row y.
  const auto unclipped = [&](const row_of& y, std::int64_t i, M row_mean) {
    const adafactor_tensor& t = *y.t;
    if (t.factored != 0)
      return detail::adafactor_factored_update(
          grad(t, i), buf.stats[t.stat + t.row_off + y.x.r], row_mean,
          buf.stats[t.stat + t.full_rows + t.col_off + (i - y.x.lead)]);
    return detail::adafactor_vector_update(grad(t, i), buf.stats[t.stat + (i - t.begin)]);
  };

  if (all || phase == adafactor_phase::sums) {
    // 0. The sums areas.
    std::fill(buf.sums, buf.sums + sizes.sums, 0.0);
    // 1. Rows: a matrix row's sum of g^2 + eps1, a vector's statistics; the sums of p^2.
#pragma omp parallel for schedule(static)
    for (std::int64_t g = 0; g < sizes.rows; ++g) {
      const row_of y = row(g);
      const adafactor_tensor& t = *y.t;
      double sq = 0, p2 = 0;
      if (!y.x.pad)
        for (std::int64_t i = y.x.first; i < y.x.last; ++i) {
          const M q = detail::adafactor_square(grad(t, i), step);
          if (t.factored != 0) {
            sq += static_cast<double>(q);
          } else {
            M& v = buf.stats[t.stat + (i - t.begin)];
            v = detail::adafactor_average(v, q, step);
          }
          if (step.scale_parameter) {
            const double p = static_cast<double>(param(t, i));
            p2 += p * p;
          }
        }
      if (t.factored != 0 && !y.x.pad) buf.sums[t.sum + t.row_off + y.x.r] = sq;
      buf.partial[g] = p2;
    }
    // 2. Columns of the matrices: each column summed row by row, a block of
    // columns a thread (contiguous loads along each row).
    constexpr std::int64_t col_block = 64;
    for (int k = 0; k < nt; ++k) {
      const adafactor_tensor& t = tensors[k];
      if (t.factored == 0) continue;
      const std::int64_t blocks = (t.cols + col_block - 1) / col_block;
#pragma omp parallel for schedule(static)
      for (std::int64_t cb = 0; cb < blocks; ++cb) {
        const std::int64_t c0 = cb * col_block, c1 = std::min(t.cols, c0 + col_block);
        double acc[col_block] = {};
        for (std::int64_t r = 0; r < t.nrows; ++r) {
          const detail::adafactor_row x = detail::adafactor_row_of(t, r);
          if (x.pad) continue;
          for (std::int64_t c = std::max(c0, x.first - x.lead); c < std::min(c1, x.last - x.lead);
               ++c)
            acc[c - c0] += static_cast<double>(detail::adafactor_square(grad(t, x.lead + c), step));
        }
        for (std::int64_t c = c0; c < c1; ++c)
          buf.sums[t.sum + t.full_rows + t.col_off + c] = acc[c - c0];
      }
    }
    // 3. Tensors: the sums of p^2.
#pragma omp parallel for schedule(static)
    for (int k = 0; k < nt; ++k) {
      const adafactor_tensor& t = tensors[k];
      double p2 = 0;
      for (std::int64_t r = 0; r < t.nrows; ++r) p2 += buf.partial[t.row + r];
      buf.sums[t.sum + adafactor_sum_slots(t) - 2] = p2;
    }
  }
  if (all || phase == adafactor_phase::statistics) {
    // 4. Statistics of the matrices: row means, then column means.
#pragma omp parallel for schedule(static)
    for (int k = 0; k < nt; ++k) {
      const adafactor_tensor& t = tensors[k];
      if (t.factored == 0) continue;
      const double R = static_cast<double>(t.full_rows), C = static_cast<double>(t.full_cols);
      for (std::int64_t j = 0; j < t.full_rows + t.full_cols; ++j) {
        M& v = buf.stats[t.stat + j];
        v = detail::adafactor_average(
            v, static_cast<M>(buf.sums[t.sum + j] / (j < t.full_rows ? C : R)), step);
      }
    }
    // 5. Tensors: the mean of the row statistics; the lr.
#pragma omp parallel for schedule(static)
    for (int k = 0; k < nt; ++k) {
      const adafactor_tensor& t = tensors[k];
      double rows = 0;
      if (t.factored != 0)
        for (std::int64_t r = 0; r < t.full_rows; ++r)
          rows += static_cast<double>(buf.stats[t.stat + r]);
      buf.scalars[3 * k] =
          t.factored != 0 ? static_cast<M>(rows / static_cast<double>(t.full_rows)) : M(0);
      buf.scalars[3 * k + 1] =
          detail::adafactor_tensor_lr(buf.sums[t.sum + adafactor_sum_slots(t) - 2], t.numel, step);
    }
    // 6. Rows: the sums of u^2.
#pragma omp parallel for schedule(static)
    for (std::int64_t g = 0; g < sizes.rows; ++g) {
      const row_of y = row(g);
      const M row_mean = buf.scalars[3 * (y.t - tensors)];
      double u2 = 0;
      if (!y.x.pad)
        for (std::int64_t i = y.x.first; i < y.x.last; ++i) {
          const double u = static_cast<double>(unclipped(y, i, row_mean));
          u2 += u * u;
        }
      buf.partial[g] = u2;
    }
    // 7. Tensors: the sums of u^2.
#pragma omp parallel for schedule(static)
    for (int k = 0; k < nt; ++k) {
      const adafactor_tensor& t = tensors[k];
      double u2 = 0;
      for (std::int64_t r = 0; r < t.nrows; ++r) u2 += buf.partial[t.row + r];
      buf.sums[t.sum + adafactor_sum_slots(t) - 1] = u2;
    }
  }
  if (all || phase == adafactor_phase::update) {
    // 8. Tensors: the clip divisor.
    for (int k = 0; k < nt; ++k) {
      const adafactor_tensor& t = tensors[k];
      buf.scalars[3 * k + 2] = detail::adafactor_clip_divisor(
          buf.sums[t.sum + adafactor_sum_slots(t) - 1], t.numel, step);
    }
    // 9. Elements: the update (padding rows left alone).
#pragma omp parallel for schedule(static)
    for (std::int64_t g = 0; g < sizes.rows; ++g) {
      const row_of y = row(g);
      if (y.x.pad) continue;
      const adafactor_tensor& t = *y.t;
      const std::int64_t k = y.t - tensors;
      const M row_mean = buf.scalars[3 * k], lr = buf.scalars[3 * k + 1],
              divisor = buf.scalars[3 * k + 2];
      M unused = M(0);
      for (std::int64_t i = y.x.first; i < y.x.last; ++i) {
        const M u = unclipped(y, i, row_mean);
        M& m = step.first_moment ? buf.exp_avg[i] : unused;
        if constexpr (has_master) {
          detail::adafactor_apply(master[i], m, u, divisor, lr, step, t.decay != 0);
          params[i + t.param_shift] = to<Param>(master[i]);
        } else {
          M p = params[i + t.param_shift];
          detail::adafactor_apply(p, m, u, divisor, lr, step, t.decay != 0);
          params[i + t.param_shift] = p;
        }
      }
    }
  }
}

/// Sums `ranks` blocks of n doubles, gathered[r stride, r stride + n) (an
/// all-gather of the ranks' sums areas, `stride` >= n apart), into out[0,
/// n) in rank order, so every rank gets the same bits. `out` must not
/// overlap `gathered`. Throws config_error for ranks < 1, n < 0 or stride < n.
inline void adafactor_sum_ranks(const host_context& ctx, double* out, const double* gathered,
                                int ranks, std::int64_t n, std::int64_t stride) {
  (void)ctx;
  TESSERA_THROW_IF(ranks < 1 || n < 0 || stride < n, config_error,
                   "adafactor_sum_ranks: ranks=", ranks, " must be >= 1, n=", n,
                   " >= 0 and stride=", stride, " >= n");
  for (std::int64_t j = 0; j < n; ++j) {
    double s = gathered[j];
    for (int r = 1; r < ranks; ++r) s += gathered[r * stride + j];
    out[j] = s;
  }
}

}  // namespace tessera::kernels
