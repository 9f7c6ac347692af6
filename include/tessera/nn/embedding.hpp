#pragma once
/// \file nn/embedding.hpp
/// The token embedding module: x(N, H) = wte[ids] (wte (V, H) the
/// segment's only tensor), with ignore_index inputs as padding (a zero row,
/// no gradient). One implementation for every backend: the kernels are
/// called through the context (kernels/context.hpp).
///
/// Gradient contract (llm.c): dwte accumulates (+=); there is no input
/// gradient (ids are integers). forward() saves the ids in the record,
/// backward() consumes and frees it.

#include <cstdint>

#include "tessera/core/tensor.hpp"
#include "tessera/kernels/context.hpp"
#include "tessera/kernels/embedding.hpp"
#include "tessera/precision/policy.hpp"

namespace tessera::nn {

/// What the embedding's forward keeps for its backward.
template <class Backend>
struct embedding_record {
  tensor<std::int32_t, Backend> ids;  ///< (N) the input ids of the micro-batch

  /// Bytes held for N token rows.
  static std::int64_t bytes(std::int64_t N) {
    return N * static_cast<std::int64_t>(sizeof(std::int32_t));
  }
};

/// The embedding of a Llama: V x H weights at `offset` of its segment.
template <precision::policy P, class Ctx>
class embedding {
 public:
  using Backend = typename Ctx::backend_type;
  using Param = typename P::param_type;
  using Grad = typename P::grad_type;
  using ActGrad = typename P::act_grad_type;
  using record = embedding_record<Backend>;

  embedding() = default;
  /// V x H weights at `offset` of the segment; `ignore_index` marks padding.
  embedding(std::int64_t V, std::int64_t H, std::int64_t offset, std::int32_t ignore_index)
      : V_(V), H_(H), offset_(offset), ignore_(ignore_index) {}

  /// Returns x(N, H) = wte[ids[n]] (a padding id gives a zero row). `ids`
  /// (N) in the context's memory; copied into `r` (allocated first, as it
  /// lives longest), so the caller's buffer may be reused before backward.
  /// `seg`: the segment's first parameter. Throws config_error (host) for
  /// an id outside [0, V) that is not the ignore index.
  tensor<Param, Backend> forward(const Ctx& ctx, const std::int32_t* ids, std::int64_t N,
                                 const Param* seg, record& r) const {
    r.ids = kernels::make_tensor<std::int32_t>(ctx, N);
    tensor<Param, Backend> x = kernels::make_tensor<Param>(ctx, N * H_);
    kernels::copy_elements(ctx, r.ids.data(), ids, N);
    embedding_forward(ctx, x.data(), r.ids.data(), seg + offset_, N, V_, H_, ignore_);
    return x;
  }
  /// As forward, keeping nothing (evaluation, generation).
  tensor<Param, Backend> forward_no_record(const Ctx& ctx, const std::int32_t* ids, std::int64_t N,
                                           const Param* seg) const {
    tensor<Param, Backend> x = kernels::make_tensor<Param>(ctx, N * H_);
    embedding_forward(ctx, x.data(), ids, seg + offset_, N, V_, H_, ignore_);
    return x;
  }
  /// dwte[ids[n]] += dx[n] for every non-padding row, in row order
  /// (deterministic). `seg_grads`: the segment's first gradient element.
  /// Frees the record.
  void backward(const Ctx& ctx, record& r, const ActGrad* dx, Grad* seg_grads) const {
    embedding_backward(ctx, seg_grads + offset_, dx, r.ids.data(), r.ids.numel(), V_, H_,
                       ignore_);
    r.ids.release();
  }

  std::int64_t vocab() const { return V_; }
  std::int64_t dim() const { return H_; }

 private:
  std::int64_t V_ = 0, H_ = 0, offset_ = 0;
  std::int32_t ignore_ = -100;
};

}  // namespace tessera::nn
