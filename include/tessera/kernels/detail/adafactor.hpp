#pragma once
/// \file kernels/detail/adafactor.hpp
/// Adafactor's tensor table and its per-element arithmetic, shared by the
/// host passes (kernels/adafactor.hpp) and the CUDA bodies
/// (kernels/cuda/adafactor.cuh).
///
/// Source: Shazeer & Stern 2018, "Adafactor: Adaptive Learning Rates with
/// Sublinear Memory Cost", Algorithms 4 (matrices: factored second moment)
/// and 5 (vectors), with update clipping (section 6) and the optional first
/// moment (section 7), in the arithmetic of transformers'
/// `transformers.optimization.Adafactor.step` (v5.25, optimization.py lines
/// 1257-1289): v = beta2t v + (1 - beta2t) mean(g^2 + eps1) per row and per
/// column, u = rsqrt(row / mean(row)) rsqrt(col) g (a vector: rsqrt(v) g),
/// u /= max(rms(u) / d, 1), u *= lr, m = beta1 m + (1 - beta1) u (when
/// kept), p -= lr wd p, p -= (m or u).

#include <math.h>

#include <cstdint>
#include <type_traits>

#include "tessera/core/config.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/numeric.hpp"

namespace tessera::kernels {

/// One tensor of an Adafactor step, or this rank's part of one (the tensor
/// table its kernels take; host and device memory have the same layout,
/// 144 bytes an entry).
/// - `begin`, `end`: the elements it updates in the optimizer's state; their
///   parameters at params[i + param_shift], gradients at grads[i + grad_shift].
/// - `factored` (a matrix): the local matrix (the whole tensor, or this
///   rank's tensor-parallel shard of it) is `rows` x `cols`, row-major, and
///   [begin, end) are its elements from `first` on (all of them, or a ZeRO
///   chunk's piece). The shard is rows [row_off, row_off + rows) and
///   columns [col_off, col_off + cols) of the whole `full_rows` x
///   `full_cols` matrix; local rows at or past full_rows are vocabulary
///   padding (left out of every sum and never updated). Its statistics are
///   the whole matrix's: full_rows row then full_cols column means from
///   stats[stat]. Its step rows are the `nrows` local rows from first / cols.
/// - Otherwise (a vector, or a piece of one): one statistic an element from
///   stats[stat]; the kernels reduce it in `nrows` = `rows` rows of `cols`
///   elements (adafactor_vector_row; the last may be shorter).
/// - `numel`: the whole tensor's elements (the RMS denominators).
/// - `sum`: its area of the per-tensor sums (adafactor_sum_slots doubles):
///   a matrix's row sums and column sums of g^2 + eps1 (whole-matrix
///   coordinates, this rank's part; zero elsewhere), then the sums of p^2
///   and of u^2 over its elements here. Summed over the ranks holding the
///   other parts, they are the whole tensor's (optim::adafactor_optimizer).
/// - `row`: its first row in the step's row numbering (the per-row partial
///   sums); `col`: a factored tensor's first column in the column numbering.
struct adafactor_tensor {
  std::int64_t begin = 0, end = 0;
  std::int64_t rows = 0, cols = 0, first = 0;
  std::int64_t full_rows = 0, full_cols = 0, row_off = 0, col_off = 0;
  std::int64_t numel = 0;
  std::int64_t stat = 0, sum = 0;
  std::int64_t row = 0, nrows = 0, col = 0;  ///< a vector's `col`: the next matrix's (it has none)
  std::int64_t param_shift = 0, grad_shift = 0;
  std::int32_t factored = 0;
  std::int32_t decay = 0;
};
static_assert(sizeof(adafactor_tensor) == 144);

/// The width of the rows a vector is reduced in (its sums of squares).
inline constexpr std::int64_t adafactor_vector_row = 4096;

/// The doubles of a tensor's sums area (adafactor_tensor::sum): a matrix's
/// full_rows + full_cols + 2, a vector's 2. The last two are the sums of
/// p^2 and of u^2.
template <class T>
TESSERA_HOST_DEVICE inline std::int64_t adafactor_sum_slots(const T& t) {
  return t.factored != 0 ? t.full_rows + t.full_cols + 2 : 2;
}

/// The parts of an Adafactor step (adafactor_step's `phase`): `all` of it
/// on one rank, or, where a tensor's parts are on several ranks, `sums`
/// (the local sums of g^2 + eps1 and p^2 into each area), `statistics`
/// (after the areas' first full_rows + full_cols + 1 doubles are summed
/// over the ranks: the statistics, each tensor's row mean and lr, its local
/// sum of u^2), `update` (after the u^2 slots are summed: the clip divisor
/// and the update).
enum class adafactor_phase { all, sums, statistics, update };

/// The state buffers of an Adafactor step, in the context's memory.
template <class M>
struct adafactor_buffers {
  M* stats = nullptr;         ///< second-moment statistics (adafactor_tensor::stat)
  M* exp_avg = nullptr;       ///< first moment, one an element; null when not kept
  M* scalars = nullptr;       ///< 3 a tensor: mean of its row statistics, its lr, its clip divisor
  double* partial = nullptr;  ///< one a step row: the row's sum of p^2, then of u^2
  double* sums = nullptr;     ///< the tensors' sums areas (adafactor_tensor::sum)
};

/// The sizes of a tensor table, known on the host: `tensors` entries,
/// `rows` rows and `cols` columns (of the matrices) in their numberings,
/// `n` the optimizer's elements, `stats` statistics and `sums` doubles of
/// sums areas in all.
struct adafactor_sizes {
  int tensors = 0;
  std::int64_t rows = 0, cols = 0, n = 0, stats = 0, sums = 0;
};

}  // namespace tessera::kernels

namespace tessera::kernels::detail {

/// The argument checks of both backends' adafactor_step (`who` names it):
/// sizes >= 0, master weights exactly when Param is not M, the first
/// moment's buffer when it is kept, the statistics and scratch when there
/// is a tensor. Throws config_error.
template <class Param, class M>
void check_adafactor_step(const char* who, const M* master, const adafactor_buffers<M>& b,
                          const adafactor_sizes& z, bool first_moment) {
  constexpr bool has_master = !std::is_same_v<Param, M>;
  TESSERA_THROW_IF(
      z.tensors < 0 || z.rows < 0 || z.cols < 0 || z.n < 0 || z.stats < 0 || z.sums < 0,
      config_error, who, ": tensors=", z.tensors, ", rows=", z.rows, ", cols=", z.cols, ", n=", z.n,
      ", stats=", z.stats, " and sums=", z.sums, " must be >= 0");
  TESSERA_THROW_IF(has_master && master == nullptr, config_error, who, ": ", dtype_name<Param>(),
                   " parameters need ", dtype_name<M>(), " master weights (master is null)");
  TESSERA_THROW_IF(!has_master && master != nullptr, config_error, who, ": ", dtype_name<Param>(),
                   " parameters are updated in place; pass master = nullptr");
  TESSERA_THROW_IF(first_moment && b.exp_avg == nullptr, config_error, who,
                   ": the first moment (beta1 > 0) needs its buffer (exp_avg is null)");
  TESSERA_THROW_IF(
      z.tensors > 0 &&
          (b.stats == nullptr || b.scalars == nullptr || b.partial == nullptr || b.sums == nullptr),
      config_error, who, ": the statistics, scalars, partial sums and sums areas are required");
}

/// Step row k of tensor t (k in [0, t.nrows)): its local row `r`, its
/// elements [first, last) in the optimizer's state, `lead` the state index
/// local column 0 of the row would have (element i is column i - lead), and
/// whether the row is vocabulary padding (`pad`: a matrix's local row at or
/// past full_rows).
struct adafactor_row {
  std::int64_t r, first, last, lead;
  bool pad;
};
template <class T>
TESSERA_HOST_DEVICE inline adafactor_row adafactor_row_of(const T& t, std::int64_t k) {
  adafactor_row x;
  if (t.factored != 0) {
    x.r = t.first / t.cols + k;
    x.lead = t.begin - t.first + x.r * t.cols;
    x.pad = t.row_off + x.r >= t.full_rows;
  } else {
    x.r = k;
    x.lead = t.begin + k * t.cols;
    x.pad = false;
  }
  x.first = x.lead > t.begin ? x.lead : t.begin;
  x.last = x.lead + t.cols < t.end ? x.lead + t.cols : t.end;
  return x;
}

/// Hyper-parameters of one Adafactor step.
template <class A>
struct adafactor_step_params {
  A lr;                  ///< the step's learning rate before the parameter scale
  A beta2t;              ///< 1 - t^decay_rate (0 at step 1)
  A eps1;                ///< added to g^2 (1e-30)
  A eps2;                ///< floor of the parameter scale (1e-3)
  A clip_threshold;      ///< d: the update's RMS is clipped to it
  A beta1;               ///< the first moment's decay (used when `first_moment`)
  A weight_decay;        ///< decoupled: p -= lr wd p (transformers' form)
  A grad_scale;          ///< gradient multiplier (clip coefficient)
  bool first_moment;     ///< keep the first moment m (beta1 > 0)
  bool scale_parameter;  ///< lr *= max(eps2, rms(p)) per tensor
};

/// 1 / sqrt(x), correctly rounded square root and division on host and
/// device (transformers' rsqrt in float32).
TESSERA_HOST_DEVICE inline float adafactor_rsqrt(float x) {
  return 1.0f / sqrtf(x);
}
TESSERA_HOST_DEVICE inline double adafactor_rsqrt(double x) {
  return 1.0 / sqrt(x);
}
TESSERA_HOST_DEVICE inline float adafactor_sqrt(float x) {
  return sqrtf(x);
}
TESSERA_HOST_DEVICE inline double adafactor_sqrt(double x) {
  return sqrt(x);
}

/// g^2 + eps1 of one (scaled) gradient: what the statistics average.
template <class A>
TESSERA_HOST_DEVICE inline A adafactor_square(A g, const adafactor_step_params<A>& s) {
  return g * g + s.eps1;
}

/// One statistic's exponential average: beta2t v + (1 - beta2t) mean.
template <class A>
TESSERA_HOST_DEVICE inline A adafactor_average(A v, A mean, const adafactor_step_params<A>& s) {
  return s.beta2t * v + (A(1) - s.beta2t) * mean;
}

/// The unclipped update of one element of a factored matrix:
/// rsqrt(row / row_mean) rsqrt(col) g (transformers' _approx_sq_grad times g).
template <class A>
TESSERA_HOST_DEVICE inline A adafactor_factored_update(A g, A row, A row_mean, A col) {
  return (adafactor_rsqrt(row / row_mean) * adafactor_rsqrt(col)) * g;
}

/// The unclipped update of one element of a vector: rsqrt(v) g.
template <class A>
TESSERA_HOST_DEVICE inline A adafactor_vector_update(A g, A v) {
  return adafactor_rsqrt(v) * g;
}

/// The clip divisor of a tensor of n elements whose updates' squares sum
/// to `sum_u2`: max(rms(u) / d, 1).
template <class A>
TESSERA_HOST_DEVICE inline A adafactor_clip_divisor(double sum_u2, std::int64_t n,
                                                    const adafactor_step_params<A>& s) {
  const A rms = static_cast<A>(adafactor_sqrt(sum_u2 / static_cast<double>(n)));
  const A r = rms / s.clip_threshold;
  return r > A(1) ? r : A(1);
}

/// The learning rate of a tensor whose parameters' squares sum to
/// `sum_p2` over n elements: lr, times max(eps2, rms(p)) with scale_parameter.
template <class A>
TESSERA_HOST_DEVICE inline A adafactor_tensor_lr(double sum_p2, std::int64_t n,
                                                 const adafactor_step_params<A>& s) {
  if (!s.scale_parameter) return s.lr;
  const A rms = static_cast<A>(adafactor_sqrt(sum_p2 / static_cast<double>(n)));
  return (rms > s.eps2 ? rms : s.eps2) * s.lr;
}

/// Applies one element's unclipped update u with its tensor's clip divisor
/// and lr: u = u / divisor * lr; with the first moment m = beta1 m +
/// (1 - beta1) u, u = m; weight decay (where `decay`) p -= lr wd p; p -= u.
/// Updates p and m in place (m untouched without the first moment).
template <class A>
TESSERA_HOST_DEVICE inline void adafactor_apply(A& p, A& m, A u, A divisor, A lr,
                                                const adafactor_step_params<A>& s, bool decay) {
  u = u / divisor;
  u = u * lr;
  if (s.first_moment) {
    m = s.beta1 * m + (A(1) - s.beta1) * u;
    u = m;
  }
  if (decay) p = p + (-(s.weight_decay * lr)) * p;
  p = p - u;
}

}  // namespace tessera::kernels::detail
