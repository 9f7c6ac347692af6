#pragma once
/// \file kernels/muon.hpp
/// Muon's kernels on the host (optim::muon runs them; the CUDA overloads,
/// kernels/cuda/ops.hpp, take the same arguments in device memory):
///
///   muon_momentum_step  one fused pass over every segment: the matrices'
///                       momentum, and the full AdamW step of the other
///                       tensors (embedding, LM head, norm gains);
///   per matrix:
///   muon_nesterov       what is orthogonalised, into this rank's shard;
///                       (under tensor parallelism the caller all-gathers
///                       the shards over the tp group here)
///   muon_assemble       the gathered shards into W (m x n, m <= n);
///   muon_newton_schulz  W / max(||W||_F, eps), then the quintic iteration,
///                       its products through kernels::gemm (the BLAS);
///   muon_apply          decoupled decay and the scaled update of the shard.
///
/// The host runs the iteration in the master type (float64 in the tests:
/// torch's own arithmetic in float64, where torch.optim.Muon itself casts
/// to bfloat16 for speed). Every kernel is element-wise or a BLAS call: a
/// fixed thread count gives the same bits.
/// Source: torch/optim/_muon.py (PyTorch 2.9+): _single_tensor_muon,
/// _zeropower_via_newtonschulz; K. Jordan et al. 2024.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "tessera/core/error.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/kernels/context.hpp"
#include "tessera/kernels/detail/muon.hpp"
#include "tessera/kernels/gemm.hpp"
#include "tessera/kernels/optimizer.hpp"

namespace tessera::kernels {

/// One fused multi-tensor pass of a Muon step over the optimizer's n
/// elements (`segments`: num_segments muon_segments, sorted, disjoint,
/// within [0, n)): per element, g = grad * scale; a matrix element's
/// momentum m[i] = lerp(m[i], g, 1 - momentum); any other element takes
/// the whole AdamW step (detail::adamw_update with m[i] and v[i +
/// v_shift], its parameter or master weight written). `master` is null
/// when Param == M, required otherwise. If `grad_scale` is not null, the M
/// it points to multiplies step.grad_scale; a non-finite value returns
/// before any write (the step is skipped). Throws config_error as
/// adamw_step. Source: torch/optim/_muon.py `buf.lerp_(grad, 1 -
/// momentum)`; torch.optim.AdamW.
template <class Param, class Grad, class M>
void muon_momentum_step(const host_context& ctx, Param* params, M* master, M* m, M* v,
                        const Grad* grads, std::int64_t n, const muon_segment* segments,
                        int num_segments, detail::muon_step_params<M> step, const M* grad_scale) {
  (void)ctx;
  detail::check_optimizer_step<Param, M>("muon_momentum_step", master, n, num_segments);
  if (grad_scale) {
    if (!std::isfinite(*grad_scale)) return;
    step.grad_scale *= *grad_scale;
    step.adamw.grad_scale = step.grad_scale;
  }
  for (int k = 0; k < num_segments; ++k) {
    const muon_segment s = segments[k];
    if (s.muon != 0) {
#pragma omp parallel for simd schedule(static)
      for (std::int64_t i = s.begin; i < s.end; ++i)
        detail::muon_momentum(m[i], to<M>(grads[i + s.grad_shift]) * step.grad_scale, step);
      continue;
    }
    const bool decay = s.decay != 0;
#pragma omp parallel for schedule(static)
    for (std::int64_t i = s.begin; i < s.end; ++i) {
      const M g = to<M>(grads[i + s.grad_shift]);
      if constexpr (!std::is_same_v<Param, M>) {
        detail::adamw_update(master[i], m[i], v[i + s.v_shift], g, step.adamw, decay);
        params[i + s.param_shift] = to<Param>(master[i]);
      } else {
        detail::adamw_update(params[i + s.param_shift], m[i], v[i + s.v_shift], g, step.adamw,
                             decay);
      }
    }
  }
}

/// What matrix `t` orthogonalises, the elements this optimizer owns of it:
/// out[j] = muon_nesterov(m[t.begin + j], grad * scale) for j < t.owned()
/// (element t.first + j of the shard). `out` holds t.owned() elements and
/// must not alias m. A non-finite *grad_scale writes nothing. Source:
/// torch/optim/_muon.py `update = grad.lerp(buf, momentum) if nesterov else buf`.
template <class Grad, class M>
void muon_nesterov(const host_context& ctx, M* out, const M* m, const Grad* grads,
                   const muon_matrix& t, detail::muon_step_params<M> step, const M* grad_scale) {
  (void)ctx;
  if (grad_scale) {
    if (!std::isfinite(*grad_scale)) return;
    step.grad_scale *= *grad_scale;
  }
  const std::int64_t n = t.owned();
  const M* mt = m + t.begin;
  const Grad* g = grads + t.begin + t.grad_shift;
#pragma omp parallel for simd schedule(static)
  for (std::int64_t j = 0; j < n; ++j)
    out[j] = detail::muon_nesterov(mt[j], to<M>(g[j]) * step.grad_scale, step);
}

/// W (t.wide_rows() x t.wide_cols(), row-major) from the shards gathered
/// in shard order (`gathered`, t.whole() elements; on one rank the shard
/// itself): the matrix, or its transpose when it has more rows than columns.
template <class M>
void muon_assemble(const host_context& ctx, M* wide, const M* gathered, const muon_matrix& t) {
  (void)ctx;
  const std::int64_t n = t.whole();
#pragma omp parallel for schedule(static)
  for (std::int64_t k = 0; k < n; ++k) wide[k] = gathered[detail::muon_wide_to_gathered(t, k)];
}

/// Scratch of muon_newton_schulz for a wide matrix of m x n, in elements
/// of M (muon_ns_scratch_elements, kernels/detail/muon.hpp).
template <class M>
std::int64_t muon_ns_scratch(std::int64_t m, std::int64_t n) {
  return muon_ns_scratch_elements(m, n, sizeof(M));
}

/// The quintic Newton-Schulz iteration proper on W (m x n row-major, m <=
/// n, in place, already normalised): `steps` times A = W W^T; B = b A +
/// c A A; W = a W + B W, each product one kernels::gemm (the BLAS) in M.
/// `scratch` holds muon_ns_scratch<M>(m, n) elements. Throws config_error
/// for m > n or a negative size. Source: torch/optim/_muon.py
/// _zeropower_via_newtonschulz's loop.
template <class M>
void muon_ns_iterate(const host_context& ctx, M* wide, std::int64_t m, std::int64_t n, M* scratch,
                     double a, double b, double c, int steps) {
  (void)ctx;
  TESSERA_THROW_IF(m < 0 || m > n, config_error, "muon_newton_schulz: ", m, " x ", n,
                   " must be a wide matrix (0 <= rows <= cols)");
  if (m == 0) return;
  M* other = scratch;
  M* gram = other + m * n;
  M* poly = gram + m * m;
  M* x = wide;
  M* y = other;
  using A = accum_t<M>;
  for (int s = 0; s < steps; ++s) {
    gemm(transpose::no, transpose::yes, m, m, n, A(1), x, n, x, n, A(0), gram, m);
    std::copy(gram, gram + m * m, poly);
    gemm(transpose::no, transpose::no, m, m, m, static_cast<A>(c), gram, m, gram, m,
         static_cast<A>(b), poly, m);
    std::copy(x, x + m * n, y);
    gemm(transpose::no, transpose::no, m, n, m, A(1), poly, m, x, n, static_cast<A>(a), y, n);
    std::swap(x, y);
  }
  if (x != wide) std::copy(x, x + m * n, wide);
}

/// The Newton-Schulz orthogonalisation of W (m x n row-major, m <= n, in
/// place): W /= max(||W||_F, eps), the squared norm summed in float64 by
/// grad_sum_squares and the divisor rounded to M, then muon_ns_iterate.
/// `scratch` holds muon_ns_scratch<M>(m, n) elements. Throws config_error
/// for m > n or a negative size. Source: torch/optim/_muon.py
/// _zeropower_via_newtonschulz (there in bfloat16; here in M).
template <class M>
void muon_newton_schulz(const host_context& ctx, M* wide, std::int64_t m, std::int64_t n,
                        M* scratch, double a, double b, double c, int steps, double eps) {
  TESSERA_THROW_IF(m < 0 || m > n, config_error, "muon_newton_schulz: ", m, " x ", n,
                   " must be a wide matrix (0 <= rows <= cols)");
  if (m == 0) return;
  double sum = 0;
  grad_sum_squares(ctx, &sum, wide, m * n);
  *muon_norm_slot(scratch + m * n + 2 * m * m) = sum;
  const M d = static_cast<M>(std::max(std::sqrt(sum), eps));
#pragma omp parallel for simd schedule(static)
  for (std::int64_t k = 0; k < m * n; ++k) wide[k] = wide[k] / d;
  muon_ns_iterate(ctx, wide, m, n, scratch, a, b, c, steps);
}

/// The update of the elements this optimizer owns of matrix `t` (t.owned(),
/// from element t.first of the shard) by the orthogonalised W (`wide`, as
/// muon_assemble lays it out): p = p (1 - lr wd) - adjusted_lr
/// o, on the master weight (then rounded into the parameter) or the
/// parameter itself; decay only with t.decay. A non-finite *grad_scale
/// writes nothing.
template <class Param, class M>
void muon_apply(const host_context& ctx, Param* params, M* master, const M* wide,
                const muon_matrix& t, M decay_factor, M adjusted_lr, const M* grad_scale) {
  (void)ctx;
  if (grad_scale && !std::isfinite(*grad_scale)) return;
  const M f = t.decay != 0 ? decay_factor : M(1);
  const std::int64_t n = t.owned();
#pragma omp parallel for schedule(static)
  for (std::int64_t j = 0; j < n; ++j) {
    const std::int64_t i = t.begin + j;
    const M o = wide[detail::muon_local_to_wide(t, t.first + j)];
    if constexpr (!std::is_same_v<Param, M>) {
      detail::muon_apply(master[i], o, f, adjusted_lr);
      params[i + t.param_shift] = to<Param>(master[i]);
    } else {
      detail::muon_apply(params[i + t.param_shift], o, f, adjusted_lr);
    }
  }
}

}  // namespace tessera::kernels
