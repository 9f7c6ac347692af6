#pragma once
/// \file parallel/data_parallel_trainer.hpp
/// The training loop of one data-parallel rank: `data_parallel_trainer<P,
/// Sharding, Comm>`, composed from a precision policy, a sharding strategy
/// (zero<0..3>) and a communicator over the dp ranks, passed in explicitly.
///
/// One optimizer step on rank r of dp (DESIGN.md, "One step"; seeds/004):
///   the global batch of G sequences is dp ranks x A micro-batches x B rows;
///   rank r trains on global micro-batches r*A .. r*A + A-1
///   (data::global_micro_batch), so the union over ranks is exactly the
///   1-rank job's batch -> count scored tokens, all_reduce the count (the loss
///   is the mean over every scored token of the global batch) -> A x
///   forward_backward with grad_scale 1/(global scored), buckets reduced only
///   on the last micro-batch (parallel/zero.hpp) -> global norm over every
///   shard and rank -> clip -> AdamW on the owned elements -> gather.
///
/// So `G` stays the number of sequences per optimizer step whatever dp and
/// the strategy are, and the loss curve does not change beyond rounding.
/// train_step() and evaluate() return the same global figures on every rank.

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/comm/communicator.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/random.hpp"
#include "tessera/data/sampler.hpp"
#include "tessera/data/token_file.hpp"
#include "tessera/nn/llama.hpp"
#include "tessera/optim/clip.hpp"
#include "tessera/parallel/sharding.hpp"
#include "tessera/parallel/zero.hpp"
#include "tessera/train/checkpoint.hpp"
#include "tessera/train/metrics.hpp"
#include "tessera/train/trainer.hpp"

namespace tessera::parallel {

/// One rank of a data-parallel training run (file comment). Every rank must
/// construct it with the same settings and call the same member functions
/// in the same order (they are collectives).
template <precision::policy P, sharding_strategy S, comm::communicator C>
class data_parallel_trainer {
 public:
  using model_type = nn::llama<P>;
  using engine_type = data_parallel<P, S, C>;
  using Param = typename P::param_type;

  /// Builds the model (weights from cfg.seed; under zero<3> only this rank's
  /// shard), the engine (buckets, shards, optimizer state: allocated now)
  /// and the samplers. Checks before any work, naming the values: cfg.dp
  /// equals comm.size() ("dp=4 does not match the communicator's 2 ranks"),
  /// G is divisible into dp x B x A, T <= max_seq, the corpus holds a window.
  /// Throws config_error.
  data_parallel_trainer(nn::llama_config model_cfg, train::train_config cfg,
                        const data::token_file& data, C& comm, data_parallel_options dpo = {},
                        memory_resource& mr = host::default_resource())
      : cfg_(validated_cfg(cfg, comm)),
        comm_(&comm),
        mr_(&mr),
        model_(validated_model(model_cfg, cfg_, data),
               nn::llama_options{cfg_.ce_chunk, {}, ignore_index, S::shards_parameters,
                                 S::shards_gradients}, mr),
        engine_(init_model(model_, cfg_.seed), comm, cfg_.adamw, cfg_.seed, dpo, mr),
        data_(&data),
        split_(data.split()),
        sampler_(data, split_.train, cfg_.micro_batch, cfg_.seq, cfg_.seed),
        val_(data, split_.val, cfg_.seq, cfg_.eval_windows),
        sched_(cfg_.schedule()) {
    tokens_ = tensor<std::int32_t>(shape{cfg_.accum_steps(), cfg_.micro_batch, cfg_.seq + 1}, mr);
  }

  model_type& model() { return model_; }
  engine_type& engine() { return engine_; }
  const train::train_config& config() const { return cfg_; }
  C& communicator() { return *comm_; }
  int rank() const { return comm_->rank(); }
  /// Optimizer steps taken so far.
  std::int64_t step() const { return step_; }
  /// Peak FLOP/s of one rank, for MFU.
  void set_peak_flops(double f) { peak_flops_ = f; }

  /// One optimizer step (collective). Returns the global figures, the same
  /// on every rank: loss over every scored token of the global batch,
  /// gradient norm over all shards and ranks, tokens of the global batch.
  /// Non-finite norm: the update is skipped on every rank (metrics.skipped).
  train::step_metrics train_step() {
    const auto t0 = std::chrono::steady_clock::now();
    mr_->reset_peak();
    const std::int64_t A = cfg_.accum_steps(), B = cfg_.micro_batch, T = cfg_.seq;
    train::step_metrics m;
    m.lr = sched_(step_);
    std::int64_t scored = 0;
    for (std::int64_t a = 0; a < A; ++a) {
      std::int32_t* tok = tokens_.data() + a * B * (T + 1);
      const auto mb =
          data::global_micro_batch(static_cast<std::uint64_t>(rank()),
                                   static_cast<std::uint64_t>(A), static_cast<std::uint64_t>(a));
      sampler_.fill(static_cast<std::uint64_t>(step_), mb, tok);
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t t = 1; t <= T; ++t) scored += tok[b * (T + 1) + t] != ignore_index;
    }
    comm_->all_reduce(&scored, 1, comm::reduce_op::sum);
    TESSERA_THROW_IF(scored == 0, config_error, "step ", step_,
                     " has no scored tokens on any rank (every target is ignore_index)");
    model_.zero_grad();
    engine_.begin_step();
    double loss_sum = 0;
    const auto scale = static_cast<typename P::accum_type>(1.0 / static_cast<double>(scored));
    for (std::int64_t a = 0; a < A; ++a) {
      engine_.begin_micro_batch(a, a == A - 1);
      loss_sum += model_.forward_backward(tokens_.data() + a * B * (T + 1), B, T, scale).loss_sum;
    }
    engine_.finish_gradients();
    m.grad_norm = std::sqrt(engine_.grad_norm_squared());
    m.clip = optim::clip_coefficient(m.grad_norm, cfg_.grad_clip);
    if (std::isfinite(m.clip))
      engine_.step(m.lr, m.clip);
    else
      m.skipped = true;
    comm_->all_reduce(&loss_sum, 1, comm::reduce_op::sum);
    m.loss = loss_sum / static_cast<double>(scored);
    ++step_;
    m.step = step_;
    m.tokens = cfg_.global_batch * T;
    m.scored = scored;
    m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    m.tokens_per_s = static_cast<double>(m.tokens) / m.seconds;
    m.flops = train::flops_per_token(model_.config(), T) * static_cast<double>(m.tokens);
    m.mfu = peak_flops_ > 0 ? m.flops / m.seconds / (peak_flops_ * comm_->size()) : 0.0;
    const auto st = mr_->stats();
    m.mem_allocated = st.allocated;
    m.mem_peak = st.peak_allocated;
    return m;
  }

  /// Mean loss (nats per token) over the first `windows` fixed validation
  /// windows (-1: the configured eval_windows; 0: every window of the split),
  /// as train::trainer::evaluate, split across the ranks by batch (batch j to
  /// rank j mod dp; a rank without a batch in the last round repeats batch 0
  /// and discards it, so every rank runs the same forwards, which zero<3>'s
  /// gathers need). Collective; the same value on every rank, equal to the
  /// 1-rank figure up to the order of the float64 sum.
  double evaluate(std::int64_t windows = -1) {
    const std::int64_t B = cfg_.micro_batch, T = cfg_.seq, dp = comm_->size();
    const data::val_windows val =
        windows < 0 ? val_ : data::val_windows(*data_, split_.val, T, windows);
    std::vector<std::int32_t> buf(static_cast<std::size_t>(B * (T + 1)));
    double sum[2] = {0, 0};  // loss sum, scored
    const std::int64_t nb = val.batches(B), rounds = (nb + dp - 1) / dp;
    for (std::int64_t j = 0; j < rounds; ++j) {
      const std::int64_t k = j * dp + rank();
      const std::int64_t rows = val.fill(k < nb ? k : 0, B, buf.data());
      engine_.begin_forward_only();
      auto r = model_.forward_loss(buf.data(), rows, T);
      if (k < nb) {
        sum[0] += r.loss_sum;
        sum[1] += static_cast<double>(r.scored);
      }
    }
    comm_->all_reduce(sum, 2, comm::reduce_op::sum);
    return sum[1] > 0 ? sum[0] / sum[1] : std::nan("");
  }

  /// Samples `n` tokens after `prompt` as train::trainer::generate does, on
  /// every rank (collective under zero<3>); the same tokens on every rank.
  std::vector<std::int32_t> generate(std::vector<std::int32_t> prompt, std::int64_t n,
                                     double temperature, std::uint64_t seed) {
    return train::generate_tokens(std::move(prompt), n, temperature, seed, model_.config().vocab,
                                  std::min(model_.config().max_seq, cfg_.seq),
                                  [&](const std::int32_t* ids, std::int64_t len, float* logits) {
                                    engine_.begin_forward_only();
                                    model_.next_token_logits(ids, len, logits);
                                  });
  }

  /// The full parameters (layout().total() elements) on every rank;
  /// collective under zero<3>. For tests and export.
  std::vector<Param> full_params() {
    std::vector<Param> out(static_cast<std::size_t>(model_.layout().total()));
    engine_.full_params(out.data());
    return out;
  }

  /// zero<0>: rank 0 writes the parameters and the full optimizer state to
  /// `path` (the same payload as train::trainer, metadata naming dp and the
  /// strategy); collective (the ranks wait for the file). zero<1..3>: throws
  /// config_error before any work: sharded checkpoints (each rank's shard, or
  /// a gather to rank 0) are not supported yet.
  void save_checkpoint(const std::filesystem::path& path) {
    refuse_sharded("save");
    if (rank() == 0) {
      const std::uint64_t pbytes =
          sizeof(Param) * static_cast<std::uint64_t>(model_.layout().total());
      const auto& opt = engine_.optimizer();
      train::write_checkpoint(path, metadata(), pbytes + opt.serialized_bytes(),
                              [&](train::checkpoint_writer& w) {
                                w.write(model_.params(), pbytes);
                                opt.save(w);
                              });
    }
    comm_->barrier();
  }

  /// zero<0>: every rank restores what save_checkpoint wrote (model,
  /// optimizer state, step). Throws io_error for a missing, truncated or
  /// corrupt file, config_error if its settings (model, precision, batch,
  /// dp, strategy, ...) differ from this run's, naming the field and both
  /// values; zero<1..3>: config_error as save_checkpoint.
  void load_checkpoint(const std::filesystem::path& path) {
    refuse_sharded("load");
    nlohmann::json meta;
    std::vector<char> payload;
    train::read_checkpoint(path, meta, payload);
    const std::int64_t step = train::check_resume_metadata(path, meta, metadata(), cfg_.steps);
    const std::uint64_t pbytes =
        sizeof(Param) * static_cast<std::uint64_t>(model_.layout().total());
    auto& opt = engine_.optimizer();
    TESSERA_THROW_IF(payload.size() != pbytes + opt.serialized_bytes(), io_error, "checkpoint '",
                     path.string(), "' holds ", payload.size(), " payload bytes; this run needs ",
                     pbytes + opt.serialized_bytes());
    std::memcpy(static_cast<void*>(model_.params()), payload.data(), pbytes);
    opt.load(payload.data() + pbytes);
    step_ = step;
  }

  static constexpr std::int32_t ignore_index = -100;

 private:
  static train::train_config validated_cfg(train::train_config cfg, const C& comm) {
    TESSERA_THROW_IF(cfg.dp != comm.size(), config_error, "dp=", cfg.dp,
                     " does not match the communicator's ", comm.size(), " ranks (world size)");
    cfg.validate();
    return cfg;
  }
  static nn::llama_config validated_model(nn::llama_config c, const train::train_config& cfg,
                                          const data::token_file& d) {
    c.validate();
    TESSERA_THROW_IF(cfg.seq > c.max_seq, config_error, "sequence length T=", cfg.seq,
                     " exceeds the model's max_seq=", c.max_seq, " (preset '", c.name, "')");
    TESSERA_THROW_IF(d.vocab() > static_cast<std::uint64_t>(c.vocab), config_error,
                     "token file vocabulary ", d.vocab(), " exceeds the model's vocab=", c.vocab);
    return c;
  }
  static model_type& init_model(model_type& m, std::uint64_t seed) {
    if constexpr (!S::shards_parameters) m.init_weights(seed);
    return m;
  }
  void refuse_sharded(const char* what) const {
    TESSERA_THROW_IF(S::shards_optimizer_state, config_error, what, "_checkpoint: ", S::name,
                     " keeps the optimizer state sharded over dp=", comm_->size(),
                     " ranks; sharded checkpoints are not supported yet (use --zero 0 to "
                     "checkpoint a data-parallel run)");
  }
  nlohmann::json metadata() const {
    const auto& c = model_.config();
    return {{"model", train::model_metadata(c)},
            {"precision", P::name},
            {"optimizer", engine_type::optimizer_type::name},
            {"sharding", S::name},
            {"dp", comm_->size()},
            {"step", step_},
            {"adamw",
             {{"beta1", cfg_.adamw.beta1},
              {"beta2", cfg_.adamw.beta2},
              {"eps", cfg_.adamw.eps},
              {"weight_decay", cfg_.adamw.weight_decay}}},
            {"grad_clip", cfg_.grad_clip},
            {"global_batch", cfg_.global_batch},
            {"micro_batch", cfg_.micro_batch},
            {"seq", cfg_.seq},
            {"seed", cfg_.seed},
            {"steps", cfg_.steps},
            {"lr", cfg_.lr},
            {"min_lr_ratio", cfg_.min_lr_ratio},
            {"warmup", cfg_.warmup},
            {"flat_elements", model_.layout().total()},
            {"data", {{"tokens", data_->size()}, {"vocab", data_->vocab()},
                      {"fingerprint", data::fingerprint(*data_)}}}};
  }

  train::train_config cfg_;
  C* comm_;
  memory_resource* mr_;
  model_type model_;
  engine_type engine_;
  const data::token_file* data_;
  data::split_view split_;
  data::batch_sampler sampler_;
  data::val_windows val_;
  optim::warmup_cosine sched_;
  tensor<std::int32_t> tokens_;
  std::int64_t step_ = 0;
  double peak_flops_ = 0;
};

}  // namespace tessera::parallel
