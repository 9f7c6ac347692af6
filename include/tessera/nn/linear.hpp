#pragma once
/// \file nn/linear.hpp
/// The `linear` seam (DESIGN.md, "Modules"): every GEMM of a transformer
/// block goes through one of these, so that tensor parallelism can replace
/// a dense layer by its column- or row-parallel variant without touching
/// the block. `dense_layers` is the layer family of a model on one rank
/// (every weight whole); a tensor-parallel family supplies `column` (split
/// by output features: q, k, v, gate, up) and `row` (split by input
/// features: the attention output and down projections) types with the
/// same members.
///
/// A layer is a bias-free y = x W^T with W (out_features, in_features), as
/// PyTorch's nn.Linear, stored at `offset` elements from its module's first
/// parameter (nn/segment_hooks.hpp): the module passes its segment's
/// parameter and gradient pointers, so the layer works whether the segment
/// lives in the flat buffer or in a ZeRO-3 gathered copy.
///
/// Gradient contract (llm.c): backward_weight accumulates (+=) into the
/// weight gradient; backward_input writes (=) the input gradient, or adds
/// (+=) with `accumulate` (q, k and v share their input).

#include <cstdint>

#include "tessera/kernels/gemm.hpp"

namespace tessera::nn {

/// A dense layer of `out_features` x `in_features` weights at `offset` in
/// its segment. Trivially copyable; holds no memory.
struct linear {
  std::int64_t out_features = 0;  ///< N of the GEMMs
  std::int64_t in_features = 0;   ///< K of the GEMMs
  std::int64_t offset = 0;        ///< first weight element, from the segment's first parameter

  /// y(M, out) = x(M, in) W^T. `seg` is the segment's first parameter; y is
  /// written. FLOPs: kernels::gemm_flops(M, out, in).
  template <class Ctx, class T>
  void forward(const Ctx& ctx, T* y, const T* x, const T* seg, std::int64_t M) const {
    linear_forward(ctx, y, x, seg + offset, M, out_features, in_features);
  }
  /// dx(M, in) = dy(M, out) W (written, or added with `accumulate`).
  template <class Ctx, class T, class GA>
  void backward_input(const Ctx& ctx, GA* dx, const GA* dy, const T* seg, std::int64_t M,
                      bool accumulate = false) const {
    linear_backward_input(ctx, dx, dy, seg + offset, M, out_features, in_features, accumulate);
  }
  /// dW(out, in) += dy(M, out)^T x(M, in); `seg_grads` is the segment's
  /// first gradient element (same offsets as its parameters).
  template <class Ctx, class T, class GA, class G>
  void backward_weight(const Ctx& ctx, G* seg_grads, const GA* dy, const T* x,
                       std::int64_t M) const {
    linear_backward_weight(ctx, seg_grads + offset, dy, x, M, out_features, in_features);
  }
  /// Weight elements.
  std::int64_t numel() const { return out_features * in_features; }
};

/// The layer family of a model on one rank: every projection is a dense
/// `linear`. Tensor parallelism provides another family with the same names.
struct dense_layers {
  using column = linear;  ///< q, k, v, gate, up
  using row = linear;     ///< attention output, down
};

}  // namespace tessera::nn
