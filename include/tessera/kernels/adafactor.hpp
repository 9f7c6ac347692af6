#pragma once
/// \file kernels/adafactor.hpp
/// One Adafactor step over a flat buffer on the host: every tensor of a
/// tensor table (kernels/detail/adafactor.hpp) in six passes, each a loop
/// over the rows, the columns or the tensors of all of them at once (one
/// multi-tensor step). The CUDA overload (kernels/cuda/ops.hpp) takes the
/// same arguments in the same order, in device memory, and runs the same
/// passes as six kernels (kernels/cuda/adafactor.cuh).
///
///   1. rows       each row's mean of g^2 + eps1 into its row statistic (a
///                 matrix), or each element's statistic (a vector); with
///                 scale_parameter the row's sum of p^2
///   2. columns    each column's mean of g^2 + eps1 into its column statistic
///   3. tensors    the mean of each matrix's row statistics; each tensor's lr
///   4. rows       each row's sum of u^2, u the unclipped update
///   5. tensors    each tensor's clip divisor max(rms(u) / d, 1)
///   6. elements   the update, the first moment, the decay, the parameter
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

/// One Adafactor step over a flat buffer (file comment for the passes).
/// - `params`, `master`, `grads`: as adamw_step's (element i's parameter
///   and gradient at its tensor's shifts; `master` null when Param == M).
/// - `tensors` (sizes.tensors entries, the context's memory): sorted, each
///   a whole tensor; `buf`: its statistics, the first moment (null unless
///   step.first_moment), 3 scalars a tensor and one partial sum a row
///   (kernels/detail/adafactor.hpp).
/// - `grad_scale` (if not null, in the context's memory) multiplies
///   step.grad_scale; a non-finite value returns before anything is written.
/// - Deterministic in any thread count; throws config_error as
///   detail::check_adafactor_step.
/// Source: Shazeer & Stern 2018, Algorithms 4 and 5; transformers'
/// Adafactor.step (kernels/detail/adafactor.hpp).
template <class Param, class Grad, class M>
void adafactor_step(const host_context& ctx, Param* params, M* master, const Grad* grads,
                    const adafactor_tensor* tensors, const adafactor_sizes& sizes,
                    adafactor_buffers<M> buf, detail::adafactor_step_params<M> step,
                    const M* grad_scale) {
  (void)ctx;
  constexpr bool has_master = !std::is_same_v<Param, M>;
  detail::check_adafactor_step<Param, M>("adafactor_step", master, buf, sizes, step.first_moment);
  if (grad_scale) {
    if (!std::isfinite(*grad_scale)) return;
    step.grad_scale *= *grad_scale;
  }
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
  // Global row r: its tensor, and its elements [first, last).
  struct row_of {
    const adafactor_tensor* t;
    std::int64_t r, first, last;
  };
  const auto row = [&](std::int64_t g) {
    const adafactor_tensor& t = tensors[detail::adafactor_tensor_of_row(tensors, nt, g)];
    const std::int64_t r = g - t.row, first = t.begin + r * t.cols;
    return row_of{&t, r, first, std::min(t.end, first + t.cols)};
  };
  // The unclipped update of element i of row x.
  const auto unclipped = [&](const row_of& x, std::int64_t i, M row_mean) {
    const adafactor_tensor& t = *x.t;
    if (t.factored != 0)
      return detail::adafactor_factored_update(grad(t, i), buf.stats[t.stat + x.r], row_mean,
                                               buf.stats[t.stat + t.rows + (i - x.first)]);
    return detail::adafactor_vector_update(grad(t, i), buf.stats[t.stat + (i - t.begin)]);
  };

  // 1. Rows: the row statistics (matrices) or each element's (vectors); the sums of p^2.
#pragma omp parallel for schedule(static)
  for (std::int64_t g = 0; g < sizes.rows; ++g) {
    const row_of x = row(g);
    const adafactor_tensor& t = *x.t;
    double sq = 0, p2 = 0;
    for (std::int64_t i = x.first; i < x.last; ++i) {
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
    if (t.factored != 0) {
      M& v = buf.stats[t.stat + x.r];
      v = detail::adafactor_average(v, static_cast<M>(sq / static_cast<double>(t.cols)), step);
    }
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
      for (std::int64_t r = 0; r < t.rows; ++r)
        for (std::int64_t c = c0; c < c1; ++c)
          acc[c - c0] += static_cast<double>(
              detail::adafactor_square(grad(t, t.begin + r * t.cols + c), step));
      for (std::int64_t c = c0; c < c1; ++c) {
        M& v = buf.stats[t.stat + t.rows + c];
        v = detail::adafactor_average(v, static_cast<M>(acc[c - c0] / static_cast<double>(t.rows)),
                                      step);
      }
    }
  }
  // 3. Tensors: the mean of the row statistics; the lr.
#pragma omp parallel for schedule(static)
  for (int k = 0; k < nt; ++k) {
    const adafactor_tensor& t = tensors[k];
    double rows = 0, p2 = 0;
    if (t.factored != 0)
      for (std::int64_t r = 0; r < t.rows; ++r) rows += static_cast<double>(buf.stats[t.stat + r]);
    for (std::int64_t r = 0; r < t.rows; ++r) p2 += buf.partial[t.row + r];
    buf.scalars[3 * k] = static_cast<M>(rows / static_cast<double>(t.rows));
    buf.scalars[3 * k + 1] = detail::adafactor_tensor_lr(p2, t.end - t.begin, step);
  }
  // 4. Rows: the sums of u^2.
#pragma omp parallel for schedule(static)
  for (std::int64_t g = 0; g < sizes.rows; ++g) {
    const row_of x = row(g);
    const M row_mean = buf.scalars[3 * (x.t - tensors)];
    double u2 = 0;
    for (std::int64_t i = x.first; i < x.last; ++i) {
      const double u = static_cast<double>(unclipped(x, i, row_mean));
      u2 += u * u;
    }
    buf.partial[g] = u2;
  }
  // 5. Tensors: the clip divisor.
#pragma omp parallel for schedule(static)
  for (int k = 0; k < nt; ++k) {
    const adafactor_tensor& t = tensors[k];
    double u2 = 0;
    for (std::int64_t r = 0; r < t.rows; ++r) u2 += buf.partial[t.row + r];
    buf.scalars[3 * k + 2] = detail::adafactor_clip_divisor(u2, t.end - t.begin, step);
  }
  // 6. Elements: the update.
#pragma omp parallel for schedule(static)
  for (std::int64_t g = 0; g < sizes.rows; ++g) {
    const row_of x = row(g);
    const adafactor_tensor& t = *x.t;
    const std::int64_t k = x.t - tensors;
    const M row_mean = buf.scalars[3 * k], lr = buf.scalars[3 * k + 1],
            divisor = buf.scalars[3 * k + 2];
    M unused = M(0);
    for (std::int64_t i = x.first; i < x.last; ++i) {
      const M u = unclipped(x, i, row_mean);
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

}  // namespace tessera::kernels
