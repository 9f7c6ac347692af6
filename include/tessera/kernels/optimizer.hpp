#pragma once
/// \file kernels/optimizer.hpp
/// The optimizer's kernels on the host: the global gradient sum of squares,
/// the clip coefficient, and one AdamW, SGD or Lion step over a flat buffer
/// (one multi-tensor pass). The CUDA overloads (kernels/cuda/ops.hpp) take the
/// same arguments in the same order, in device memory.
///
/// Every scalar a step needs between these kernels (the sum of squares, the
/// clip coefficient) lives in the context's memory and is passed by
/// pointer, so a step issues its kernels without reading anything back:
/// on a GPU, no host synchronisation (a non-finite coefficient makes the
/// optimizer kernel write nothing: the step is skipped on the device).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/kernels/context.hpp"
#include "tessera/kernels/detail/adamw.hpp"
#include "tessera/kernels/detail/clip.hpp"
#include "tessera/kernels/detail/lion.hpp"
#include "tessera/kernels/detail/sgd.hpp"

namespace tessera::kernels {

/// Sum of squares of g[0, n) in float64 into `*out` (or `*out += sum` when
/// `accumulate`, to cover several buffers in a fixed order).
/// - `g` of G in {float, double, bf16}; `out` one double (host memory here).
/// - Reduced over fixed blocks of 4096 elements whose partial sums are added
///   in block order: the same bits whatever the OpenMP thread count. (The
///   CUDA overload reduces in another fixed order: it agrees to float64
///   rounding, not bit for bit.)
/// - Throws config_error for n < 0.
template <class G>
void grad_sum_squares(const host_context& ctx, double* out, const G* g, std::int64_t n,
                      bool accumulate = false) {
  (void)ctx;
  TESSERA_THROW_IF(n < 0, config_error, "grad_sum_squares: n=", n, " must be >= 0");
  constexpr std::int64_t block = 4096;
  // Eight blocks at a time, one accumulator each, element by element: each
  // block is still summed in order (the same bits as one block at a time),
  // but eight independent chains hide the multiply-add latency that bound a
  // single chain to a quarter of the memory rate (measured 3.8x faster over
  // 0.2G floats on 2 threads, 5.2 -> 19.9 GB/s).
  constexpr std::int64_t group = 8;
  const std::int64_t nb = (n + block - 1) / block, full = n / block;
  std::vector<double> partial(static_cast<std::size_t>(nb), 0.0);
  double* const part = partial.data();
#pragma omp parallel for schedule(static)
  for (std::int64_t b0 = 0; b0 < nb; b0 += group) {
    if (b0 + group <= full) {
      double s[group] = {};
      const G* base = g + b0 * block;
      for (std::int64_t i = 0; i < block; ++i) {
        for (std::int64_t j = 0; j < group; ++j) {  // scalar: a vector of strided loads is slower
          const double x = to<double>(base[j * block + i]);
          s[j] += x * x;
        }
      }
      for (std::int64_t j = 0; j < group; ++j) part[b0 + j] = s[j];
      continue;
    }
    for (std::int64_t b = b0; b < std::min(nb, b0 + group); ++b) {
      double s = 0.0;
      const std::int64_t e = std::min(n, (b + 1) * block);
      for (std::int64_t i = b * block; i < e; ++i) {
        const double x = to<double>(g[i]);
        s += x * x;
      }
      part[b] = s;
    }
  }
  double total = 0.0;
  for (double p : partial) total += p;
  *out = accumulate ? *out + total : total;
}

/// `*coef` = unscaled_clip_coefficient_of(*sum_squares, max_norm,
/// inv_loss_scale) (kernels/detail/clip.hpp; clip_coefficient_of(sqrt(*sum_squares),
/// max_norm) when inv_loss_scale is 1), rounded to M (the optimizer's
/// master type), in the context's memory: what the optimizer kernels take
/// as `grad_scale`. NaN when the norm is not finite.
template <class M>
void clip_coefficient(const host_context& ctx, M* coef, const double* sum_squares, double max_norm,
                      double inv_loss_scale = 1.0) {
  (void)ctx;
  *coef = static_cast<M>(unscaled_clip_coefficient_of(*sum_squares, max_norm, inv_loss_scale));
}

namespace detail {
template <class Param, class Master>
void check_optimizer_step(const char* who, const Master* master, std::int64_t n, int num_segments) {
  constexpr bool has_master = !std::is_same_v<Param, Master>;
  TESSERA_THROW_IF(n < 0 || num_segments < 0, config_error, who, ": n=", n,
                   " and num_segments=", num_segments, " must be >= 0");
  TESSERA_THROW_IF(has_master && master == nullptr, config_error, who, ": ", dtype_name<Param>(),
                   " parameters need ", dtype_name<Master>(), " master weights (master is null)");
  TESSERA_THROW_IF(!has_master && master != nullptr, config_error, who, ": ", dtype_name<Param>(),
                   " parameters are updated in place; pass master = nullptr");
}
/// Calls f(i, p, g, decay) for every element i of every segment, p = i +
/// param_shift and g = i + grad_shift (the element's parameter and
/// gradient): the segments in order, each split over the OpenMP threads in
/// static chunks and vectorised (`omp simd`: f must be element-wise, as the
/// optimizer updates are), with `decay` a std::bool_constant, so that the
/// loop body has no branch. Each thread calls its own copy of f (its captures then
/// stay in registers instead of being reloaded through the shared closure
/// at every element). The vector and the scalar instructions round alike
/// (IEEE add, multiply, divide and square root are correctly rounded), so
/// the results do not depend on the vector width or the thread count.
/// tessera::host compiles with -fno-math-errno, without which sqrt keeps
/// the loop scalar (docs/performance.md).
template <class F>
void for_each_optimizer_element(const optimizer_segment* segments, int num_segments, const F& f) {
  for (int k = 0; k < num_segments; ++k) {
    const std::int64_t b = segments[k].begin, e = segments[k].end;
    const std::int64_t ps = segments[k].param_shift, gs = segments[k].grad_shift;
    auto run = [&](auto decay) {
#pragma omp parallel
      {
        const F body = f;
#pragma omp for simd schedule(static)
        for (std::int64_t i = b; i < e; ++i) body(i, i + ps, i + gs, decay);
      }
    };
    if (segments[k].decay != 0)
      run(std::true_type{});
    else
      run(std::false_type{});
  }
}

}  // namespace detail

/// One AdamW step over a flat buffer in one pass (multi-tensor): per element
/// of each segment, kernels::detail::adamw_update on the master weight (or
/// the parameter itself when Param == Master), then the parameter is
/// written back rounded, in the same pass.
/// - `master`, `m`, `v`: n elements from the optimizer's first element;
///   element i's parameter and gradient are params[i + param_shift] and
///   grads[i + grad_shift] of its segment. `master` is null when Param ==
///   Master, required otherwise.
/// - `segments` (num_segments, sorted, disjoint, within [0, n), in the
///   context's memory): only their elements are updated, with their decay flag.
/// - `step`: the step's hyper-parameters with the bias corrections. If
///   `grad_scale` is not null, the M it points to (clip_coefficient's
///   output) multiplies step.grad_scale; a non-finite value makes the call
///   return without writing anything (the step is skipped).
/// - Element-wise: any thread count gives the same bits; the CUDA overload
///   runs the same per-element arithmetic.
/// - Throws config_error for n or num_segments < 0 or a master pointer that
///   does not match Param.
/// Source: Loshchilov & Hutter, ICLR 2019, Algorithm 2 (torch.optim.AdamW form).
template <class Param, class Grad, class M>
void adamw_step(const host_context& ctx, Param* params, M* master, M* m, M* v, const Grad* grads,
                std::int64_t n, const optimizer_segment* segments, int num_segments,
                detail::adamw_step_params<M> step, const M* grad_scale) {
  (void)ctx;
  detail::check_optimizer_step<Param, M>("adamw_step", master, n, num_segments);
  if (grad_scale) {
    if (!std::isfinite(*grad_scale)) return;
    step.grad_scale *= *grad_scale;
  }
  detail::for_each_optimizer_element(
      segments, num_segments, [=](std::int64_t i, std::int64_t p, std::int64_t gi, auto decay) {
        const M g = to<M>(grads[gi]);
        if constexpr (!std::is_same_v<Param, M>) {
          detail::adamw_update(master[i], m[i], v[i], g, step, decay());
          params[p] = to<Param>(master[i]);
        } else {
          detail::adamw_update(params[p], m[i], v[i], g, step, decay());
        }
      });
}

/// One SGD-with-momentum step over a flat buffer in one pass, as
/// adamw_step with one state buffer `buf` (the momentum) instead of m and v:
/// kernels::detail::sgd_update per element. Same arguments, skip rule,
/// determinism and throws as adamw_step.
/// Source: torch.optim.SGD (dampening 0); Sutskever et al. 2013 (Nesterov).
template <class Param, class Grad, class M>
void sgd_step(const host_context& ctx, Param* params, M* master, M* buf, const Grad* grads,
              std::int64_t n, const optimizer_segment* segments, int num_segments,
              detail::sgd_step_params<M> step, const M* grad_scale) {
  (void)ctx;
  detail::check_optimizer_step<Param, M>("sgd_step", master, n, num_segments);
  if (grad_scale) {
    if (!std::isfinite(*grad_scale)) return;
    step.grad_scale *= *grad_scale;
  }
  detail::for_each_optimizer_element(
      segments, num_segments, [=](std::int64_t i, std::int64_t p, std::int64_t gi, auto decay) {
        const M g = to<M>(grads[gi]);
        if constexpr (!std::is_same_v<Param, M>) {
          detail::sgd_update(master[i], buf[i], g, step, decay());
          params[p] = to<Param>(master[i]);
        } else {
          detail::sgd_update(params[p], buf[i], g, step, decay());
        }
      });
}

/// One Lion step over a flat buffer in one pass, as adamw_step with one
/// state buffer `m` (the momentum, "exp_avg") instead of m and v:
/// kernels::detail::lion_update per element. Same arguments, skip rule,
/// determinism and throws as adamw_step.
/// Source: Chen et al. 2023, "Symbolic Discovery of Optimization
/// Algorithms", Algorithm 1.
template <class Param, class Grad, class M>
void lion_step(const host_context& ctx, Param* params, M* master, M* m, const Grad* grads,
               std::int64_t n, const optimizer_segment* segments, int num_segments,
               detail::lion_step_params<M> step, const M* grad_scale) {
  (void)ctx;
  detail::check_optimizer_step<Param, M>("lion_step", master, n, num_segments);
  if (grad_scale) {
    if (!std::isfinite(*grad_scale)) return;
    step.grad_scale *= *grad_scale;
  }
  detail::for_each_optimizer_element(
      segments, num_segments, [=](std::int64_t i, std::int64_t p, std::int64_t gi, auto decay) {
        const M g = to<M>(grads[gi]);
        if constexpr (!std::is_same_v<Param, M>) {
          detail::lion_update(master[i], m[i], g, step, decay());
          params[p] = to<Param>(master[i]);
        } else {
          detail::lion_update(params[p], m[i], g, step, decay());
        }
      });
}

}  // namespace tessera::kernels
