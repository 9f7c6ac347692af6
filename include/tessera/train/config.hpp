#pragma once
/// \file train/config.hpp
/// The run-time settings of a training run (sizes are values, DESIGN.md
/// principle 3). What a run refuses before it allocates, with the model
/// and the layout: train/validate.hpp.

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "tessera/core/checked.hpp"
#include "tessera/core/error.hpp"
#include "tessera/nn/checkpointing.hpp"
#include "tessera/nn/context_parallel.hpp"
#include "tessera/nn/llama_config.hpp"
#include "tessera/optim/adafactor.hpp"
#include "tessera/optim/adamw.hpp"
#include "tessera/optim/lion.hpp"
#include "tessera/optim/muon.hpp"
#include "tessera/optim/schedule.hpp"
#include "tessera/optim/sgd.hpp"
#include "tessera/parallel/pipeline_schedule.hpp"
#include "tessera/precision/fp8_scaling.hpp"
#include "tessera/precision/loss_scaler.hpp"

namespace tessera::train {

/// Run-time settings of a training run.
struct train_config {
  std::int64_t steps = 1000;       ///< optimizer steps
  std::int64_t global_batch = 16;  ///< G, sequences per optimizer step (all ranks)
  std::int64_t micro_batch = 16;   ///< B, sequences per forward
  std::int64_t seq = 128;          ///< T, tokens per sequence
  std::int64_t dp = 1;             ///< data-parallel degree (the communicator's size)
  std::int64_t tp = 1;             ///< tensor-parallel degree (the layer family's group size)
  /// Sequence parallelism over the tp group (tp > 1, seq divisible by tp):
  /// the trainer sets the layer family's `sequence_parallel` from it.
  bool sequence_parallel = false;
  std::int64_t pp = 1;  ///< pipeline-parallel degree K (the pp group's size)
  /// Context-parallel degree (the cp group's size): each sequence's T
  /// tokens are split over cp ranks, head-tail (core/cp_shard.hpp; 2 cp
  /// must divide T), which read the same micro-batches; the weights are
  /// replicated over dp x cp.
  std::int64_t cp = 1;
  /// How attention runs over the cp group (nn/context_parallel.hpp): ring
  /// (any head counts) or ulysses (cp must divide the heads).
  nn::cp_kind cp_kind = nn::cp_kind::ring;
  /// The pipeline schedule (pp > 1): gpipe, 1f1b, interleaved or zb1.
  parallel::schedule_kind pipeline = parallel::schedule_kind::one_f_one_b;
  std::int64_t virtual_stages = 1;  ///< V, model chunks per pp rank (interleaved only)
  /// Blocks of each of the pp x V virtual stages in order; empty: balanced
  /// by FLOPs (parallel::partition_stages).
  std::vector<std::int64_t> stage_blocks{};
  double lr = 1e-3;                 ///< peak learning rate
  double min_lr_ratio = 0.1;        ///< final lr = lr * min_lr_ratio
  std::int64_t warmup = 50;         ///< warmup steps
  /// The decay after the warmup (optim/schedule.hpp): cosine (the default),
  /// wsd, linear, constant or inverse_sqrt, over `steps`.
  optim::lr_schedule_kind lr_schedule = optim::lr_schedule_kind::cosine;
  /// wsd's decay fraction and cooldown; the other schedules refuse settings
  /// other than the defaults.
  optim::wsd_options wsd{};
  double grad_clip = 1.0;           ///< max global gradient norm (<= 0: off)
  optim::adamw_config adamw{};      ///< AdamW's betas, eps, weight decay (optim::adamw)
  optim::sgd_config sgd{};          ///< SGD's momentum, Nesterov, weight decay (optim::sgd)
  optim::lion_config lion{};        ///< Lion's betas and weight decay (optim::lion)
  /// Adafactor's clipping, decay rate, first moment, eps, weight decay
  /// (optim::adafactor; the lr is the schedule's unless relative_step).
  optim::adafactor_config adafactor{};
  /// Muon's momentum, Nesterov, iteration, update scale, weight decay and
  /// the AdamW part's lr ratio and betas (optim::muon; the schedule's lr
  /// is the matrices').
  optim::muon_config muon{};
  /// The loss scale of a loss-scaled precision (precision::fp16_mixed):
  /// dynamic from 2^16 by default (precision/loss_scaler.hpp). Other
  /// policies train unscaled and refuse settings other than the defaults.
  precision::loss_scale_options loss_scale{};
  /// The FP8 recipe of an FP8 precision (precision::fp8_mixed): delayed
  /// scaling, hybrid formats, an amax history of 1024 by default
  /// (precision/fp8_scaling.hpp). Other policies refuse settings other
  /// than the defaults.
  precision::fp8_recipe fp8{};
  std::int64_t eval_every = 100;    ///< evaluate every N steps (and at the end); 0: only at the end
  std::int64_t eval_windows = 256;  ///< validation windows per evaluation (0: all)
  std::uint64_t seed = 1337;        ///< weights and data order
  std::int64_t ce_chunk = 256;      ///< LM-head/cross-entropy chunk (token rows)
  /// Packed documents: the separator token id (the tokenizer's EOS, or
  /// another the user names) that ends each document of the token stream.
  /// When set, every training window's tokens attend only within their
  /// document and RoPE counts positions from each document's first token
  /// (data/documents.hpp: the separator belongs to the document it ends);
  /// the loss is unchanged. Unset (the default): windows attend across
  /// documents, as before. Recorded in checkpoints: a resume under another
  /// setting is refused.
  std::optional<std::int32_t> document_separator{};
  nn::checkpoint_policy checkpointing{};  ///< activation checkpointing (none by default)
  /// A Hugging Face Llama folder (config.json, safetensors; nn::hf_checkpoint)
  /// whose weights the model starts from instead of drawing them from
  /// `seed`; empty: drawn. The model config must equal the folder's
  /// (nn::llama_config_from_hf). Not part of a checkpoint's settings: a
  /// resume loads its own weights.
  std::string init_from_hf{};

  /// Micro-batches per step and rank: G / (B * dp). Throws config_error
  /// naming G, B and dp if it does not divide exactly or a value is < 1.
  std::int64_t accum_steps() const {
    TESSERA_THROW_IF(global_batch < 1, config_error, "global batch G=", global_batch,
                     " must be >= 1");
    TESSERA_THROW_IF(micro_batch < 1, config_error, "micro-batch B=", micro_batch, " must be >= 1");
    TESSERA_THROW_IF(dp < 1, config_error, "dp=", dp, " must be >= 1");
    const std::int64_t per_step = checked_mul(micro_batch, dp, "micro-batch B x dp");
    TESSERA_THROW_IF(global_batch % per_step != 0, config_error, "global batch G=", global_batch,
                     " is not divisible by micro-batch B=", micro_batch, " x dp=", dp,
                     " (= ", per_step, ")");
    return global_batch / (micro_batch * dp);
  }
  /// Throws config_error for any inconsistent value.
  void validate() const {
    accum_steps();
    TESSERA_THROW_IF(steps < 1, config_error, "steps=", steps, " must be >= 1");
    TESSERA_THROW_IF(seq < 1, config_error, "sequence length T=", seq, " must be >= 1");
    // Token counts of a step and of the whole run fit 64 bits.
    (void)checked_mul(
        checked_mul(global_batch, checked_add(seq, 1, "T+1"), "the tokens of a step, G x (T+1)"),
        steps, "the tokens of the run, G x (T+1) x steps");
    TESSERA_THROW_IF(!(lr > 0), config_error, "lr=", lr, " must be > 0");
    TESSERA_THROW_IF(warmup < 0, config_error, "warmup=", warmup, " must be >= 0");
    TESSERA_THROW_IF(eval_every < 0, config_error, "eval_every=", eval_every, " must be >= 0");
    TESSERA_THROW_IF(ce_chunk < 1, config_error, "ce_chunk=", ce_chunk, " must be >= 1");
    TESSERA_THROW_IF(document_separator && *document_separator < 0, config_error,
                     "document separator id ", *document_separator, " must be >= 0");
    TESSERA_THROW_IF(!(min_lr_ratio >= 0 && min_lr_ratio <= 1), config_error,
                     "min_lr_ratio=", min_lr_ratio, " must be in [0, 1]");
    TESSERA_THROW_IF(warmup >= steps && steps > 1, config_error, "warmup=", warmup,
                     " must be below steps=", steps);
    adamw.validate();
    sgd.validate();
    lion.validate();
    adafactor.validate();
    muon.validate();
    checkpointing.validate();
    loss_scale.validate();
    fp8.validate();
    schedule().validate();
  }
  /// The learning-rate schedule of the run: `lr_schedule` from `lr` (after
  /// `warmup` steps) to lr x min_lr_ratio at `steps`.
  optim::lr_schedule schedule() const {
    return {lr_schedule, lr, lr * min_lr_ratio, warmup, steps, wsd};
  }

  /// The hyper-parameters of optimizer policy O: a policy's own
  /// `static typename O::config config_from(const train_config&)` when it
  /// has one (an optimizer of the user's), else `adamw`, `sgd`, `lion`,
  /// `adafactor` or `muon` for those policies' configs. Another policy without config_from fails
  /// to compile with a message saying so.
  template <class O>
  typename O::config optimizer_config() const {
    if constexpr (requires(const train_config& c) {
                    { O::config_from(c) } -> std::convertible_to<typename O::config>;
                  })
      return O::config_from(*this);
    else if constexpr (std::is_same_v<typename O::config, optim::adamw_config>)
      return adamw;
    else if constexpr (std::is_same_v<typename O::config, optim::lion_config>)
      return lion;
    else if constexpr (std::is_same_v<typename O::config, optim::adafactor_config>)
      return adafactor;
    else if constexpr (std::is_same_v<typename O::config, optim::muon_config>)
      return muon;
    else {
      static_assert(std::is_same_v<typename O::config, optim::sgd_config>,
                    "train_config holds the configs of optim::adamw, optim::sgd, optim::lion, "
                    "optim::adafactor and optim::muon; "
                    "another optimizer policy gives its own: static typename O::config "
                    "config_from(const tessera::train::train_config&)");
      return sgd;
    }
  }
};

}  // namespace tessera::train
