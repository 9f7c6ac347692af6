#pragma once
/// \file train/job.hpp
/// A training job as values (torchtitan's JobConfig, Megatron-Core's
/// arguments): every setting of train_llama's command line, the checks that
/// need nothing but the settings, and the model and run configurations they
/// give. A program fills a `job` (from its own command line, a file, or in
/// code), checks it (check_job), prepares its folders and data
/// (train/job_data.hpp) and runs it (train/run_job.hpp: the names become the
/// trainer's types once, for both backends, and train::fit runs on every
/// rank). Errors name the option as the command line spells it ("--zero 4
/// is not a ZeRO stage").

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <new>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/comm/communicator.hpp"
#include "tessera/comm/launch.hpp"
#include "tessera/core/error.hpp"
#include "tessera/data/tokenizer.hpp"
#include "tessera/nn/checkpointing.hpp"
#include "tessera/nn/hf_llama.hpp"
#include "tessera/nn/llama_config.hpp"
#include "tessera/nn/llama_layout.hpp"
#include "tessera/parallel/pipeline_schedule.hpp"
#include "tessera/parallel/zero.hpp"
#include "tessera/train/config.hpp"

namespace tessera::train {

/// The settings of one training job, named as train_llama's options
/// ("--zero" is `zero`). Strings hold names (checked by check_job);
/// `cfg` holds the trainer's numbers (steps, batch sizes, lr, ...).
struct job {
  std::string program = "train_llama";  ///< names the error lines
  std::string backend = "host";         ///< host or cuda
  std::string
      precision;  ///< fp32, bf16(_mixed), bf16_mixed_bf16_grads, fp16(_mixed), fp8(_mixed), fp64; empty: the backend's
  /// fp16: a static loss scale (--loss-scale); unset: the dynamic scale of
  /// cfg.loss_scale (--initial-loss-scale, --min-loss-scale,
  /// --loss-scale-window, --hysteresis).
  std::optional<double> static_loss_scale;
  /// fp8: the recipe's scaling and formats (--fp8-scaling delayed|current,
  /// --fp8-format hybrid|e4m3), parsed into cfg.fp8 by check_job;
  /// --fp8-amax-history and --fp8-margin set cfg.fp8 directly.
  std::string fp8_scaling = "delayed", fp8_format = "hybrid";
  std::string optimizer = "adamw";  ///< adamw, sgd, lion, adafactor or muon
  /// Muon's update scale (--muon-adjust-lr original|match_rms_adamw) and
  /// its AdamW tensors' peak lr (--muon-adamw-lr; 0: --lr), which check_job
  /// turns into cfg.muon.adjust and adamw_lr_ratio; --muon-momentum,
  /// --muon-nesterov and --muon-ns-steps set cfg.muon directly.
  std::string muon_adjust = "original";
  double muon_adamw_lr = 0;
  /// The lr schedule (--lr-schedule cosine|wsd|linear|constant|inverse_sqrt)
  /// and wsd's cooldown (--wsd-cooldown linear|sqrt); --wsd-decay-fraction
  /// sets cfg.wsd.decay_fraction directly. run_config parses them.
  std::string lr_schedule = "cosine", wsd_cooldown = "linear";
  std::string checkpointing;        ///< none or full; empty: the backend's
  std::string preset = "small";     ///< nn::llama_config::from_name
  std::string data, data_format = "auto", out = "runs/main", resume, tokenizer, prompt = "The ";
  std::string cp_kind = "ring";  ///< --cp-kind: how attention runs over the cp group
  std::string schedule = "1f1b", trace, comm = "auto", init_from_hf, export_hf, hf_dtype;
  std::string grad_reduce = "step";  ///< when gradient buckets reduce: step or micro-batch
  train_config cfg;                  ///< steps, batch, lr, pp, ... (train/config.hpp)
  std::int64_t checkpoint_layers = 1, checkpoint_every = 200, sample_bytes = 300, trace_step = 0;
  std::optional<std::int64_t> dim, layers, heads, kv_heads, ffn, vocab;  ///< preset overrides
  /// --tie-embeddings (or --tie-embeddings=false), when given: the preset's
  /// embedding and LM head tied (untied); llama3_2_1b and 3b are tied already.
  bool tie_embeddings = false;
  /// --document-mask: packed documents attend only within themselves, with
  /// positions from each document's start (train_config::document_separator);
  /// --document-separator ID names the separator (default: the byte
  /// tokenizer's end-of-text for byte-level data; a tokenizer's EOS must be
  /// named).
  bool document_mask = false;
  std::optional<std::int64_t> document_separator;
  std::optional<double> baseline;  ///< nats per byte printed beside val loss
  bool no_baseline = false, sample_only = false;
  int dp = 1, tp = 1, zero = 0;
  int keep = 0;               ///< keep the newest N checkpoint folders (0: all)
  /// A fresh run into an --out that holds a checkpoint: replace it
  /// (overwrite) or resume it (auto_resume, set by the command line's
  /// --auto-resume before the settings are read); neither: refused.
  bool overwrite = false, auto_resume = false;
  bool async_save = false;  ///< checkpoints written in the background (run_options::async_checkpoints)
  double peak_tflops = 0;     ///< one rank's peak for MFU (0: measured or the datasheet's)
  double bucket_mb = 25;      ///< gradient bucket size, MB
  double comm_timeout = 300;  ///< seconds a collective may wait
  /// The options set explicitly (on a command line or in a --config file),
  /// as spelt there ("--zero"): some checks and defaults depend on them.
  std::set<std::string, std::less<>> given;

  // Set by check_job, bind_data and the command line, not by the user:
  bool parallel = false;                 ///< runs over a communicator (dp, tp, pp, --comm)
  std::uint64_t data_vocab = 0;          ///< the token file's vocabulary (bind_data)
  std::vector<std::int32_t> prompt_ids;  ///< with a tokenizer: the prompt's ids (bind_data)
  double val_bytes_per_token = 0;        ///< with a tokenizer: the validation split's (bind_data)
  std::string config_toml;               ///< the settings as given: OUT/run.toml
  nlohmann::json config_json;            ///< all of them: metrics.jsonl's first line
  std::int64_t planned_steps = 0;        ///< --resume: the steps the checkpoint's run planned

  /// True when option `flag` ("--zero") was set explicitly.
  [[nodiscard]] bool was_given(std::string_view flag) const { return given.count(flag) > 0; }
  /// The world size dp x cp x tp x pp.
  [[nodiscard]] int world_size() const {
    return dp * static_cast<int>(cfg.cp) * tp * static_cast<int>(cfg.pp);
  }
};

/// The model's sizes: the config.json of --init-from-hf, or the preset with
/// the --dim/--layers/... and --tie-embeddings overrides; the vocabulary follows the data
/// (job::data_vocab, once bound) unless --vocab sets it. Throws
/// config_error for an unknown preset or an unreadable config.json.
inline nn::llama_config model_config(const job& j) {
  if (!j.init_from_hf.empty()) return nn::llama_config_from_hf_folder(j.init_from_hf);
  nn::llama_config mc = nn::llama_config::from_name(j.preset);
  if (j.dim) mc.dim = *j.dim;
  if (j.layers) mc.n_layers = *j.layers;
  if (j.heads) mc.n_heads = *j.heads;
  if (j.kv_heads) mc.n_kv_heads = *j.kv_heads;
  if (j.ffn) mc.ffn_dim = *j.ffn;
  if (j.was_given("--tie-embeddings")) mc.tie_word_embeddings = j.tie_embeddings;
  if (j.vocab)
    mc.vocab = *j.vocab;
  else if (j.data_vocab > 0)
    mc.vocab = static_cast<std::int64_t>(j.data_vocab);
  return mc;
}

/// The separator id of --document-mask: --document-separator, or for
/// byte-level data (no tokenizer, a vocabulary of 256 or not yet bound) the
/// byte tokenizer's end-of-text (data::byte_tokenizer::eot, 3). Throws
/// config_error for an id outside [0, 2^31) or data with a tokenizer and no
/// --document-separator (tessera does not read a tokenizer's EOS).
inline std::int32_t document_separator_of(const job& j) {
  if (j.document_separator) {
    TESSERA_THROW_IF(*j.document_separator < 0 || *j.document_separator > 2147483647, config_error,
                     "--document-separator ", *j.document_separator,
                     " must be a token id in [0, 2^31)");
    return static_cast<std::int32_t>(*j.document_separator);
  }
  TESSERA_THROW_IF(!j.tokenizer.empty() ||
                       (j.data_vocab != 0 && j.data_vocab != data::byte_tokenizer::vocab_size),
                   config_error, j.program,
                   ": --document-mask needs --document-separator ID (the id of the tokenizer's "
                   "EOS) for data that is not byte-level");
  return static_cast<std::int32_t>(data::byte_tokenizer::eot);
}

/// The trainer's train_config: the job's, with the degrees, the pipeline
/// and learning-rate schedules, the activation checkpointing and the
/// document mask. Throws config_error for an unknown name, and as
/// document_separator_of.
inline train_config run_config(const job& j) {
  train_config c = j.cfg;
  c.dp = j.dp;
  c.tp = j.tp;
  c.cp_kind = nn::parse_cp_kind(j.cp_kind);
  c.pipeline = parallel::parse_schedule_kind(j.schedule);
  c.lr_schedule = optim::parse_lr_schedule_kind(j.lr_schedule);
  c.wsd.cooldown = optim::parse_wsd_cooldown(j.wsd_cooldown);
  c.checkpointing = {nn::parse_checkpointing(j.checkpointing), j.checkpoint_layers};
  if (j.resume.empty()) c.init_from_hf = j.init_from_hf;  // a resume loads its own weights
  if (j.document_mask) c.document_separator = document_separator_of(j);
  return c;
}

/// The data-parallel engine's options: --bucket-mb and --grad-reduce.
inline parallel::data_parallel_options data_parallel_options_of(const job& j) {
  parallel::data_parallel_options d;
  d.bucket_bytes = static_cast<std::int64_t>(j.bucket_mb * 1e6);
  d.reduction = parallel::parse_grad_reduction(j.grad_reduce);
  return d;
}

/// The communicators' options: --comm-timeout.
inline comm::comm_options comm_options_of(const job& j) {
  comm::comm_options c;
  c.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(j.comm_timeout * 1000));
  return c;
}

/// Checks the settings that need nothing but the settings (the model, the
/// run and the layout against the data are train::validate's, later), and
/// fills in what follows from them: the backend's default precision and
/// activation checkpointing, --comm auto, SGD's, Lion's and Adafactor's
/// weight decay, `parallel`.
/// Reads --init-from-hf's config.json and tensor list. Throws config_error
/// naming the option, its value and the limit.
inline void check_job(job& j) {
  const auto given = [&](std::string_view f) { return j.was_given(f); };
  for (const auto& [f, v] : {std::pair<const char*, const std::string*>{"--out", &j.out},
                             {"--resume", &j.resume},
                             {"--export-hf", &j.export_hf},
                             {"--trace", &j.trace},
                             {"--tokenizer", &j.tokenizer},
                             {"--data", &j.data}}) {
    const std::string_view name = f;
    TESSERA_THROW_IF(
        given(name) && v->empty(), config_error, f, " is empty: name a ",
        name == "--out" || name == "--resume" || name == "--export-hf" ? "folder" : "file");
  }
  auto& c = j.cfg;
  TESSERA_THROW_IF(!(c.lr > 0 && c.lr <= 1), config_error, "lr=", c.lr, " must be in (0, 1]");
  TESSERA_THROW_IF(j.sample_bytes > 0 && j.prompt.empty(), config_error,
                   "--prompt is empty; generation needs at least one byte of prompt");
  TESSERA_THROW_IF(!(c.grad_clip >= 0), config_error, "--grad-clip ", c.grad_clip,
                   " must be >= 0 (0: off)");
  TESSERA_THROW_IF(j.baseline && !(*j.baseline > 0), config_error, "--baseline ", *j.baseline,
                   " must be > 0 (a loss in nats per byte)");
  TESSERA_THROW_IF(j.dp < 1 || j.dp > 1024, config_error, "dp=", j.dp, " must be in [1, 1024]");
  TESSERA_THROW_IF(j.zero < 0 || j.zero > 3, config_error, "--zero ", j.zero,
                   " is not a ZeRO stage (valid: 0, 1, 2, 3)");
  TESSERA_THROW_IF(j.backend != "host" && j.backend != "cuda", config_error, "unknown backend '",
                   j.backend, "' (valid: host, cuda)");
  const bool gpu = j.backend == "cuda";
  if (j.precision.empty()) j.precision = gpu ? "bf16_mixed_bf16_grads" : "fp32";
  if (j.checkpointing.empty()) j.checkpointing = gpu ? "full" : "none";
  TESSERA_THROW_IF(j.precision != "fp32" && j.precision != "bf16" && j.precision != "bf16_mixed" &&
                       j.precision != "bf16_mixed_bf16_grads" && j.precision != "fp16" &&
                       j.precision != "fp16_mixed" && j.precision != "fp8" &&
                       j.precision != "fp8_mixed" && j.precision != "fp64",
                   config_error, "unknown precision '", j.precision,
                   "' (valid: fp32, bf16, bf16_mixed, bf16_mixed_bf16_grads, fp16, fp16_mixed, "
                   "fp8, fp8_mixed, fp64)");
  const bool fp16 = j.precision == "fp16" || j.precision == "fp16_mixed";
  for (const char* f : {"--loss-scale", "--initial-loss-scale", "--min-loss-scale",
                        "--loss-scale-window", "--hysteresis"})
    TESSERA_THROW_IF(given(f) && !fp16, config_error, f, " sets fp16's loss scale: it needs "
                     "--precision fp16 (--precision ", j.precision, " trains without one)");
  for (const char* f : {"--initial-loss-scale", "--min-loss-scale", "--loss-scale-window",
                        "--hysteresis"})
    TESSERA_THROW_IF(j.static_loss_scale && given(f), config_error, "--loss-scale ",
                     *j.static_loss_scale, " is a static scale, which ", f,
                     " does not move: give one");
  if (j.static_loss_scale) {
    c.loss_scale.dynamic = false;
    c.loss_scale.initial = *j.static_loss_scale;
    c.loss_scale.min_scale = std::min(1.0, *j.static_loss_scale);  // unused by a static scale
  }
  c.loss_scale.validate();
  const bool fp8 = j.precision == "fp8" || j.precision == "fp8_mixed";
  for (const char* f : {"--fp8-scaling", "--fp8-format", "--fp8-amax-history", "--fp8-margin"})
    TESSERA_THROW_IF(given(f) && !fp8, config_error, f, " sets the FP8 recipe: it needs "
                     "--precision fp8 (--precision ", j.precision, " has no FP8 GEMMs)");
  c.fp8.scaling = precision::parse_fp8_scaling(j.fp8_scaling);
  c.fp8.format = precision::parse_fp8_format(j.fp8_format);
  c.fp8.validate();
  TESSERA_THROW_IF(given("--document-separator") && !j.document_mask, config_error,
                   "--document-separator names the separator of packed documents: it needs "
                   "--document-mask");
  const auto schedule = optim::parse_lr_schedule_kind(j.lr_schedule);
  (void)optim::parse_wsd_cooldown(j.wsd_cooldown);
  for (const char* f : {"--wsd-decay-fraction", "--wsd-cooldown"})
    TESSERA_THROW_IF(given(f) && schedule != optim::lr_schedule_kind::wsd, config_error, f,
                     " shapes wsd's decay: it needs --lr-schedule wsd (--lr-schedule ",
                     j.lr_schedule, " has none)");
  TESSERA_THROW_IF(given("--min-lr-ratio") && (schedule == optim::lr_schedule_kind::constant ||
                                               schedule == optim::lr_schedule_kind::inverse_sqrt),
                   config_error,
                   "--min-lr-ratio sets the lr that cosine, linear and wsd decay to: --lr-schedule ",
                   j.lr_schedule, " never reaches it");
  TESSERA_THROW_IF(!(c.wsd.decay_fraction > 0 && c.wsd.decay_fraction <= 1), config_error,
                   "--wsd-decay-fraction ", c.wsd.decay_fraction, " must be in (0, 1]");
  TESSERA_THROW_IF(j.optimizer != "adamw" && j.optimizer != "sgd" && j.optimizer != "lion" &&
                       j.optimizer != "adafactor" && j.optimizer != "muon",
                   config_error, "unknown optimizer '", j.optimizer,
                   "' (valid: adamw, sgd, lion, adafactor, muon)");
  for (const char* f : {"--nesterov", "--momentum"})
    TESSERA_THROW_IF(given(f) && j.optimizer != "sgd", config_error, f,
                     " sets SGD's momentum: it needs --optimizer sgd");
  for (const char* f : {"--lion-beta1", "--lion-beta2"})
    TESSERA_THROW_IF(given(f) && j.optimizer != "lion", config_error, f,
                     " sets Lion's betas: it needs --optimizer lion");
  for (const char* f : {"--adafactor-beta1", "--adafactor-clip-threshold", "--adafactor-decay-rate",
                        "--adafactor-eps1", "--adafactor-eps2", "--adafactor-scale-parameter",
                        "--adafactor-relative-step", "--adafactor-warmup-init"})
    TESSERA_THROW_IF(given(f) && j.optimizer != "adafactor", config_error, f,
                     " sets Adafactor's update: it needs --optimizer adafactor");
  for (const char* f : {"--muon-momentum", "--muon-nesterov", "--muon-ns-steps", "--muon-adjust-lr",
                        "--muon-adamw-lr"})
    TESSERA_THROW_IF(given(f) && j.optimizer != "muon", config_error, f,
                     " sets Muon's update: it needs --optimizer muon");
  if (j.optimizer == "muon") {
    // Muon decays as AdamW does (torch.optim.Muon's default 0.1 is AdamW's here).
    c.muon.weight_decay = c.adamw.weight_decay;
    c.muon.adjust = optim::parse_muon_adjust(j.muon_adjust);
    TESSERA_THROW_IF(given("--muon-adamw-lr") && !(j.muon_adamw_lr > 0), config_error,
                     "--muon-adamw-lr ", j.muon_adamw_lr, " must be > 0");
    TESSERA_THROW_IF(given("--muon-adamw-lr") && !(c.lr > 0), config_error,
                     "--muon-adamw-lr needs --lr > 0 (it is scaled by the schedule as --lr is)");
    c.muon.adamw_lr_ratio = given("--muon-adamw-lr") ? j.muon_adamw_lr / c.lr : 1.0;
    c.muon.validate();
  }
  // --weight-decay is AdamW's field; SGD and Lion take it when given, else
  // their own default (0, as PyTorch's SGD and lion-pytorch).
  if (j.optimizer == "sgd") c.sgd.weight_decay = given("--weight-decay") ? c.adamw.weight_decay : 0;
  if (j.optimizer == "lion")
    c.lion.weight_decay = given("--weight-decay") ? c.adamw.weight_decay : 0;
  if (j.optimizer == "adafactor")
    c.adafactor.weight_decay = given("--weight-decay") ? c.adamw.weight_decay : 0;
  c.lion.validate();
  c.adafactor.validate();
  (void)nn::parse_checkpointing(j.checkpointing);
  TESSERA_THROW_IF(j.checkpoint_layers < 1 || j.checkpoint_layers > 1000000, config_error,
                   "--checkpoint-layers ", j.checkpoint_layers, " must be in [1, 1000000]");
  TESSERA_THROW_IF(!(j.bucket_mb > 0) || j.bucket_mb > 1e6, config_error, "--bucket-mb ",
                   j.bucket_mb, " must be in (0, 1e6]");
  (void)parallel::parse_grad_reduction(j.grad_reduce);
  TESSERA_THROW_IF(j.tp < 1 || j.tp > 64, config_error, "tp=", j.tp,
                   " must be in [1, 64] (one node's ranks)");
  TESSERA_THROW_IF(c.pp < 1 || c.pp > 256, config_error, "pp=", c.pp, " must be in [1, 256]");
  TESSERA_THROW_IF(c.virtual_stages < 1 || c.virtual_stages > 64, config_error, "--virtual-stages ",
                   c.virtual_stages, " must be in [1, 64]");
  (void)parallel::parse_schedule_kind(j.schedule);
  TESSERA_THROW_IF(given("--schedule") && c.pp == 1, config_error, "--schedule ", j.schedule,
                   " orders a pipeline's stages: it needs --pp > 1");
  TESSERA_THROW_IF(c.cp < 1 || c.cp > 64, config_error, "--cp ", c.cp, " must be in [1, 64]");
  (void)nn::parse_cp_kind(j.cp_kind);
  TESSERA_THROW_IF(given("--cp-kind") && c.cp == 1, config_error, "--cp-kind ", j.cp_kind,
                   " chooses how attention runs over the cp group: it needs --cp > 1");
  TESSERA_THROW_IF(c.cp > 1 && c.seq % (2 * c.cp) != 0, config_error, "--seq ", c.seq,
                   " is not divisible by 2 x --cp = ", 2 * c.cp,
                   " (each of the cp ranks holds two of 2 cp equal chunks of every sequence)");
  TESSERA_THROW_IF(j.dp * c.cp * j.tp * c.pp > 1024, config_error, "dp=", j.dp,
                   c.cp > 1 ? tessera::detail::str(" x cp=", c.cp) : std::string(), " x tp=", j.tp,
                   " x pp=", c.pp, " = ", j.dp * c.cp * j.tp * c.pp,
                   " ranks exceeds the limit of 1024");
  TESSERA_THROW_IF(c.sequence_parallel && c.cp > 1 && (c.seq / c.cp) % j.tp != 0, config_error,
                   "--sequence-parallel: a cp rank's --seq / --cp = ", c.seq / c.cp,
                   " tokens are not divisible by --tp ", j.tp);
  if (c.sequence_parallel) nn::check_sequence_parallel(c.seq / c.cp, j.tp);
  if (!j.init_from_hf.empty())
    for (const char* f : {"--preset", "--dim", "--layers", "--heads", "--kv-heads", "--ffn",
                          "--vocab", "--tie-embeddings"})
      TESSERA_THROW_IF(
          given(f), config_error, f,
          " cannot be given with --init-from-hf: the model's sizes are its config.json's");
  TESSERA_THROW_IF(!j.hf_dtype.empty() && j.export_hf.empty(), config_error, "--hf-dtype ",
                   j.hf_dtype, " needs --export-hf DIR");
  if (!j.hf_dtype.empty()) (void)nn::hf_safetensors_dtype(j.hf_dtype);
  if (j.comm == "auto") j.comm = comm::launched_by_mpi() ? (gpu ? "nccl" : "mpi") : "local";
  TESSERA_THROW_IF(j.comm != "local" && j.comm != "mpi" && j.comm != "nccl", config_error,
                   "--comm '", j.comm, "' is not one of local, mpi, nccl");
  TESSERA_THROW_IF(j.comm == "local" && comm::launched_world().size > 1, config_error,
                   "--comm local runs the ranks as threads of one process, but the launcher "
                   "started ",
                   comm::launched_world().size,
                   " processes (each would run the whole job into the same folder): use --comm "
                   "mpi (the default under mpirun), or start one process");
  TESSERA_THROW_IF(j.comm == "nccl" && !gpu, config_error,
                   "--comm nccl reduces GPU memory: it needs --backend cuda");
  TESSERA_THROW_IF(gpu && j.comm != "nccl" &&
                       (j.dp > 1 || c.cp > 1 || j.tp > 1 || c.pp > 1 || given("--comm")),
                   config_error, "--backend cuda --comm ", j.comm,
                   ": GPUs reduce over --comm nccl (one MPI process per GPU)");
  j.parallel = j.dp > 1 || c.cp > 1 || j.tp > 1 || c.pp > 1 || given("--zero") ||
               given("--comm") || j.comm != "local";
  TESSERA_THROW_IF(j.trace_step > 0 && j.trace.empty(), config_error, "--trace-step ", j.trace_step,
                   " needs --trace FILE");
  TESSERA_THROW_IF(j.trace_step > c.steps, config_error, "--trace-step ", j.trace_step,
                   " must be in [0, steps=", c.steps, "] (0: the last)");
  TESSERA_THROW_IF(j.auto_resume && given("--resume"), config_error,
                   "--auto-resume resumes --out when it holds a checkpoint: give it or --resume "
                   "DIR, not both");
  TESSERA_THROW_IF(j.overwrite && j.auto_resume, config_error,
                   "--overwrite replaces the checkpoints --auto-resume would resume: give one");
  {
    std::error_code ec;
    TESSERA_THROW_IF(j.overwrite && !j.resume.empty() &&
                         std::filesystem::weakly_canonical(j.resume, ec) ==
                             std::filesystem::weakly_canonical(j.out, ec),
                     config_error, "--overwrite replaces the checkpoints of --out '", j.out,
                     "', which --resume continues: give one");
  }
  TESSERA_THROW_IF(j.sample_only && j.resume.empty(), config_error,
                   "--sample-only samples from a checkpoint: it needs --resume DIR");
  TESSERA_THROW_IF(j.sample_only && j.sample_bytes == 0, config_error,
                   "--sample-only with --sample-bytes 0 has nothing to do");
  if (!j.init_from_hf.empty()) (void)nn::hf_checkpoint(j.init_from_hf);  // tensors vs config.json
  const nn::llama_config mc = model_config(j);  // the sizes, before any file is touched
  mc.validate();
  nn::check_tensor_parallel(mc, j.tp);
}

/// Prints "PROGRAM: WHAT: MSG" to stderr. A bad setting is refused alike on
/// every rank of an MPI launch (`same_on_every_rank`), so rank 0 alone
/// prints it; any other failure may be one rank's own, and each prints it.
inline void report_line(const job& j, const char* what, const std::string& msg,
                        bool same_on_every_rank) {
  if (!same_on_every_rank || comm::launched_world().rank == 0)
    std::fprintf(stderr, "%s: %s: %s\n", j.program.c_str(), what, msg.c_str());
}

/// What drove a failed allocation: the sizes of the model and of a
/// micro-batch, as options (empty when they cannot be computed).
inline std::string oom_sizes(const job& j) {
  try {
    const nn::llama_config mc = model_config(j);
    return tessera::detail::str(" (this run: ", mc.num_params(), " parameters of --dim ", mc.dim,
                                " --layers ", mc.n_layers, " --ffn ", mc.ffn_dim, " --vocab ",
                                mc.vocab, ", --micro-batch ", j.cfg.micro_batch, " x --seq ",
                                j.cfg.seq, ", --precision ", j.precision, " --zero ", j.zero,
                                " --checkpointing ", j.checkpointing,
                                "; examples/plan with the same flags lists the bytes)");
  } catch (const std::exception&) {
    return {};
  }
}

/// Reports the exception in flight (call inside a catch block) as one line
/// and returns the exit status: 2 for bad input (config_error, io_error)
/// and for memory that cannot be had (the sizes named), 1 for anything else.
inline int report_failure(const job& j) {
  try {
    throw;
  } catch (const config_error& e) {
    report_line(j, "error", e.what(), true);
    return 2;
  } catch (const io_error& e) {
    report_line(j, "error", e.what(), false);
    return 2;
  } catch (const out_of_memory& e) {
    report_line(j, "error", e.what() + oom_sizes(j), false);
    return 2;
  } catch (const std::bad_alloc&) {
    report_line(j, "error",
                "out of memory: a host allocation failed (std::bad_alloc)" + oom_sizes(j), false);
    return 2;
  } catch (const std::exception& e) {
    report_line(j, "failed", e.what(), false);
    return 1;
  }
}

}  // namespace tessera::train
