#pragma once
/// \file train/model_chunks.hpp
/// `model_chunks<P, Backend, O, S, C, L>`: the model chunks one rank of a
/// run holds, each with its data-parallel engine (parallel/zero.hpp),
/// built once from the model config, the run config and the rank's layout
/// (parallel/layout.hpp). Without a pipeline a rank holds one chunk, the
/// whole model; under one it holds the V chunks of its stage k of K:
/// chunk c is virtual stage v = c K + k of the K V virtual stages of
/// parallel::partition_stages (cfg.stage_blocks, or balanced by FLOPs),
/// which is computed here, once, for every part of the trainer to read.
///
/// Weights: drawn from cfg.seed (nn::llama::init_weights; the engine draws
/// its shard under zero<3>) or read from a Hugging Face folder's reader
/// (`weights`). Each engine runs over the group the weights are replicated
/// over (`dp`: the dp group, or dp x cp under context parallelism, as in
/// Megatron-Core); the tp group is the layer family's (layout.layers(),
/// with cfg.sequence_parallel); under context parallelism every chunk's
/// attention runs over the layout's cp group (nn::llama's
/// set_context_parallel, cfg.cp_kind).
///
/// Tied embeddings under a pipeline (pp > 1): the first stage holds the
/// embedding, the last stage a copy for its head (nn::tied_head::copy),
/// drawn (or read) alike; their gradients are summed over the embedding
/// group, split here from the pp group once: the first and the last stage
/// of each (dp, tp) position (color 0), the stages between apart (color 1),
/// as Megatron-LM's embedding group.

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "tessera/comm/communicator.hpp"
#include "tessera/kernels/context.hpp"
#include "tessera/nn/context_parallel.hpp"
#include "tessera/nn/llama.hpp"
#include "tessera/optim/optimizer.hpp"
#include "tessera/parallel/layout.hpp"
#include "tessera/parallel/pipeline_partition.hpp"
#include "tessera/parallel/sharding.hpp"
#include "tessera/parallel/zero.hpp"
#include "tessera/precision/policy.hpp"
#include "tessera/train/config.hpp"

namespace tessera::train {

/// This rank's model chunks and their engines (file comment). Not
/// copyable; the models, the engines and what they point at (the context,
/// the dp group, the layer family's groups, the weight reader) must
/// outlive it.
template <precision::policy P, class Backend, class O, class S, class C, class L>
class model_chunks {
 public:
  using Ctx = kernels::context_t<Backend>;
  using model_type = nn::llama<P, Backend, L>;
  using engine_type = parallel::data_parallel<model_type, O, S, C>;
  using layout_type = parallel::layout<C, L>;
  static constexpr std::int32_t ignore_index = -100;

  /// Builds the V = cfg.virtual_stages chunks of stage mesh.stage() of
  /// mesh.pp(), their weights (from cfg.seed, or `weights`) and their
  /// engines over `dp` (this rank's dp group; a one-rank communicator for
  /// one rank). Preconditions: train::validate passed for these settings.
  /// Throws what the model and the engine throw (config_error, out_of_memory).
  model_chunks(const nn::llama_config& model_cfg, const train_config& cfg, const layout_type& mesh,
               C& dp, const Ctx& ctx, const parallel::data_parallel_options& dpo,
               const nn::tensor_reader* weights)
      : stages_(parallel::partition_stages(model_cfg, cfg.seq,
                                           mesh.pp() * static_cast<int>(cfg.virtual_stages),
                                           cfg.stage_blocks)),
        stage_(mesh.stage()),
        K_(mesh.pp()) {
    L layers = mesh.layers();
    if (mesh.cp() > 1) {
      // A device cp group enqueues on the context's stream, behind the
      // kernels that write what it sends (as the model's tp group does).
      if constexpr (requires(C & g) { g.set_stream(ctx.stream()); })
        mesh.cp_group()->set_stream(ctx.stream());
      cp_ = std::make_unique<cp_type>(
          nn::context_parallel_attention<C>{mesh.cp_group(), cfg.cp_kind});
      // The kernels' limits on what each rank will run, now rather than at
      // the first step (a tp rank's heads; one replicated when tp > nkv).
      cp_->check(ctx, cfg.micro_batch, cfg.seq, model_cfg.n_heads / mesh.tp(),
                 std::max<std::int64_t>(1, model_cfg.n_kv_heads / mesh.tp()), model_cfg.head_dim());
    }
    if constexpr (L::tensor_parallel) layers.sequence_parallel = cfg.sequence_parallel;
    for (int c = 0; c < static_cast<int>(cfg.virtual_stages); ++c) {
      nn::llama_options o;
      o.ce_chunk = cfg.ce_chunk;
      o.ignore_index = ignore_index;
      o.external_params = engine_type::wants_external_params;
      o.external_grads = engine_type::wants_external_grads(dp.size());
      o.checkpointing = cfg.checkpointing;
      o.stage = stages_[static_cast<std::size_t>(virtual_stage(c))];
      o.weights = weights;
      o.fp8 = cfg.fp8;
      auto& m = *models_.emplace_back(std::make_unique<model_type>(model_cfg, o, ctx, layers));
      m.set_context_parallel(cp_.get());
      if constexpr (!S::shards_parameters) m.init_weights(cfg.seed);
      engines_.push_back(
          std::make_unique<engine_type>(m, dp, cfg.template optimizer_config<O>(), cfg.seed, dpo));
    }
    if (model_cfg.tie_word_embeddings && K_ > 1) {  // a collective of the pp group
      C& pp = *mesh.pp_group();
      const bool ends = stage_ == 0 || stage_ == K_ - 1;
      tied_group_ = std::make_unique<C>(pp.split(ends ? 0 : 1, stage_));
      if constexpr (requires(C & g) { g.set_stream(ctx.stream()); })
        tied_group_->set_stream(ctx.stream());
    }
  }
  model_chunks(const model_chunks&) = delete;
  model_chunks& operator=(const model_chunks&) = delete;

  /// V, the chunks this rank holds (1 unless interleaved).
  int size() const { return static_cast<int>(models_.size()); }
  model_type& model(int c = 0) { return *models_[static_cast<std::size_t>(c)]; }
  const model_type& model(int c = 0) const { return *models_[static_cast<std::size_t>(c)]; }
  engine_type& engine(int c = 0) { return *engines_[static_cast<std::size_t>(c)]; }
  const engine_type& engine(int c = 0) const { return *engines_[static_cast<std::size_t>(c)]; }

  /// Every virtual stage's blocks, K V of them in order (the partition of
  /// the whole model, not only this rank's).
  const std::vector<nn::stage_range>& stages() const { return stages_; }
  /// The virtual stage of chunk c: c K + k.
  int virtual_stage(int c) const { return c * K_ + stage_; }
  /// K V - 1: the virtual stage holding the head.
  int last_virtual_stage() const { return static_cast<int>(stages_.size()) - 1; }
  /// The pipeline rank holding virtual stage v.
  int rank_of_stage(int v) const { return v % K_; }
  /// Whether this rank holds the head (the last virtual stage: the losses).
  bool holds_head() const { return models_.back()->options().stage.head; }
  /// The embedding group of this rank (tied embeddings, pp > 1: the first
  /// and the last stage of its (dp, tp) position; the stages between, a
  /// group of their own that sums nothing), nullptr otherwise.
  C* tied_group() const { return tied_group_.get(); }
  /// The elements of every chunk's flat buffer on this rank.
  std::int64_t flat_elements() const {
    std::int64_t n = 0;
    for (const auto& m : models_) n += m->flat_size();
    return n;
  }

 private:
  std::vector<nn::stage_range> stages_;
  int stage_, K_;
  std::vector<std::unique_ptr<model_type>> models_;
  std::vector<std::unique_ptr<engine_type>> engines_;
  std::unique_ptr<C> tied_group_;  // tied embeddings, pp > 1 (split from the pp group)
  using cp_type = nn::cp_attention_over<C, Ctx, typename P::param_type, typename P::act_grad_type>;
  std::unique_ptr<cp_type> cp_;  // context parallelism: every chunk's attention over the cp group
};

}  // namespace tessera::train
