#pragma once
/// \file nn/lm_head.hpp
/// The head module of a Llama: the final RMSNorm and the LM head fused with
/// the next-token cross-entropy in chunks of tokens, so the full (N, V)
/// logits never exist (kernels/cross_entropy.hpp).
///
/// The chunked LM head computes its gradient as it goes, so in training
/// the head's forward runs its backward too: forward() leaves in the record
/// the gradient of the loss with respect to the head's input (the last
/// block's output), and accumulates the gradients of the final norm and the
/// LM head; backward() hands that gradient over. The head's activations
/// (normed states, rstd, the logit chunks) never outlive its forward.
///
/// Gradient contract (llm.c): parameter gradients accumulate (+=), the
/// input gradient is written (=). The loss is the SUM of -log p(target)
/// over the scored rows, written to one double in the context's memory
/// (no host synchronisation); grad_scale (1 / the scored tokens of the
/// whole optimizer step) multiplies the gradients.

#include <algorithm>
#include <cstdint>

#include "tessera/core/tensor.hpp"
#include "tessera/kernels/context.hpp"
#include "tessera/kernels/cross_entropy.hpp"
#include "tessera/kernels/rmsnorm.hpp"
#include "tessera/nn/linear.hpp"
#include "tessera/precision/policy.hpp"

namespace tessera::nn {

/// What the head's training forward leaves for the backward pass.
template <precision::policy P, class Backend>
struct head_record {
  /// (rows, H) d(loss)/d(head input), scaled by grad_scale (rows = N, or
  /// N/tp under sequence parallelism).
  tensor<typename P::act_grad_type, Backend> dx;
};

/// Final norm (H gains at `norm_offset` of the head's segment) and LM head
/// (V x H weights, passed to each call: the head segment's own tensor, or
/// the embedding's when the embeddings are tied, llama_config::
/// tie_word_embeddings, whose gradient then accumulates into the
/// embedding's). With a tensor-parallel
/// `Layers` family the LM head is vocabulary-parallel: this rank holds Vl
/// rows from v_begin of the vocabulary padded to a multiple of tp, the
/// cross-entropy combines the slices' row maxima, sums of exponentials and
/// target logits over the group and never gathers the logits
/// (kernels::lm_head_cross_entropy_vocab_parallel), and the input gradient,
/// a partial sum, is all-reduced before the final norm's backward.
template <precision::policy P, class Ctx, class Layers = dense_layers>
class lm_head {
 public:
  using Backend = typename Ctx::backend_type;
  using Param = typename P::param_type;
  using Grad = typename P::grad_type;
  using ActGrad = typename P::act_grad_type;
  using Acc = typename P::accum_type;
  using record = head_record<P, Backend>;

  lm_head() = default;
  lm_head(std::int64_t V, std::int64_t H, double eps, std::int64_t norm_offset, std::int64_t chunk,
          std::int32_t ignore_index)
      : V_(V), H_(H), eps_(eps), norm_(norm_offset), chunk_(chunk), ignore_(ignore_index), Vl_(V) {}
  /// Vocabulary-parallel: this rank's Vl rows from v_begin, over `layers`'
  /// group (a tied head: the embedding's rows, which split the same way).
  lm_head(std::int64_t V, std::int64_t H, double eps, std::int64_t norm_offset, std::int64_t chunk,
          std::int32_t ignore_index, Layers layers, std::int64_t v_begin, std::int64_t Vl)
      : V_(V),
        H_(H),
        eps_(eps),
        norm_(norm_offset),
        chunk_(chunk),
        ignore_(ignore_index),
        layers_(layers),
        v_begin_(v_begin),
        Vl_(Vl) {}

  /// Training forward (and the head's backward, fused): from `x` (N, H),
  /// the last block's output, and `targets` (N) (ignore_index: not
  /// scored), writes *d_loss = the sum of token losses, accumulates the
  /// final norm's gradient into `g` (the segment's first gradient element)
  /// and the LM head's into `gw` ((Vl, H), beside `w`: the weights' own
  /// gradient, the embedding's when tied) and leaves d(loss)/dx (N, H) in
  /// r.dx. `p`: the segment's first parameter; `w`: the (Vl, H) LM head
  /// weights. `x` is not kept. With `sequence_parallel`
  /// (a tensor-parallel family) x and r.dx hold this rank's N/tp token
  /// rows: the normed rows are all-gathered before the LM head, its input
  /// gradient reduce-scattered, the final norm's gain gradient summed over
  /// the group. Throws config_error (host) for a target outside [0, V).
  void forward(const Ctx& ctx, const Param* x, const std::int32_t* targets, std::int64_t N,
               const Param* p, const Param* w, Grad* g, Grad* gw, Acc grad_scale, double* d_loss,
               record& r, bool sequence_parallel = false) const {
    const std::int64_t R = rows(N, sequence_parallel);
    tensor<Acc, Backend> rstd = kernels::make_tensor<Acc>(ctx, R);
    tensor<Param, Backend> xn = kernels::make_tensor<Param>(ctx, R * H_);
    rmsnorm_forward(ctx, xn.data(), rstd.data(), x, p + norm_, R, H_, eps_);
    tensor<Param, Backend> all;  // sequence parallelism: every rank's normed rows
    const Param* in = gather(ctx, xn, R, N, sequence_parallel, all);
    tensor<ActGrad, Backend> dxn = kernels::make_tensor<ActGrad>(ctx, N * H_);
    if constexpr (Layers::tensor_parallel) {
      lm_head_cross_entropy_vocab_parallel(ctx, d_loss, in, w, targets, N, V_, v_begin_, Vl_, H_,
                                           ignore_, grad_scale, dxn.data(), gw, chunk_, reducer());
      all.release();
      if (sequence_parallel) {
        // dxn, a partial sum of every row, reduce-scattered to this rank's rows
        tensor<ActGrad, Backend> mine = kernels::make_tensor<ActGrad>(ctx, R * H_);
        layers_.reduce_scatter(partial_sum<const ActGrad>{dxn.data(), N, H_}, mine.data());
        dxn = std::move(mine);
        r.dx = kernels::make_tensor<ActGrad>(ctx, R * H_);
        tensor<Grad, Backend> dgain = kernels::make_tensor<Grad>(ctx, H_);
        placed::rmsnorm_backward(ctx, layers_, r.dx.data(), g + norm_, dgain.data(),
                                 token_sharded<const ActGrad>{dxn.data(), R, H_}, x, p + norm_,
                                 rstd.data(), false);
        return;
      }
      layers_.all_reduce(partial_sum<ActGrad>{dxn.data(), N, H_});
    } else {
      lm_head_cross_entropy(ctx, d_loss, xn.data(), w, targets, N, V_, H_, ignore_, grad_scale,
                            dxn.data(), gw, chunk_);
    }
    r.dx = kernels::make_tensor<ActGrad>(ctx, N * H_);
    rmsnorm_backward(ctx, r.dx.data(), g + norm_, dxn.data(), x, p + norm_, rstd.data(), N, H_,
                     false);
  }
  /// Evaluation: *d_loss = the sum of token losses; no gradient, nothing
  /// kept. With `sequence_parallel`, x holds this rank's N/tp rows.
  void forward_loss(const Ctx& ctx, const Param* x, const std::int32_t* targets, std::int64_t N,
                    const Param* p, const Param* w, double* d_loss,
                    bool sequence_parallel = false) const {
    const std::int64_t R = rows(N, sequence_parallel);
    tensor<Acc, Backend> rstd = kernels::make_tensor<Acc>(ctx, R);
    tensor<Param, Backend> xn = kernels::make_tensor<Param>(ctx, R * H_);
    rmsnorm_forward(ctx, xn.data(), rstd.data(), x, p + norm_, R, H_, eps_);
    tensor<Param, Backend> all;
    const Param* in = gather(ctx, xn, R, N, sequence_parallel, all);
    if constexpr (Layers::tensor_parallel)
      lm_head_cross_entropy_vocab_parallel(ctx, d_loss, in, w, targets, N, V_, v_begin_, Vl_, H_,
                                           ignore_, Acc(0), static_cast<ActGrad*>(nullptr),
                                           static_cast<Grad*>(nullptr), chunk_, reducer());
    else
      lm_head_cross_entropy(ctx, d_loss, in, w, targets, N, V_, H_, ignore_, Acc(0),
                            static_cast<ActGrad*>(nullptr), static_cast<Grad*>(nullptr), chunk_);
  }
  /// The V float32 logits after row `x_row` (H), for generation, into
  /// `d_logits` (context memory); `p` the segment, `w` the LM head weights.
  void logits(const Ctx& ctx, float* d_logits, const Param* x_row, const Param* p,
              const Param* w) const {
    tensor<Acc, Backend> rstd = kernels::make_tensor<Acc>(ctx, 1);
    tensor<Param, Backend> xn = kernels::make_tensor<Param>(ctx, H_);
    rmsnorm_forward(ctx, xn.data(), rstd.data(), x_row, p + norm_, 1, H_, eps_);
    if constexpr (Layers::tensor_parallel) {
      // This rank's slice into a zeroed padded row, summed over the group:
      // every rank gets all V logits (the context's memory).
      const std::int64_t n = Vl_ * layers_.size();
      tensor<float, Backend> all = kernels::make_tensor<float>(ctx, n);
      kernels::zero_elements(ctx, all.data(), n);
      lm_head_logits(ctx, all.data() + v_begin_, xn.data(), w, H_, Vl_);
      layers_.all_reduce_values(all.data(), static_cast<std::size_t>(n), false);
      kernels::copy_elements(ctx, d_logits, all.data(), V_);
    } else {
      lm_head_logits(ctx, d_logits, xn.data(), w, H_, V_);
    }
  }

  /// Hands over d(loss)/d(head input) (N, H): the record's gradient, moved out.
  tensor<ActGrad, Backend> backward(record& r) const { return std::move(r.dx); }

  std::int64_t chunk() const { return chunk_; }

  /// Bytes per token the training forward keeps (r.dx; per token row held
  /// under sequence parallelism).
  std::int64_t record_bytes_per_token() const {
    return static_cast<std::int64_t>(sizeof(ActGrad)) * H_;
  }

 private:
  // Token rows of the head's input: N, or N/tp under sequence parallelism.
  std::int64_t rows(std::int64_t N, bool sequence_parallel) const {
    return sequence_parallel ? N / layers_.size() : N;
  }
  // The normed rows the LM head reads: xn itself, or under sequence
  // parallelism every rank's R rows gathered into `all` (allocated here).
  const Param* gather(const Ctx& ctx, const tensor<Param, Backend>& xn, std::int64_t R,
                      std::int64_t N, bool sequence_parallel, tensor<Param, Backend>& all) const {
    if constexpr (Layers::tensor_parallel) {
      if (sequence_parallel) {
        all = kernels::make_tensor<Param>(ctx, N * H_);
        return layers_.all_gather(token_sharded<const Param>{xn.data(), R, H_}, all.data()).data;
      }
    }
    (void)ctx, (void)R, (void)N, (void)all;
    return xn.data();
  }

  // The cross-entropy's reductions over the group.
  auto reducer() const {
    return [this](bool max, Acc* v, std::int64_t n) {
      layers_.all_reduce_values(v, static_cast<std::size_t>(n), max);
    };
  }

  std::int64_t V_ = 0, H_ = 0;
  double eps_ = 1e-5;
  std::int64_t norm_ = 0, chunk_ = 256;
  std::int32_t ignore_ = -100;
  Layers layers_{};
  std::int64_t v_begin_ = 0, Vl_ = 0;  // this rank's rows of the (padded) vocabulary
};

}  // namespace tessera::nn
