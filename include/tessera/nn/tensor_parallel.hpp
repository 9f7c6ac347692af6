#pragma once
/// \file nn/tensor_parallel.hpp
/// Megatron-style tensor parallelism (Shoeybi et al. 2019, "Megatron-LM",
/// section 3): the collectives that change a tensor's placement
/// (core/placement.hpp), the column- and row-parallel linear layers, and
/// the placement-checked forms of the norm and the residual add.
///
/// A column-parallel layer splits W (out, in) by output features: rank r
/// of the tp group holds rows [r out/tp, (r+1) out/tp) of W and computes
/// that slice of y = x W^T from the whole (replicated) x, with no
/// communication; its input gradient dx = dy_r W_r is a partial sum over
/// the group. A row-parallel layer splits W by input features: rank r holds
/// columns [r in/tp, (r+1) in/tp) and multiplies its slice of x (the
/// column-parallel layer's output) into a partial sum of y; its input
/// gradient needs no communication. One all_reduce after each row-parallel
/// forward and one after each column-parallel backward (the f and g
/// operators of Megatron-LM's figure 3) make a block compute what one rank
/// computes.
///
/// The layers hold only their shard: `out_features`/`in_features` are this
/// rank's extents, `offset` the shard's first element in its module's
/// segment (nn/segment_hooks.hpp), as nn::linear. With tp = 1 they are the
/// dense layer. Gradient contract (llm.c): weight gradients accumulate
/// (+=), input gradients are written (=) or added with `accumulate`.
///
/// The collectives run on any communicator (comm/communicator.hpp) whose
/// buffer space holds the views; on a one-rank group they move nothing.

#include <cstdint>
#include <string>
#include <type_traits>

#include "tessera/comm/communicator.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/placement.hpp"
#include "tessera/kernels/elementwise.hpp"
#include "tessera/kernels/gemm.hpp"
#include "tessera/kernels/rmsnorm.hpp"

namespace tessera::nn {

// ---- shards ------------------------------------------------------------------------------

/// The slice [begin, begin + count) rank `rank` of `tp` holds of `n` items
/// split evenly (`what` names them in the error). Throws config_error
/// naming n, tp and the item when tp does not divide n, or tp < 1, or rank
/// is outside [0, tp).
struct shard_range {
  std::int64_t begin = 0, count = 0;
};
inline shard_range even_shard(std::int64_t n, int tp, int rank, const char* what) {
  TESSERA_THROW_IF(tp < 1, config_error, "tensor parallelism: tp=", tp, " must be >= 1");
  TESSERA_THROW_IF(rank < 0 || rank >= tp, config_error, "tensor parallelism: rank ", rank,
                   " is not in [0, ", tp, ")");
  TESSERA_THROW_IF(n % tp != 0, config_error, "tensor parallelism: ", what, "=", n,
                   " is not divisible by tp=", tp);
  const std::int64_t c = n / tp;
  return {c * rank, c};
}

// ---- the collectives that change placement ------------------------------------------------

/// Sums a partial-sum tensor over `tp` in place: the view, now complete
/// and the same on every rank. Traffic: comm::ring_all_reduce_bytes of
/// numel elements. Throws what the communicator throws (timeouts name the
/// rank and the operation).
template <class Comm, class T>
replicated<T> all_reduce(Comm& tp, partial_sum<T> p) {
  static_assert(!std::is_const_v<T>, "all_reduce sums in place: the view must be writable");
  if (tp.size() > 1) tp.all_reduce(p.data, static_cast<std::size_t>(p.numel()), comm::reduce_op::sum);
  return {p.data, p.rows, p.cols};
}

/// Sums a partial-sum (rows, cols) tensor over `tp` and leaves this rank's
/// rows [r rows/tp, (r+1) rows/tp) in `out` (rows/tp, cols): the
/// sequence-parallel form of all_reduce. Throws config_error when tp does
/// not divide rows. Traffic: (tp-1) rows/tp cols elements.
template <class Comm, class T>
token_sharded<T> reduce_scatter(Comm& tp, partial_sum<const T> p, T* out) {
  const shard_range s = even_shard(p.rows, tp.size(), tp.rank(), "rows (tokens)");
  const auto chunk = static_cast<std::size_t>(s.count * p.cols);
  tp.reduce_scatter(p.data, out, chunk, comm::reduce_op::sum);
  return {out, s.count, p.cols};
}

/// Gathers every rank's rows of a token-sharded tensor into `out`
/// (tp rows, cols), in rank order: the complete tensor. Traffic: (tp-1)
/// rows cols elements.
template <class Comm, class T>
replicated<T> all_gather(Comm& tp, token_sharded<const T> s, T* out) {
  tp.all_gather(s.data, out, static_cast<std::size_t>(s.numel()));
  return {out, s.rows * tp.size(), s.cols};
}

// ---- the layers ----------------------------------------------------------------------------

/// W (out, in) split by output features; this rank holds `out_features`
/// (= out/tp) rows of it. Trivially copyable; holds no memory.
struct column_parallel_linear {
  std::int64_t out_features = 0;  ///< this rank's output features (N of the GEMMs)
  std::int64_t in_features = 0;   ///< K of the GEMMs, whole
  std::int64_t offset = 0;        ///< the shard's first element in its segment

  /// y_r(M, out_features) = x(M, in) W_r^T; y is written. x must be
  /// complete on every rank (replicated); a partial-sum x does not compile.
  /// FLOPs: kernels::gemm_flops(M, out_features, in_features).
  template <class Ctx, class T>
  feature_sharded<T> forward(const Ctx& ctx, T* y, std::type_identity_t<replicated<const T>> x,
                             const T* seg) const {
    kernels::linear_forward(ctx, y, x.data, seg + offset, x.rows, out_features, in_features);
    return {y, x.rows, out_features};
  }
  /// dx(M, in) = dy_r W_r, written (or added with `accumulate`): this
  /// rank's part of the input gradient, a partial sum over the group.
  template <class Ctx, class T, class GA>
  partial_sum<GA> backward_input(const Ctx& ctx, GA* dx,
                                 std::type_identity_t<feature_sharded<const GA>> dy,
                                 const T* seg, bool accumulate = false) const {
    kernels::linear_backward_input(ctx, dx, dy.data, seg + offset, dy.rows, out_features,
                                   in_features, accumulate);
    return {dx, dy.rows, in_features};
  }
  /// dW_r(out_features, in) += dy_r^T x; `seg_grads` the segment's first
  /// gradient element (same offsets as its parameters).
  template <class Ctx, class GA, class T, class G>
  void backward_weight(const Ctx& ctx, G* seg_grads, feature_sharded<GA> dy,
                       replicated<T> x) const {
    kernels::linear_backward_weight(ctx, seg_grads + offset, dy.data, x.data, x.rows,
                                    out_features, in_features);
  }
  /// Weight elements of the shard.
  [[nodiscard]] std::int64_t numel() const { return out_features * in_features; }
};

/// W (out, in) split by input features; this rank holds the (out,
/// in_features = in/tp) block of columns. Trivially copyable.
struct row_parallel_linear {
  std::int64_t out_features = 0;  ///< N of the GEMMs, whole
  std::int64_t in_features = 0;   ///< this rank's input features (K of the GEMMs)
  std::int64_t offset = 0;        ///< the shard's first element in its segment

  /// y(M, out) = x_r(M, in_features) W_r^T, this rank's partial sum of
  /// x W^T; all_reduce it before use. FLOPs: gemm_flops(M, out, in_features).
  template <class Ctx, class T>
  partial_sum<T> forward(const Ctx& ctx, T* y, std::type_identity_t<feature_sharded<const T>> x,
                         const T* seg) const {
    kernels::linear_forward(ctx, y, x.data, seg + offset, x.rows, out_features, in_features);
    return {y, x.rows, out_features};
  }
  /// dx_r(M, in_features) = dy W_r, written (or added with `accumulate`):
  /// this rank's slice of the input gradient, no communication. dy must be
  /// complete (the all-reduced output's gradient is replicated).
  template <class Ctx, class T, class GA>
  feature_sharded<GA> backward_input(const Ctx& ctx, GA* dx,
                                     std::type_identity_t<replicated<const GA>> dy, const T* seg,
                                     bool accumulate = false) const {
    kernels::linear_backward_input(ctx, dx, dy.data, seg + offset, dy.rows, out_features,
                                   in_features, accumulate);
    return {dx, dy.rows, in_features};
  }
  /// dW_r(out, in_features) += dy^T x_r.
  template <class Ctx, class GA, class T, class G>
  void backward_weight(const Ctx& ctx, G* seg_grads, replicated<GA> dy,
                       feature_sharded<T> x) const {
    kernels::linear_backward_weight(ctx, seg_grads + offset, dy.data, x.data, x.rows,
                                    out_features, in_features);
  }
  [[nodiscard]] std::int64_t numel() const { return out_features * in_features; }
};

/// The layer family of a tensor-parallel model (nn/linear.hpp's seam).
struct tensor_parallel_layers {
  using column = column_parallel_linear;  ///< q, k, v, gate, up
  using row = row_parallel_linear;        ///< attention output, down
};

// ---- placement-checked element-wise operations --------------------------------------------

namespace placed {

/// out = a + b over a (rows, cols) tensor; a and b complete (replicated, or
/// both token-sharded under sequence parallelism). A partial-sum operand
/// does not compile ("missing all_reduce"). Throws config_error when the
/// shapes differ.
template <class Ctx, class T>
replicated<T> residual_add(const Ctx& ctx, replicated<T> out,
                           std::type_identity_t<replicated<const T>> a,
                           std::type_identity_t<replicated<const T>> b) {
  TESSERA_THROW_IF(a.rows != out.rows || a.cols != out.cols || b.rows != out.rows ||
                       b.cols != out.cols,
                   config_error, "residual_add: shapes (", a.rows, ", ", a.cols, ") + (", b.rows,
                   ", ", b.cols, ") -> (", out.rows, ", ", out.cols, ") differ");
  kernels::residual_add(ctx, out.data, a.data, b.data, out.numel());
  return out;
}

/// RMSNorm of every row of a complete x (rows N, cols H) with gains w (H):
/// out (N, H) and rstd (N), as kernels::rmsnorm_forward. A partial-sum x
/// does not compile ("missing all_reduce").
template <class Ctx, class T, class A>
replicated<T> rmsnorm_forward(const Ctx& ctx, replicated<T> out, A* rstd,
                              std::type_identity_t<replicated<const T>> x, const T* w, double eps) {
  TESSERA_THROW_IF(x.rows != out.rows || x.cols != out.cols, config_error,
                   "rmsnorm_forward: input (", x.rows, ", ", x.cols, ") and output (", out.rows,
                   ", ", out.cols, ") differ");
  kernels::rmsnorm_forward(ctx, out.data, rstd, x.data, w, x.rows, x.cols, eps);
  return out;
}

}  // namespace placed

}  // namespace tessera::nn
