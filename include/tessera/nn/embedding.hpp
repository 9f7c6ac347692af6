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
#include "tessera/nn/linear.hpp"
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

/// The embedding of a Llama: V x H weights at `offset` of its segment. With
/// a tensor-parallel `Layers` family it is vocabulary-parallel (Megatron's
/// VocabParallelEmbedding): this rank holds rows [v_begin, v_begin + Vl) of
/// the vocabulary padded to a multiple of tp, looks up the ids it holds
/// (the others give zero rows), and the group sums the rows with one
/// all_reduce; the backward adds to its own rows only.
template <precision::policy P, class Ctx, class Layers = dense_layers>
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
      : V_(V), H_(H), offset_(offset), ignore_(ignore_index), Vl_(V) {}
  /// Vocabulary-parallel: this rank's Vl rows from v_begin of the padded
  /// vocabulary, reduced over `layers`' group.
  embedding(std::int64_t V, std::int64_t H, std::int64_t offset, std::int32_t ignore_index,
            Layers layers, std::int64_t v_begin, std::int64_t Vl)
      : V_(V), H_(H), offset_(offset), ignore_(ignore_index), layers_(layers), v_begin_(v_begin),
        Vl_(Vl) {}

  /// Returns x(N, H) = wte[ids[n]] (a padding id gives a zero row). `ids`
  /// (N) in the context's memory; copied into `r` (allocated first, as it
  /// lives longest), so the caller's buffer may be reused before backward.
  /// `seg`: the segment's first parameter. With `sequence_parallel` (a
  /// tensor-parallel family) the rows are reduce-scattered instead of
  /// all-reduced: x holds this rank's N/tp rows. Throws config_error (host)
  /// for an id outside [0, V) that is not the ignore index.
  tensor<Param, Backend> forward(const Ctx& ctx, const std::int32_t* ids, std::int64_t N,
                                 const Param* seg, record& r,
                                 bool sequence_parallel = false) const {
    r.ids = kernels::make_tensor<std::int32_t>(ctx, N);
    if constexpr (Layers::tensor_parallel) {
      // The record keeps this rank's row indices.
      embedding_local_ids(ctx, r.ids.data(), ids, N, V_, v_begin_, Vl_, ignore_);
      return lookup(ctx, r.ids.data(), N, seg, sequence_parallel);
    } else {
      tensor<Param, Backend> x = kernels::make_tensor<Param>(ctx, N * H_);
      kernels::copy_elements(ctx, r.ids.data(), ids, N);
      embedding_forward(ctx, x.data(), r.ids.data(), seg + offset_, N, V_, H_, ignore_);
      return x;
    }
  }

  /// As forward, keeping nothing (evaluation, generation).
  tensor<Param, Backend> forward_no_record(const Ctx& ctx, const std::int32_t* ids, std::int64_t N,
                                           const Param* seg,
                                           bool sequence_parallel = false) const {
    if constexpr (Layers::tensor_parallel) {
      tensor<std::int32_t, Backend> mine = kernels::make_tensor<std::int32_t>(ctx, N);
      embedding_local_ids(ctx, mine.data(), ids, N, V_, v_begin_, Vl_, ignore_);
      return lookup(ctx, mine.data(), N, seg, sequence_parallel);
    } else {
      tensor<Param, Backend> x = kernels::make_tensor<Param>(ctx, N * H_);
      embedding_forward(ctx, x.data(), ids, seg + offset_, N, V_, H_, ignore_);
      return x;
    }
  }

  /// dwte[ids[n]] += dx[n] for every non-padding row, in row order
  /// (deterministic). `seg_grads`: the segment's first gradient element.
  /// With `sequence_parallel`, dx holds this rank's N/tp rows and is
  /// all-gathered first. Frees the record.
  void backward(const Ctx& ctx, record& r, const ActGrad* dx, Grad* seg_grads,
                bool sequence_parallel = false) const {
    const std::int64_t N = r.ids.numel();
    if constexpr (Layers::tensor_parallel) {
      if (sequence_parallel) {
        tensor<ActGrad, Backend> all = kernels::make_tensor<ActGrad>(ctx, N * H_);
        layers_.all_gather(token_sharded<const ActGrad>{dx, N / layers_.size(), H_}, all.data());
        embedding_backward(ctx, seg_grads + offset_, all.data(), r.ids.data(), N, Vl_, H_,
                           ignore_);
        r.ids.release();
        return;
      }
    }
    embedding_backward(ctx, seg_grads + offset_, dx, r.ids.data(), N, Vl_, H_, ignore_);
    r.ids.release();
  }

  std::int64_t vocab() const { return V_; }
  std::int64_t dim() const { return H_; }

 private:
  // This rank's rows of the embedding of `mine` (this rank's row indices),
  // summed over the group: (N, H), or under sequence parallelism this
  // rank's N/tp token rows.
  tensor<Param, Backend> lookup(const Ctx& ctx, const std::int32_t* mine, std::int64_t N,
                                const Param* seg, bool sequence_parallel) const {
    tensor<Param, Backend> x = kernels::make_tensor<Param>(ctx, N * H_);
    embedding_forward(ctx, x.data(), mine, seg + offset_, N, Vl_, H_, ignore_);
    if (!sequence_parallel) {
      layers_.all_reduce(partial_sum<Param>{x.data(), N, H_});
      return x;
    }
    tensor<Param, Backend> rows = kernels::make_tensor<Param>(ctx, N / layers_.size() * H_);
    layers_.reduce_scatter(partial_sum<const Param>{x.data(), N, H_}, rows.data());
    return rows;
  }

  std::int64_t V_ = 0, H_ = 0, offset_ = 0;
  std::int32_t ignore_ = -100;
  Layers layers_{};
  std::int64_t v_begin_ = 0, Vl_ = 0;  // this rank's rows of the (padded) vocabulary
};

}  // namespace tessera::nn
