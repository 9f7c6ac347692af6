#pragma once
/// \file train/step.hpp
/// `step_runner<Chunks>`: one optimizer step of one rank, as data flows
/// (DESIGN.md, "One step"; seeds/004). It owns what a step reads and
/// writes besides the model chunks: the sampler of the training split, the
/// double-buffered loader, the schedule's action list, the executor that
/// runs it (parallel/executor.hpp) and the step's scalars in the
/// context's memory.
///
///   the global batch of G sequences is dp ranks x A micro-batches x B rows;
///   rank r trains on global micro-batches r A .. r A + A - 1
///   (data::global_micro_batch), so the union over the ranks is exactly the
///   one-rank job's batch -> count the scored tokens of the whole step on
///   the host from the sampler, summed over dp (the loss is the mean over
///   every scored token of the global batch, so grad_scale = 1/scored) ->
///   the schedule's actions (no_pipeline: forward, backward per micro-batch)
///   run by the executor, fed by the loader, buckets reduced as the last
///   backward produces them -> the global norm over every shard and rank ->
///   clip -> the optimizer on the owned elements -> one read of the losses
///   and the norm back to the host -> the loss summed over dp and pp.
///
/// Under a loss-scaled precision (precision::fp16_mixed) the seed gradient
/// is S / scored for the loss scale S of the step's loss_scaler, the clip
/// unscales the norm and the coefficient by 1/S (the gradients are
/// unscaled once, by the optimizer's multiply), and the scaler takes the
/// step's overflow flag: the global norm was not finite, the same on every
/// rank (precision/loss_scaler.hpp).
///
/// Under an FP8 precision with delayed scaling (precision::fp8_mixed) the
/// step amaxes of every linear layer of the rank's chunks are reduced with
/// max over dp and tp in one collective after the step and recorded into
/// their scales' histories (nn/fp8_linear.hpp), so every replica casts the
/// next step with the same scales; a skipped step records nothing (the
/// same decision on every rank).
///
/// The schedule: `Schedule` (parallel/pipeline_schedule.hpp) under a
/// pipeline or under zb1; the no_pipeline list of A micro-batches
/// otherwise. Every rank calls run() in the same order (collective over
/// the mesh).

#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/core/tensor.hpp"
#include "tessera/data/device_loader.hpp"
#include "tessera/data/documents.hpp"
#include "tessera/data/sampler.hpp"
#include "tessera/data/token_file.hpp"
#include "tessera/nn/fp8_linear.hpp"
#include "tessera/optim/clip.hpp"
#include "tessera/parallel/executor.hpp"
#include "tessera/parallel/layout.hpp"
#include "tessera/parallel/pipeline_schedule.hpp"
#include "tessera/parallel/schedule.hpp"
#include "tessera/precision/loss_scaler.hpp"
#include "tessera/precision/policy.hpp"
#include "tessera/train/config.hpp"
#include "tessera/train/metrics.hpp"

namespace tessera::train {

/// The action list of stage `stage` of `shape` under `schedule`: the
/// schedule's own, or no_pipeline(M) for one stage (zb1 keeps its B/W
/// split on one stage). Throws config_error as the schedules do.
template <parallel::pipeline_schedule Schedule>
std::vector<parallel::action> step_actions(const Schedule& schedule, int stage,
                                           parallel::pipeline_shape shape) {
  if (shape.stages == 1 && schedule.kind != parallel::schedule_kind::zero_bubble_h1)
    return parallel::no_pipeline(shape.micro_batches);
  return schedule.actions(stage, shape);
}

/// One rank's optimizer steps over `Chunks` (train::model_chunks) on the
/// layout `mesh` (file comment). Holds references to the chunks, the
/// layout, the context and the token file: they must outlive it.
template <class Chunks>
class step_runner {
 public:
  using model_type = typename Chunks::model_type;
  using engine_type = typename Chunks::engine_type;
  using layout_type = typename Chunks::layout_type;
  using Ctx = typename Chunks::Ctx;
  using Backend = typename Ctx::backend_type;
  using P = typename model_type::precision_type;
  using Param = typename P::param_type;
  using Acc = typename P::accum_type;
  using Master = typename P::master_type;
  using executor_type = parallel::executor<model_type, engine_type>;
  static constexpr std::int32_t ignore_index = Chunks::ignore_index;

  /// Builds the sampler, the loader (the first micro-batch of step 0
  /// prefetched), the action list of `schedule` for this rank and the
  /// executor with a record pool per chunk as deep as the list needs.
  /// Throws config_error as the sampler and the schedule do.
  template <parallel::pipeline_schedule Schedule>
  step_runner(Chunks& chunks, const layout_type& mesh, const train_config& cfg,
              const data::token_file& data, const Schedule& schedule, const Ctx& ctx)
      : chunks_(&chunks),
        mesh_(&mesh),
        ctx_(&ctx),
        cfg_(cfg),
        sampler_(data, data.split().train, cfg.micro_batch, cfg.seq, cfg.seed),
        loader_(
            data::loader_system_for<Backend>::make(ctx),
            [s = &sampler_](std::uint64_t step, std::uint64_t mb, std::int32_t* out) {
              s->fill(step, mb, out);
            },
            data::device_loader_options{cfg.micro_batch, cfg.seq, chunks.model().config().vocab,
                                        ignore_index, cfg.accum_steps(), first_micro_batch(),
                                        mesh.cp(), mesh.cp_rank()}),
        actions_(
            step_actions(schedule, mesh.stage(), {mesh.pp(), cfg.accum_steps(), chunks.size()})),
        scalars_(kernels::make_tensor<double>(ctx, 1 + cfg.accum_steps())),
        clip_(kernels::make_tensor<Master>(ctx, 1)),
        windows_(static_cast<std::size_t>(cfg.micro_batch * (cfg.seq + 1))) {
    if constexpr (precision::loss_scaled<P>) scaler_.emplace(cfg.loss_scale);
    if (cfg.document_separator) {  // its id checked by train::validate
      const std::int64_t n = cfg.accum_steps() * cfg.micro_batch * tokens();
      doc_row_.resize(static_cast<std::size_t>(cfg.seq));
      doc_host_.resize(static_cast<std::size_t>(n));
      doc_ = kernels::make_tensor<std::int32_t>(ctx, n);
    }
    std::vector<typename executor_type::chunk> ch;
    std::vector<std::int64_t> capacity;
    for (int c = 0; c < chunks.size(); ++c) {
      ch.push_back({&chunks.model(c), &chunks.engine(c)});
      capacity.push_back(std::max<std::int64_t>(1, parallel::peak_in_flight(actions_, c)));
    }
    executor_ =
        std::make_unique<executor_type>(std::move(ch), mesh, chunks.size(), std::move(capacity));
    executor_->set_micro_batch(cfg.micro_batch, tokens());
    executor_->set_tied_group(chunks.tied_group());
    loader_.prefetch(0, first_micro_batch());
  }

  /// Optimizer step `step` (0-based: it reads step's windows) at learning
  /// rate `lr`: the global loss, gradient norm, clip coefficient, scored
  /// and skipped fields of the metrics (the trainer adds the timing).
  /// Collective over the mesh. Throws config_error for a step with no
  /// scored token on any rank, what the executor throws.
  step_metrics run(std::int64_t step, double lr) {
    const std::int64_t A = cfg_.accum_steps(), B = cfg_.micro_batch, T = cfg_.seq;
    step_ = step;
    step_metrics m;
    m.lr = lr;
    // The loss is normalised by the scored tokens of the whole step, which
    // must be known before the first backward: counted on the host from
    // the sampler (the loader checks and copies the same windows).
    double scored = 0;
    for (std::int64_t a = 0; a < A; ++a) {
      sampler_.fill(static_cast<std::uint64_t>(step),
                    first_micro_batch() + static_cast<std::uint64_t>(a), windows_.data());
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t t = 1; t <= T; ++t)
          scored += windows_[static_cast<std::size_t>(b * (T + 1) + t)] != ignore_index;
      // Packed documents: the micro-batch's document starts, from the same
      // windows (global positions; this rank's tokens under context parallelism).
      if (cfg_.document_separator) {
        const cp_shard sh = shard();
        const std::int64_t L = sh.tokens();
        for (std::int64_t b = 0; b < B; ++b) {
          data::document_starts(windows_.data() + b * (T + 1), 1, T, *cfg_.document_separator,
                                doc_row_.data());
          sh.take(doc_row_.data(), doc_host_.data() + (a * B + b) * L);
        }
      }
    }
    if (cfg_.document_separator)  // every stage's forward reads them (the previous step is done)
      ctx_->from_host(doc_.data(), doc_host_.data(), doc_host_.size() * sizeof(std::int32_t));
    mesh_->reduce(*ctx_, std::span<double>(&scored, 1), parallel::axis::dp);
    TESSERA_THROW_IF(scored == 0, config_error, "step ", step,
                     " has no scored tokens on any rank (every target is ignore_index)");
    const double S = scaler_ ? scaler_->scale() : 1.0;  // the loss scale
    typename executor_type::inputs in;
    in.grad_scale = static_cast<Acc>(S / scored);
    in.inv_loss_scale = 1.0 / S;
    in.d_losses = scalars_.data() + 1;
    in.lr = lr;
    in.max_norm = cfg_.grad_clip;
    in.d_sum_squares = scalars_.data();
    in.d_clip = clip_.data();
    in.d_doc_start = cfg_.document_separator ? doc_.data() : nullptr;
    executor_->run(
        actions_, [&](std::int64_t a) { return next_micro_batch(a); }, in);
    // One read back: the norm, then the micro-batches' losses.
    std::vector<double> h(static_cast<std::size_t>(A + 1));
    ctx_->to_host(h.data(), scalars_.data(), h.size() * sizeof(double));
    double loss_sum = 0;  // the last stage's (the losses are written there)
    if (chunks_->holds_head())
      for (std::int64_t a = 0; a < A; ++a) loss_sum += h[static_cast<std::size_t>(1 + a)];
    m.grad_norm = std::sqrt(h[0]) * in.inv_loss_scale;  // of the unscaled gradients
    m.clip = optim::clip_coefficient(m.grad_norm, cfg_.grad_clip);
    if (!std::isfinite(m.clip)) {
      m.skipped = true;  // the optimizer kernel wrote nothing
      for (int c = 0; c < chunks_->size(); ++c) chunks_->engine(c).optimizer().skipped();
    }
    // Delayed FP8 scales learn only from steps that were taken: a skipped
    // step's amaxes (an overflow) would hold the scales for a whole history.
    if constexpr (precision::fp8_linear<P>) record_fp8_amaxes(m.skipped);
    if (scaler_) {
      m.loss_scale = S;
      scaler_->update(m.skipped);  // every rank: the same norm, the same flag
      m.skipped_steps = scaler_->skipped();
    }
    mesh_->reduce(*ctx_, std::span<double>(&loss_sum, 1),
                  {parallel::axis::dp, parallel::axis::cp, parallel::axis::pp});
    m.loss = loss_sum / scored;
    m.scored = static_cast<std::int64_t>(scored);
    return m;
  }

  /// Restarts the loader at `step` (a resume): its first micro-batch prefetched.
  void restart(std::int64_t step) {
    loader_.prefetch(static_cast<std::uint64_t>(step), first_micro_batch());
  }
  /// The loss scaler of a loss-scaled precision (null otherwise).
  precision::loss_scaler* scaler() { return scaler_ ? &*scaler_ : nullptr; }
  const precision::loss_scaler* scaler() const { return scaler_ ? &*scaler_ : nullptr; }
  /// This rank's action list of one step.
  const std::vector<parallel::action>& actions() const { return actions_; }
  executor_type& executor() { return *executor_; }

 private:
  // This rank's tokens of each sequence: all T, or its T/cp under context
  // parallelism (the ranks of a cp group read the same micro-batches).
  cp_shard shard() const { return cp_shard::of(cfg_.seq, mesh_->cp(), mesh_->cp_rank()); }
  std::int64_t tokens() const { return shard().tokens(); }
  std::uint64_t first_micro_batch() const {
    return data::global_micro_batch(static_cast<std::uint64_t>(mesh_->dp_rank()),
                                    static_cast<std::uint64_t>(cfg_.accum_steps()), 0);
  }
  // Delayed FP8 scaling: the step amaxes (x, W, dy) of every linear of the
  // chunks, brought to the host (one copy per chunk), reduced with max over
  // dp, cp and tp (every rank of those groups holds the same chunks; float
  // values as doubles: exact), recorded into the histories,
  // and the new scales written back; a skipped step's amaxes are cleared
  // (every rank skips alike: no collective then).
  void record_fp8_amaxes(bool skipped) {
    if (cfg_.fp8.scaling != precision::fp8_scaling::delayed) return;
    if (skipped) {
      for (int c = 0; c < chunks_->size(); ++c) chunks_->model(c).fp8_write_scales();
      return;
    }
    std::vector<double> a;
    for (int c = 0; c < chunks_->size(); ++c) {
      const std::vector<float> h = chunks_->model(c).fp8_scalars_to_host();
      for (std::size_t i = 0; i < h.size(); i += nn::fp8_linear_scalars) {
        float m[3];
        nn::fp8_linear_state::step_amaxes(h.data() + i, m);
        a.insert(a.end(), m, m + 3);
      }
    }
    if (a.empty()) return;  // a stage without blocks (the same on its dp and tp ranks)
    mesh_->reduce(*ctx_, std::span<double>(a),
                  {parallel::axis::dp, parallel::axis::cp, parallel::axis::tp},
                  comm::reduce_op::max);
    std::size_t i = 0;
    for (int c = 0; c < chunks_->size(); ++c) {
      for (auto& st : chunks_->model(c).fp8_linear_states()) {
        const float m[3] = {static_cast<float>(a[i]), static_cast<float>(a[i + 1]),
                            static_cast<float>(a[i + 2])};
        st.record_step(m);
        i += 3;
      }
      chunks_->model(c).fp8_write_scales();
    }
  }
  // The feed of the executor: micro-batch a of this step from the loader.
  nn::micro_batch<Param> next_micro_batch(std::int64_t a) {
    (void)a;  // checked only with contracts on
    const data::device_batch b = loader_.next();
    TESSERA_EXPECTS(b.step == static_cast<std::uint64_t>(step_) &&
                        b.micro_batch == first_micro_batch() + static_cast<std::uint64_t>(a),
                    "loader out of order");
    return {b.d_inputs, b.d_targets, nullptr, cfg_.micro_batch, tokens()};
  }

  Chunks* chunks_;
  const layout_type* mesh_;
  const Ctx* ctx_;
  train_config cfg_;
  data::batch_sampler sampler_;
  data::loader_for<Backend> loader_;
  std::vector<parallel::action> actions_;
  std::unique_ptr<executor_type> executor_;
  tensor<double, Backend> scalars_;     // (1 + A): sum of squares, then each micro-batch's loss
  tensor<Master, Backend> clip_;        // (1): the clip coefficient
  std::vector<std::int32_t> windows_;   // (B, T+1): the host's scored-token count
  std::vector<std::int32_t> doc_host_;  // (A, B, T/cp) document starts (packed documents)
  std::vector<std::int32_t> doc_row_;   // (T) one row's, before the cut
  tensor<std::int32_t, Backend> doc_;   // the same, in the context's memory
  std::optional<precision::loss_scaler> scaler_;  // loss_scaled<P> only
  std::int64_t step_ = 0;
};

}  // namespace tessera::train
