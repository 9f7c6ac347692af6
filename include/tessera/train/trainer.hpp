#pragma once
/// \file train/trainer.hpp
/// The single-rank training loop: gradient accumulation over micro-batches,
/// warmup-cosine learning rate, global-norm clipping, AdamW, evaluation on
/// the held-out split, step metrics, and checkpoints that resume exactly.
///
/// One optimizer step, as data flows (DESIGN.md, "One step"):
///   sampler -> (A micro-batches of B windows of T+1 tokens) -> count scored
///   tokens of the whole step -> for each micro-batch: forward, fused LM
///   head + cross-entropy, backward (gradients accumulate, scaled by
///   1 / scored so the step's loss is the mean over every scored token) ->
///   global gradient norm -> clip -> AdamW -> metrics.

#include <algorithm>
#include <chrono>
#include <cstring>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/core/error.hpp"
#include "tessera/core/random.hpp"
#include "tessera/data/sampler.hpp"
#include "tessera/data/token_file.hpp"
#include "tessera/nn/llama.hpp"
#include "tessera/optim/adamw.hpp"
#include "tessera/optim/clip.hpp"
#include "tessera/optim/schedule.hpp"
#include "tessera/precision/policy.hpp"
#include "tessera/train/checkpoint.hpp"
#include "tessera/train/metrics.hpp"

namespace tessera::train {

/// Run-time settings of a training run (sizes are values, DESIGN.md principle 3).
struct train_config {
  std::int64_t steps = 1000;        ///< optimizer steps
  std::int64_t global_batch = 16;   ///< G, sequences per optimizer step (all ranks)
  std::int64_t micro_batch = 16;    ///< B, sequences per forward
  std::int64_t seq = 128;           ///< T, tokens per sequence
  std::int64_t dp = 1;              ///< data-parallel degree (1 in this trainer)
  double lr = 1e-3;                 ///< peak learning rate
  double min_lr_ratio = 0.1;        ///< final lr = lr * min_lr_ratio
  std::int64_t warmup = 50;         ///< warmup steps
  double grad_clip = 1.0;           ///< max global gradient norm (<= 0: off)
  optim::adamw_config adamw{};      ///< betas, eps, weight decay
  std::int64_t eval_every = 100;    ///< evaluate every N steps (and at the end); 0: only at the end
  std::int64_t eval_windows = 256;  ///< validation windows per evaluation (0: all)
  std::uint64_t seed = 1337;        ///< weights and data order
  std::int64_t ce_chunk = 256;      ///< LM-head/cross-entropy chunk (token rows)

  /// Micro-batches per step and rank: G / (B * dp). Throws config_error
  /// naming G, B and dp if it does not divide exactly or a value is < 1.
  std::int64_t accum_steps() const {
    TESSERA_THROW_IF(global_batch < 1, config_error, "global batch G=", global_batch, " must be >= 1");
    TESSERA_THROW_IF(micro_batch < 1, config_error, "micro-batch B=", micro_batch, " must be >= 1");
    TESSERA_THROW_IF(dp < 1, config_error, "dp=", dp, " must be >= 1");
    TESSERA_THROW_IF(global_batch % (micro_batch * dp) != 0, config_error, "global batch G=",
                     global_batch, " is not divisible by micro-batch B=", micro_batch, " x dp=", dp,
                     " (= ", micro_batch * dp, ")");
    return global_batch / (micro_batch * dp);
  }
  /// Throws config_error for any inconsistent value.
  void validate() const {
    accum_steps();
    TESSERA_THROW_IF(steps < 1, config_error, "steps=", steps, " must be >= 1");
    TESSERA_THROW_IF(seq < 1, config_error, "sequence length T=", seq, " must be >= 1");
    TESSERA_THROW_IF(!(lr > 0), config_error, "lr=", lr, " must be > 0");
    TESSERA_THROW_IF(warmup < 0, config_error, "warmup=", warmup, " must be >= 0");
    TESSERA_THROW_IF(eval_every < 0, config_error, "eval_every=", eval_every, " must be >= 0");
    TESSERA_THROW_IF(ce_chunk < 1, config_error, "ce_chunk=", ce_chunk, " must be >= 1");
    TESSERA_THROW_IF(!(min_lr_ratio >= 0 && min_lr_ratio <= 1), config_error, "min_lr_ratio=",
                     min_lr_ratio, " must be in [0, 1]");
    TESSERA_THROW_IF(warmup >= steps && steps > 1, config_error, "warmup=", warmup,
                     " must be below steps=", steps);
    adamw.validate();
    schedule().validate();
  }
  optim::warmup_cosine schedule() const { return {lr, lr * min_lr_ratio, warmup, steps}; }
};

/// Model FLOPs per token of a training step (forward + backward) for `c` at
/// sequence length T: 6 N_matmul + 6 L H T, where N_matmul counts every
/// weight that enters a GEMM (blocks and LM head, not the embedding lookup)
/// and 6 L H T is causal attention (QK^T and PV, forward 2x2 L H T / 2,
/// backward twice that), counted once (PaLM, Chowdhery et al. 2022, App. B,
/// with the causal half). Seeds 003/004: F_train ~ 6ND.
inline double flops_per_token(const nn::llama_config& c, std::int64_t T) {
  const double H = static_cast<double>(c.dim), F = static_cast<double>(c.ffn_dim);
  const double KV = static_cast<double>(c.kv_dim()), L = static_cast<double>(c.n_layers);
  const double n_matmul = L * (2 * H * H + 2 * KV * H + 3 * H * F) + static_cast<double>(c.vocab) * H;
  return 6.0 * n_matmul + 6.0 * L * H * static_cast<double>(T);
}

/// Draws one token from softmax(logits / temperature) over V entries with one
/// uniform draw of `r` (inverse CDF in index order, float64 arithmetic), so
/// every rank with the same rng state picks the same token. `p` is scratch of
/// V doubles. Precondition: temperature > 0.
inline std::int32_t sample_token(const float* logits, std::int64_t V, double temperature, rng& r,
                                 std::vector<double>& p) {
  p.resize(static_cast<std::size_t>(V));
  double mx = -1e300, z = 0;
  for (std::int64_t v = 0; v < V; ++v) mx = std::max(mx, static_cast<double>(logits[v]));
  for (std::int64_t v = 0; v < V; ++v) z += p[v] = std::exp((logits[v] - mx) / temperature);
  double u = r.uniform() * z, c = 0;
  for (std::int64_t v = 0; v < V; ++v) {
    c += p[v];
    if (u < c) return static_cast<std::int32_t>(v);
  }
  return static_cast<std::int32_t>(V - 1);
}

/// The model's sizes as checkpoint metadata.
inline nlohmann::json model_metadata(const nn::llama_config& c) {
  return {{"name", c.name},         {"dim", c.dim},         {"n_layers", c.n_layers},
          {"n_heads", c.n_heads},   {"n_kv_heads", c.n_kv_heads}, {"ffn_dim", c.ffn_dim},
          {"vocab", c.vocab},       {"max_seq", c.max_seq}, {"rope_theta", c.rope_theta},
          {"norm_eps", c.norm_eps}};
}

/// Samples `n` tokens after `prompt` (token ids) from the full softmax at
/// `temperature`, deterministic in `seed`: each step asks
/// `next_logits(ids, len, logits)` for the V logits after the last
/// min(ctx, prompt length) tokens and draws with sample_token. Every
/// trainer's generate() is this loop over its own model. Throws config_error
/// for an empty prompt or a temperature that is not > 0.
template <class NextLogits>
std::vector<std::int32_t> generate_tokens(std::vector<std::int32_t> prompt, std::int64_t n,
                                          double temperature, std::uint64_t seed, std::int64_t V,
                                          std::int64_t ctx, NextLogits&& next_logits) {
  TESSERA_THROW_IF(prompt.empty(), config_error, "generation needs a non-empty prompt");
  TESSERA_THROW_IF(!(temperature > 0), config_error, "temperature=", temperature, " must be > 0");
  std::vector<float> logits(static_cast<std::size_t>(V));
  std::vector<double> p;
  rng r(seed);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t len = std::min<std::int64_t>(ctx, static_cast<std::int64_t>(prompt.size()));
    next_logits(prompt.data() + prompt.size() - len, len, logits.data());
    prompt.push_back(sample_token(logits.data(), V, temperature, r, p));
  }
  return prompt;
}

/// The checkpoint metadata of a single-rank run (train::trainer and
/// train::cuda_trainer write the same, so their checkpoints move between
/// backends): the model, precision and optimizer names, the step and data
/// position, every setting a resume must match, and the corpus fingerprint.
inline nlohmann::json run_metadata(const nn::llama_config& c, const train_config& cfg,
                                   const char* precision, const char* optimizer, std::int64_t step,
                                   std::int64_t flat_elements, const data::token_file& data) {
  return {{"model", model_metadata(c)},
          {"precision", precision},
          {"optimizer", optimizer},
          {"step", step},
          {"data_position", {{"step", step}, {"sampler", "window_start(seed, step, g)"}}},
          {"schedule_position", step},
          {"rng", {{"seed", cfg.seed}, {"generator", "mix64 counter (stateless)"}}},
          {"schedule", {{"name", "warmup_cosine"}, {"min_lr_ratio", cfg.min_lr_ratio}}},
          {"adamw", {{"beta1", cfg.adamw.beta1}, {"beta2", cfg.adamw.beta2},
                     {"eps", cfg.adamw.eps}, {"weight_decay", cfg.adamw.weight_decay}}},
          {"grad_clip", cfg.grad_clip},
          {"ce_chunk", cfg.ce_chunk},
          {"global_batch", cfg.global_batch},
          {"micro_batch", cfg.micro_batch},
          {"seq", cfg.seq},
          {"seed", cfg.seed},
          {"steps", cfg.steps},
          {"lr", cfg.lr},
          {"warmup", cfg.warmup},
          {"flat_elements", flat_elements},
          {"data", {{"tokens", data.size()}, {"vocab", data.vocab()},
                    {"fingerprint", data::fingerprint(data)}}}};
}

/// What a single-rank trainer (train::trainer, train::cuda_trainer) refuses
/// before it allocates: an invalid model or train config, dp != 1, a
/// sequence longer than max_seq, a corpus whose vocabulary exceeds the
/// model's. Throws config_error naming the value and the limit.
inline void check_single_rank(const nn::llama_config& c, const train_config& cfg,
                              const data::token_file& d) {
  c.validate();
  cfg.validate();
  TESSERA_THROW_IF(cfg.dp != 1, config_error, "dp=", cfg.dp,
                   " needs a communicator; a single-rank trainer runs dp=1");
  TESSERA_THROW_IF(cfg.seq > c.max_seq, config_error, "sequence length T=", cfg.seq,
                   " exceeds the model's max_seq=", c.max_seq, " (preset '", c.name, "')");
  TESSERA_THROW_IF(d.vocab() > static_cast<std::uint64_t>(c.vocab), config_error,
                   "token file vocabulary ", d.vocab(), " exceeds the model's vocab=", c.vocab);
}

/// Checks a checkpoint's metadata against this run's before a resume: every
/// key of `mine` except the positions (step, data_position,
/// schedule_position) must be present and equal. Throws config_error naming
/// the field and both values, and io_error if the step is not an integer in
/// [0, steps]. Returns the checkpoint's step.
inline std::int64_t check_resume_metadata(const std::filesystem::path& path, nlohmann::json& meta,
                                          const nlohmann::json& mine, std::int64_t steps) {
  for (const auto& [k, v] : mine.items()) {
    if (k == "step" || k == "data_position" || k == "schedule_position") continue;
    TESSERA_THROW_IF(!meta.contains(k) || meta[k] != v, config_error, "checkpoint '",
                     path.string(), "' has ", k, "=", meta.contains(k) ? meta[k].dump() : "(missing)",
                     " but this run has ", k, "=", v.dump());
  }
  TESSERA_THROW_IF(!meta.contains("step") || !meta["step"].is_number_integer() ||
                       meta["step"].get<std::int64_t>() < 0 ||
                       meta["step"].get<std::int64_t>() > steps,
                   io_error, "checkpoint '", path.string(), "' has step ",
                   meta.contains("step") ? meta["step"].dump() : "(missing)", ", not in [0, steps=",
                   steps, "]");
  return meta["step"].get<std::int64_t>();
}

/// Single-rank trainer composed from a precision policy. The optimizer is
/// AdamW over the flat buffer with `master_type` state.
template <precision::policy P>
class trainer {
public:
  using model_type = nn::llama<P>;
  using Param = typename P::param_type;
  using Grad = typename P::grad_type;
  using Master = typename P::master_type;
  using optimizer_type = optim::adamw<Param, Grad, Master>;

  /// Builds the model (weights from cfg.seed), the optimizer state (now, so
  /// the memory floor is visible before step 0) and the samplers. Throws
  /// config_error for an invalid config or a corpus smaller than one window,
  /// naming the values.
  trainer(nn::llama_config model_cfg, train_config cfg, const data::token_file& data,
          memory_resource& mr = host::default_resource())
      : cfg_(cfg),
        mr_(&mr),
        model_(validated(model_cfg, cfg, data), nn::llama_options{cfg.ce_chunk, {}, -100}, mr),
        opt_(cfg.adamw, 0, model_.layout().total(), model_.layout().ranges(), mr),
        data_(&data),
        split_(data.split()),
        sampler_(data, split_.train, cfg.micro_batch, cfg.seq, cfg.seed),
        val_(data, split_.val, cfg.seq, cfg.eval_windows),
        sched_(cfg.schedule()) {
    model_.init_weights(cfg_.seed);
    opt_.init_master(model_.params());
    tokens_ = tensor<std::int32_t>(
        shape{cfg_.accum_steps(), cfg_.micro_batch, cfg_.seq + 1}, mr);
  }

  model_type& model() { return model_; }
  optimizer_type& optimizer() { return opt_; }
  const train_config& config() const { return cfg_; }
  /// Optimizer steps taken so far (the data position: step s reads the windows of step s).
  std::int64_t step() const { return step_; }
  /// Peak FLOP/s used for MFU (set it to the measured sgemm rate).
  void set_peak_flops(double f) { peak_flops_ = f; }

  /// One optimizer step over A = G / B micro-batches. Non-finite gradient
  /// norm: the update is skipped and reported (metrics.skipped).
  step_metrics train_step() {
    const auto t0 = std::chrono::steady_clock::now();
    mr_->reset_peak();
    const std::int64_t A = cfg_.accum_steps(), B = cfg_.micro_batch, T = cfg_.seq;
    step_metrics m;
    m.lr = sched_(step_);
    // Fill every micro-batch first: the loss is normalised by the scored
    // tokens of the whole step, which must be known before any backward.
    std::int64_t scored = 0;
    for (std::int64_t a = 0; a < A; ++a) {
      std::int32_t* tok = tokens_.data() + a * B * (T + 1);
      sampler_.fill(static_cast<std::uint64_t>(step_), static_cast<std::uint64_t>(a), tok);
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t t = 1; t <= T; ++t) scored += tok[b * (T + 1) + t] != ignore_index;
    }
    TESSERA_THROW_IF(scored == 0, config_error, "step ", step_,
                     " has no scored tokens (every target is ignore_index)");
    model_.zero_grad();
    double loss_sum = 0;
    const auto scale = static_cast<typename P::accum_type>(1.0 / static_cast<double>(scored));
    for (std::int64_t a = 0; a < A; ++a) {
      auto r = model_.forward_backward(tokens_.data() + a * B * (T + 1), B, T, scale);
      loss_sum += r.loss_sum;
    }
    m.loss = loss_sum / static_cast<double>(scored);
    m.grad_norm = std::sqrt(optim::grad_sum_squares(model_.grads(), model_.layout().total()));
    m.clip = optim::clip_coefficient(m.grad_norm, cfg_.grad_clip);
    if (std::isfinite(m.clip)) {
      opt_.step(model_.params(), model_.grads(), m.lr, m.clip);
    } else {
      m.skipped = true;
    }
    ++step_;
    m.step = step_;
    m.tokens = A * B * T;
    m.scored = scored;
    m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    m.tokens_per_s = static_cast<double>(m.tokens) / m.seconds;
    m.flops = flops_per_token(model_.config(), T) * static_cast<double>(m.tokens);
    m.mfu = peak_flops_ > 0 ? m.flops / m.seconds / peak_flops_ : 0.0;
    const auto st = mr_->stats();
    m.mem_allocated = st.allocated;
    m.mem_peak = st.peak_allocated;
    return m;
  }

  /// Mean loss (nats per token) over the first `windows` fixed validation
  /// windows (-1: the configured eval_windows; 0: every window of the split,
  /// the whole held-out range).
  double evaluate(std::int64_t windows = -1) {
    const std::int64_t B = cfg_.micro_batch, T = cfg_.seq;
    const data::val_windows val = windows < 0 ? val_ : data::val_windows(*data_, split_.val, T, windows);
    std::vector<std::int32_t> buf(static_cast<std::size_t>(B * (T + 1)));
    double sum = 0;
    std::int64_t n = 0;
    for (std::int64_t k = 0; k < val.batches(B); ++k) {
      const std::int64_t rows = val.fill(k, B, buf.data());
      auto r = model_.forward_loss(buf.data(), rows, T);
      sum += r.loss_sum;
      n += r.scored;
    }
    return n ? sum / static_cast<double>(n) : std::nan("");
  }

  /// Samples `n` tokens after `prompt` (token ids) from the full softmax at
  /// `temperature`, deterministic in `seed`. The context is the last
  /// min(max_seq, seq) tokens. Throws config_error for an empty prompt or a
  /// temperature that is not > 0.
  std::vector<std::int32_t> generate(std::vector<std::int32_t> prompt, std::int64_t n,
                                     double temperature, std::uint64_t seed) {
    return generate_tokens(std::move(prompt), n, temperature, seed, model_.config().vocab,
                           std::min(model_.config().max_seq, cfg_.seq),
                           [&](const std::int32_t* ids, std::int64_t len, float* logits) {
                             model_.next_token_logits(ids, len, logits);
                           });
  }

  /// Writes model, master weights, optimizer state, step, schedule and data
  /// position to `path` (streamed to a temporary file, fsync'ed, renamed).
  /// Throws io_error if the file cannot be written.
  void save_checkpoint(const std::filesystem::path& path) const {
    const std::uint64_t pbytes = sizeof(Param) * static_cast<std::uint64_t>(model_.layout().total());
    write_checkpoint(path, metadata(), pbytes + opt_.serialized_bytes(), [&](checkpoint_writer& w) {
      w.write(model_.params(), pbytes);
      opt_.save(w);
    });
  }

  /// Restores what save_checkpoint wrote. The file is read and verified
  /// whole before any state changes. Throws io_error for a missing, foreign,
  /// truncated or corrupt file, and config_error if the checkpoint's model,
  /// precision, optimizer or schedule settings differ from this run's
  /// (naming the field and both values).
  void load_checkpoint(const std::filesystem::path& path) {
    nlohmann::json meta;
    std::vector<char> payload;
    read_checkpoint(path, meta, payload);
    const std::int64_t step = check_resume_metadata(path, meta, metadata(), cfg_.steps);
    const std::uint64_t pbytes = sizeof(Param) * static_cast<std::uint64_t>(model_.layout().total());
    TESSERA_THROW_IF(payload.size() != pbytes + opt_.serialized_bytes(), io_error, "checkpoint '",
                     path.string(), "' holds ", payload.size(), " payload bytes; this model needs ",
                     pbytes + opt_.serialized_bytes());
    std::memcpy(model_.params(), payload.data(), pbytes);
    opt_.load(payload.data() + pbytes);
    step_ = step;
  }

  static constexpr std::int32_t ignore_index = -100;

private:
  static nn::llama_config validated(nn::llama_config c, const train_config& cfg,
                                    const data::token_file& d) {
    check_single_rank(c, cfg, d);
    return c;
  }

  nlohmann::json metadata() const {
    return run_metadata(model_.config(), cfg_, P::name, optimizer_type::name, step_,
                        model_.layout().total(), *data_);
  }

  train_config cfg_;
  memory_resource* mr_;
  model_type model_;
  optimizer_type opt_;
  const data::token_file* data_;
  data::split_view split_;
  data::batch_sampler sampler_;
  data::val_windows val_;
  optim::warmup_cosine sched_;
  tensor<std::int32_t> tokens_;
  std::int64_t step_ = 0;
  double peak_flops_ = 0;
};

}  // namespace tessera::train
