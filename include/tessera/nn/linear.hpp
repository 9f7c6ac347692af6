#pragma once
/// \file nn/linear.hpp
/// The `linear` seam (DESIGN.md, "Modules"): every GEMM of a transformer
/// block goes through a layer of its `Layers` family, so tensor
/// parallelism replaces dense layers by column- and row-parallel ones
/// without touching the block. Each layer is a bias-free y = x W^T with W
/// (out_features, in_features), as PyTorch's nn.Linear, stored at `offset`
/// elements from its module's first parameter (nn/segment_hooks.hpp): the
/// module passes its segment's parameter and gradient pointers, so the
/// layer works whether the segment lives in the flat buffer or in a ZeRO-3
/// gathered copy.
///
/// The layers take and return placed views (core/placement.hpp), so a
/// block written against them says where every reduction goes: a
/// column-parallel layer (W split by output features over the tp group:
/// q, k, v, gate, up) maps a replicated input to a feature-sharded output
/// and its input gradient is a partial sum; a row-parallel layer (W split
/// by input features: the attention output and down projections) maps a
/// feature-sharded input to a partial-sum output. On one rank the shards
/// are the whole weights and the reductions move nothing: `dense_layers`.
/// The tp family and the collectives are in nn/tensor_parallel.hpp
/// (Shoeybi et al. 2019, "Megatron-LM", section 3 and figure 3).
///
/// Gradient contract (llm.c): backward_weight accumulates (+=) into the
/// weight gradient; backward_input writes (=) the input gradient, or adds
/// (+=) with `accumulate` (q, k and v share their input, as gate and up do).

#include <cstdint>
#include <type_traits>

#include "tessera/core/error.hpp"
#include "tessera/core/placement.hpp"
#include "tessera/kernels/elementwise.hpp"
#include "tessera/kernels/gemm.hpp"
#include "tessera/kernels/rmsnorm.hpp"

namespace tessera::nn {

// The kernels are called unqualified: argument-dependent lookup on the
// context picks the host or the CUDA overload (kernels/context.hpp).

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
    linear_forward(ctx, y, x.data, seg + offset, x.rows, out_features, in_features);
    return {y, x.rows, out_features};
  }
  /// dx(M, in) = dy_r W_r, written (or added with `accumulate`): this
  /// rank's part of the input gradient, a partial sum over the group.
  template <class Ctx, class T, class GA>
  partial_sum<GA> backward_input(const Ctx& ctx, GA* dx,
                                 std::type_identity_t<feature_sharded<const GA>> dy,
                                 const T* seg, bool accumulate = false) const {
    linear_backward_input(ctx, dx, dy.data, seg + offset, dy.rows, out_features,
                                   in_features, accumulate);
    return {dx, dy.rows, in_features};
  }
  /// dW_r(out_features, in) += dy_r^T x; `seg_grads` the segment's first
  /// gradient element (same offsets as its parameters).
  template <class Ctx, class GA, class T, class G>
  void backward_weight(const Ctx& ctx, G* seg_grads, feature_sharded<GA> dy,
                       replicated<T> x) const {
    linear_backward_weight(ctx, seg_grads + offset, dy.data, x.data, x.rows,
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
    linear_forward(ctx, y, x.data, seg + offset, x.rows, out_features, in_features);
    return {y, x.rows, out_features};
  }
  /// dx_r(M, in_features) = dy W_r, written (or added with `accumulate`):
  /// this rank's slice of the input gradient, no communication. dy must be
  /// complete (the all-reduced output's gradient is replicated).
  template <class Ctx, class T, class GA>
  feature_sharded<GA> backward_input(const Ctx& ctx, GA* dx,
                                     std::type_identity_t<replicated<const GA>> dy, const T* seg,
                                     bool accumulate = false) const {
    linear_backward_input(ctx, dx, dy.data, seg + offset, dy.rows, out_features,
                                   in_features, accumulate);
    return {dx, dy.rows, in_features};
  }
  /// dW_r(out, in_features) += dy^T x_r.
  template <class Ctx, class GA, class T, class G>
  void backward_weight(const Ctx& ctx, G* seg_grads, replicated<GA> dy,
                       feature_sharded<T> x) const {
    linear_backward_weight(ctx, seg_grads + offset, dy.data, x.data, x.rows,
                                    out_features, in_features);
  }
  [[nodiscard]] std::int64_t numel() const { return out_features * in_features; }
};

/// The layer family of a model on one rank: every weight whole, and the
/// partial sums of a one-rank group already complete.
struct dense_layers {
  using column = column_parallel_linear;  ///< q, k, v, gate, up
  using row = row_parallel_linear;        ///< attention output, down
  /// Whether the family splits the model over a tp group.
  static constexpr bool tensor_parallel = false;
  /// On one rank a partial sum is the sum.
  template <class T>
  replicated<T> all_reduce(partial_sum<T> p) const {
    return {p.data, p.rows, p.cols};
  }
  /// On one rank a reduction of values leaves them as they are.
  template <class T>
  void all_reduce_values(T*, std::size_t, bool /*max*/) const {}
  [[nodiscard]] int size() const { return 1; }
  [[nodiscard]] int rank() const { return 0; }
};

// ---- placement-checked element-wise operations --------------------------------------------

namespace placed {

/// out = a + b over a (rows, cols) tensor; a and b complete (replicated).
/// A partial-sum operand does not compile ("missing all_reduce"), nor a
/// sharded one ("missing all_gather"). Throws config_error when the shapes
/// differ.
template <class Ctx, class T>
replicated<T> residual_add(const Ctx& ctx, replicated<T> out,
                           std::type_identity_t<replicated<const T>> a,
                           std::type_identity_t<replicated<const T>> b) {
  TESSERA_THROW_IF(a.rows != out.rows || a.cols != out.cols || b.rows != out.rows ||
                       b.cols != out.cols,
                   config_error, "residual_add: shapes (", a.rows, ", ", a.cols, ") + (", b.rows,
                   ", ", b.cols, ") -> (", out.rows, ", ", out.cols, ") differ");
  residual_add(ctx, out.data, a.data, b.data, out.numel());
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
  rmsnorm_forward(ctx, out.data, rstd, x.data, w, x.rows, x.cols, eps);
  return out;
}

/// The RMSNorm backward (kernels::rmsnorm_backward) from a complete
/// gradient of its output `dout` (rows N, cols H): dinp (N, H) written, or
/// added with `accumulate`; the gains' gradient dw (H) accumulates. A
/// partial-sum dout (a column-parallel layer's input gradient before its
/// all_reduce) does not compile ("missing all_reduce").
template <class Ctx, class GA, class G, class T, class A>
void rmsnorm_backward(const Ctx& ctx, GA* dinp, G* dw, std::type_identity_t<replicated<const GA>> dout,
                      const T* x, const T* w, const A* rstd, bool accumulate) {
  rmsnorm_backward(ctx, dinp, dw, dout.data, x, w, rstd, dout.rows, dout.cols,
                            accumulate);
}

// Under sequence parallelism the norm and residual regions hold this
// rank's token rows (token_sharded): every row has all its features, so the
// row-wise operations run on the rows held. A token-sharded operand next to
// a replicated one does not compile.

/// out = a + b over this rank's token rows (sequence parallelism).
template <class Ctx, class T>
token_sharded<T> residual_add(const Ctx& ctx, token_sharded<T> out,
                              std::type_identity_t<token_sharded<const T>> a,
                              std::type_identity_t<token_sharded<const T>> b) {
  TESSERA_THROW_IF(a.rows != out.rows || a.cols != out.cols || b.rows != out.rows ||
                       b.cols != out.cols,
                   config_error, "residual_add: shapes (", a.rows, ", ", a.cols, ") + (", b.rows,
                   ", ", b.cols, ") -> (", out.rows, ", ", out.cols, ") differ");
  residual_add(ctx, out.data, a.data, b.data, out.numel());
  return out;
}

/// RMSNorm of this rank's token rows (sequence parallelism).
template <class Ctx, class T, class A>
token_sharded<T> rmsnorm_forward(const Ctx& ctx, token_sharded<T> out, A* rstd,
                                 std::type_identity_t<token_sharded<const T>> x, const T* w,
                                 double eps) {
  TESSERA_THROW_IF(x.rows != out.rows || x.cols != out.cols, config_error,
                   "rmsnorm_forward: input (", x.rows, ", ", x.cols, ") and output (", out.rows,
                   ", ", out.cols, ") differ");
  rmsnorm_forward(ctx, out.data, rstd, x.data, w, x.rows, x.cols, eps);
  return out;
}

/// The RMSNorm backward over this rank's token rows (sequence
/// parallelism) from the complete gradient of their output `dout` (rows,
/// H): dinp (rows, H) written, or added with `accumulate` (it may be the
/// residual gradient, not `dout`); the gains' gradient, this rank's rows'
/// part, is summed over `layers`' tp group in `scratch` (H, zeroed here)
/// and added to gw (H). Collective over the group (one all-reduce of H).
template <class Ctx, class Layers, class GA, class G, class T, class A>
void rmsnorm_backward(const Ctx& ctx, const Layers& layers, GA* dinp, G* gw, G* scratch,
                      std::type_identity_t<token_sharded<const GA>> dout, const T* x, const T* w,
                      const A* rstd, bool accumulate) {
  kernels::zero_elements(ctx, scratch, dout.cols);
  rmsnorm_backward(ctx, dinp, scratch, dout.data, x, w, rstd, dout.rows, dout.cols, accumulate);
  layers.all_reduce(partial_sum<G>{scratch, 1, dout.cols});
  residual_add(ctx, gw, gw, scratch, dout.cols);
}

}  // namespace placed

}  // namespace tessera::nn
