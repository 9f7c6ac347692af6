#pragma once
/// \file train/trainer.hpp
/// The trainer: `trainer<Precision, Backend, Optimizer, Sharding,
/// Communicator, Layers, Schedule>`, one rank of a training run composed
/// from compile-time policies and written once, on the layout of its
/// rank (parallel::layout: its dp, tp and pp groups), with sizes as values
/// (train_config). It composes parts, each in its own header:
///
///   train/validate.hpp      every check, before anything is allocated
///   train/model_chunks.hpp  this rank's model chunks and their engines
///   train/step.hpp          one optimizer step: sampler, loader, executor
///   train/inference.hpp     evaluation and generation (pipelined too)
///   train/checkpoint.hpp    checkpoints of the chunks
///   train/hf_export.hpp     the Hugging Face export
///   train/agree.hpp, train/trace.hpp   agreement across ranks, timelines
///
/// and the training loop over it is train::fit (train/fit.hpp).
///
///   trainer<precision::fp32> tr(model, cfg, data);                  one CPU rank
///   trainer<precision::bf16_mixed, host, optim::sgd> ...            SGD instead of AdamW
///   trainer<precision::fp32, host, optim::adamw, zero<2>, local_communicator>
///       tr(model, cfg, data, parallel::layout{dp});                 thread ranks
///   trainer<precision::fp32, host, optim::adamw, zero<1>, mpi_communicator,
///           tensor_parallel_layers<mpi_communicator>, parallel::one_f_one_b>
///       tr(model, cfg, data, parallel::layout{g.dp, {&g.tp}, g.pp});   3-D, 1F1B fixed
///
/// train_step(), evaluate(), generate(), save_checkpoint(), export_hf()
/// are collectives: every rank calls them in the same order and gets the
/// same global figures. The constructor and each of them set the calling
/// thread's OpenMP thread count to the context's `threads`
/// (kernels::host_context; 0 keeps it). Thread-safety: one trainer per
/// rank, used from that rank's thread.

#include <chrono>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/comm/communicator.hpp"
#include "tessera/comm/self.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/nvtx.hpp"
#include "tessera/data/sampler.hpp"
#include "tessera/data/token_file.hpp"
#include "tessera/kernels/context.hpp"
#include "tessera/nn/flops.hpp"
#include "tessera/nn/hf_llama.hpp"
#include "tessera/optim/adamw.hpp"
#include "tessera/optim/optimizer.hpp"
#include "tessera/optim/schedule.hpp"
#include "tessera/parallel/layout.hpp"
#include "tessera/parallel/pipeline_schedule.hpp"
#include "tessera/parallel/sharding.hpp"
#include "tessera/precision/policy.hpp"
#include "tessera/train/agree.hpp"
#include "tessera/train/checkpoint.hpp"
#include "tessera/train/checkpoint_async.hpp"
#include "tessera/train/checkpoint_folder.hpp"
#include "tessera/train/config.hpp"
#include "tessera/train/hf_export.hpp"
#include "tessera/train/inference.hpp"
#include "tessera/train/metadata.hpp"
#include "tessera/train/metrics.hpp"
#include "tessera/train/model_chunks.hpp"
#include "tessera/train/precision_state.hpp"
#include "tessera/train/step.hpp"
#include "tessera/train/trace.hpp"
#include "tessera/train/validate.hpp"

namespace tessera::train {

/// One rank of a training run (file comment). `P` precision policy,
/// `Backend` host or cuda, `O` optimizer policy, `S` sharding strategy,
/// `C` communicator of the dp and pp groups in the backend's memory, `L`
/// layer family (nn::dense_layers, or nn::tensor_parallel_layers<C> over
/// the tp group), `Schedule` pipeline schedule (a type of
/// parallel/pipeline_schedule.hpp, or any_schedule: cfg.pipeline). A type
/// that is not an optimizer policy, a sharding strategy, a communicator or
/// a schedule fails to compile with a message naming what it lacks.
// example-begin signature
template <precision::policy P,          // fp32, bf16_mixed(_bf16_grads), fp16_mixed, fp8_mixed, fp64
          class Backend = host,         // host or cuda
          class O = optim::adamw,       // optim::sgd, lion, adafactor, muon, or a policy of yours
          class S = parallel::zero<0>,  // zero<0..3>
          class C = comm::self_communicator<kernels::context_t<Backend>>,  // local, mpi, nccl
          class L = nn::dense_layers,               // or nn::tensor_parallel_layers<C>
          class Schedule = parallel::any_schedule>  // or gpipe, one_f_one_b, ...
class trainer {
  // example-end signature
  static_assert(optim::check_optimizer_policy<O>());
  static_assert(parallel::check_sharding_strategy<S>());
  static_assert(comm::check_communicator<C>());
  static_assert(parallel::pipeline_schedule<Schedule>,
                "trainer: Schedule is not a pipeline schedule (parallel::gpipe, one_f_one_b, "
                "interleaved_one_f_one_b, zero_bubble_h1, or any_schedule for a run-time choice)");

 public:
  using Ctx = kernels::context_t<Backend>;
  using layout_type = parallel::layout<C, L>;
  using chunks_type = model_chunks<P, Backend, O, S, C, L>;
  using model_type = typename chunks_type::model_type;
  using engine_type = typename chunks_type::engine_type;
  using optimizer_type = typename engine_type::optimizer_type;
  using executor_type = typename step_runner<chunks_type>::executor_type;
  static constexpr std::int32_t ignore_index = chunks_type::ignore_index;
  /// The policies' names, for logs and checkpoints.
  static constexpr const char* precision_name = P::name;
  static constexpr const char* optimizer_name = O::name;
  static constexpr const char* backend_name = Backend::name;

  /// One rank of a run on `mesh` (default: one rank), checked by
  /// train::validate before anything is allocated. Builds this rank's
  /// model chunks (weights from cfg.seed, or cfg.init_from_hf), their
  /// engines and optimizer state (now, so the memory floor is visible
  /// before step 0), the sampler and the loader (the first micro-batch
  /// prefetched) and the step's action list (`Schedule`; with a schedule
  /// type, cfg.pipeline is set to its kind). `dpo` sets the data-parallel
  /// engines (buckets, prefetch). `ctx`: the caller's context (its memory
  /// resource, threads, tiles or stream; not owned, must outlive the
  /// trainer), or nullptr for one of its own (kernels::owned_context; on a
  /// GPU on a stream of its own, which the tp and pp groups run on and the
  /// data-parallel engines make the dp group follow from its own stream,
  /// parallel/stream_order.hpp). `data` and the
  /// groups are not owned and must outlive the trainer. Every rank of the
  /// mesh constructs it with the same settings (agreed: a setting that
  /// differs between ranks is refused on every rank naming it). Throws
  /// config_error as train::validate, io_error for a Hugging Face folder
  /// that cannot be read, and what the backend throws when it runs out of
  /// memory (out_of_memory).
  // example-begin constructor
  trainer(nn::llama_config model_cfg, train_config cfg, const data::token_file& data,
          layout_type mesh = {}, parallel::data_parallel_options dpo = {}, const Ctx* ctx = nullptr)
      // example-end constructor
      : own_ctx_(ctx ? nullptr : make_context()),
        ctx_(ctx ? ctx : &own_ctx_->ctx),
        self_(mesh.dp_cp_group() ? std::nullopt : make_self(*ctx_)),
        dp_(mesh.dp_cp_group() ? mesh.dp_cp_group() : &*self_),
        mesh_(mesh),
        cfg_(with_schedule(cfg)),
        data_(&data),
        schedule_(make_schedule_policy(cfg_)),
        lr_schedule_(cfg_.schedule()) {
    ctx_->apply_threads();
    validate<S, P>(model_cfg, cfg_, data, mesh_, dpo);
    // A device pipeline group works on the context's stream, after the
    // kernels that wrote what it sends (as the model does with its tp group).
    // So does the dp group, which sums the gradient norm's squares
    // (layout::reduce) apart from the engines' dp x cp group.
    if constexpr (requires(C & c) { c.set_stream(ctx_->stream()); }) {
      if (mesh_.pp() > 1) mesh_.pp_group()->set_stream(ctx_->stream());
      if (mesh_.dp() > 1 && mesh_.dp_group() != dp_) mesh_.dp_group()->set_stream(ctx_->stream());
    }
    agree_start(model_cfg, dpo);
    chunks_ = std::make_unique<chunks_type>(model_cfg, cfg_, mesh_, *dp_, *ctx_, dpo,
                                            hf_ ? &hf_reader_ : nullptr);
    steps_ =
        std::make_unique<step_runner<chunks_type>>(*chunks_, mesh_, cfg_, data, schedule_, *ctx_);
    val_.emplace(data, data.split().val, cfg_.seq, cfg_.eval_windows);
  }
  trainer(const trainer&) = delete;
  trainer& operator=(const trainer&) = delete;

  /// The model (under a pipeline: this rank's chunk c, a stage of it).
  model_type& model(int c = 0) { return chunks_->model(c); }
  const model_type& model(int c = 0) const { return chunks_->model(c); }
  /// The data-parallel engine of chunk c, and its optimizer.
  engine_type& engine(int c = 0) { return chunks_->engine(c); }
  optimizer_type& optimizer(int c = 0) { return engine(c).optimizer(); }
  /// This rank's model chunks (1 unless interleaved), and the whole set.
  int chunks() const { return chunks_->size(); }
  chunks_type& all_chunks() { return *chunks_; }
  /// The pipeline stage of this rank (0 without a pipeline) and the degree.
  int pp_rank() const { return mesh_.stage(); }
  int pp_size() const { return mesh_.pp(); }
  /// Every virtual stage's blocks (parallel::partition_stages, computed once).
  const std::vector<nn::stage_range>& stages() const { return chunks_->stages(); }
  /// The schedule's action list of this rank for one step.
  const std::vector<parallel::action>& actions() const { return steps_->actions(); }
  /// The executor (its timeline when tracing is on).
  executor_type& executor() { return steps_->executor(); }
  /// The loss scaler of a loss-scaled precision (precision::fp16_mixed);
  /// null under the others.
  const precision::loss_scaler* loss_scaler() const { return steps_->scaler(); }
  const train_config& config() const { return cfg_; }
  const Ctx& context() const { return *ctx_; }
  /// This rank's layout (its groups).
  const layout_type& layout() const { return mesh_; }
  /// The group the weights are replicated over and the data-parallel
  /// engines reduce over: the dp group, or dp x cp under context
  /// parallelism (a one-rank communicator for one rank).
  C& communicator() { return *dp_; }
  /// This rank's index in that group.
  int rank() const { return dp_->rank(); }
  /// This rank's index in its tensor-parallel group (0 without one).
  int tp_rank() const { return mesh_.tp_rank(); }
  /// The tensor-parallel degree (1 without tensor parallelism).
  int tp_size() const { return mesh_.tp(); }
  /// This rank's world rank in the mesh (comm::device_mesh order).
  int world_rank() const { return mesh_.world_rank(); }
  /// Whether this rank holds the last virtual stage (the head: the losses).
  bool holds_head() const { return chunks_->holds_head(); }
  /// Optimizer steps taken so far (the data position: step s reads the windows of step s).
  std::int64_t step() const { return step_; }
  /// Peak FLOP/s of one rank, for MFU (kernels::peak_flops::flops; 0: no MFU).
  void set_peak_flops(double f) { peak_flops_ = f; }
  /// The sgemm rate one rank measured, for MFU "of BLAS peak" beside it (0: none).
  void set_blas_flops(double f) { blas_flops_ = f; }

  /// One optimizer step over A = G / (B dp) micro-batches on this rank
  /// (train/step.hpp; collective). Returns the global figures, the same on
  /// every rank: loss over every scored token of the global batch,
  /// gradient norm over all shards and ranks, tokens of the global batch,
  /// and this rank's time, MFU and memory. A non-finite gradient norm
  /// skips the update on every rank (metrics.skipped).
  step_metrics train_step() {
    TESSERA_NVTX_RANGE("train step");
    const auto t0 = std::chrono::steady_clock::now();
    comm::note_step(step_ + 1);  // for a rank stopped by its launcher (comm/mpi.hpp)
    ctx_->apply_threads();
    memory_resource& mr = ctx_->resource();
    mr.reset_peak();
    step_metrics m = steps_->run(step_, lr_schedule_(step_));
    ++step_;
    m.step = step_;
    m.tokens = cfg_.global_batch * cfg_.seq;
    m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    m.tokens_per_s = static_cast<double>(m.tokens) / m.seconds;
    m.flops = nn::flops_per_token(model().config(), cfg_.seq) * static_cast<double>(m.tokens);
    const double ranks = static_cast<double>(mesh_.world_size());
    m.mfu = peak_flops_ > 0 ? m.flops / m.seconds / (peak_flops_ * ranks) : 0.0;
    m.mfu_blas = blas_flops_ > 0 ? m.flops / m.seconds / (blas_flops_ * ranks) : 0.0;
    const auto st = mr.stats();
    m.mem_allocated = st.allocated;
    m.mem_peak = st.peak_allocated;
    return m;
  }

  /// Mean loss (nats per token) over the first `windows` fixed validation
  /// windows (-1: the configured eval_windows; 0: every window of the
  /// split, the whole held-out range); train::evaluate, with the document
  /// mask of training when train_config::document_separator is set. Collective.
  double evaluate(std::int64_t windows = -1) {
    TESSERA_NVTX_RANGE("evaluate");
    ctx_->apply_threads();
    if (windows < 0)
      return train::evaluate(*chunks_, mesh_, *val_, cfg_.micro_batch, cfg_.seq,
                             cfg_.document_separator);
    const data::val_windows val(*data_, data_->split().val, cfg_.seq, windows);
    return train::evaluate(*chunks_, mesh_, val, cfg_.micro_batch, cfg_.seq,
                           cfg_.document_separator);
  }

  /// `n` tokens sampled after `prompt` at `temperature`, deterministic in
  /// `seed`, with the last min(max_seq, seq) tokens as context
  /// (train::generate). Collective; the same tokens on every rank.
  std::vector<std::int32_t> generate(std::vector<std::int32_t> prompt, std::int64_t n,
                                     double temperature, std::uint64_t seed) {
    ctx_->apply_threads();
    return train::generate(*chunks_, mesh_, std::move(prompt), n, temperature, seed,
                           std::min(model().config().max_seq, cfg_.seq));
  }

  /// Writes the parameters, master weights and optimizer state with
  /// metadata() to `path`: a checkpoint folder
  /// (train::save_checkpoint_folder: every layout; each rank writes its own
  /// file at once, the metadata last), or, for a path ending in ".bin",
  /// the single file of earlier versions (train::save_checkpoint: zero<0>
  /// only, resumed at its own layout). Collective.
  void save_checkpoint(const std::filesystem::path& path) {
    if (path.extension() == ".bin")
      train::save_checkpoint<S>(*chunks_, mesh_, path, checkpoint_metadata(), step_);
    else
      train::save_checkpoint_folder(*chunks_, mesh_, path, checkpoint_metadata());
  }
  /// Starts an asynchronous save of checkpoint folder `dir` into `a`: this
  /// rank's share copied to host memory now, written in the background;
  /// `a.finish` completes it (train/checkpoint_async.hpp). Every rank calls
  /// it at the same step. Throws config_error for a ".bin" path (the single
  /// file of earlier versions is written synchronously), error while `a`
  /// holds a save not yet finished.
  void begin_checkpoint(const std::filesystem::path& dir, async_checkpoint& a) {
    TESSERA_THROW_IF(dir.extension() == ".bin", config_error, "'", dir.string(),
                     "': an asynchronous save writes a checkpoint folder, not a .bin file");
    a.begin(*chunks_, mesh_, dir, checkpoint_metadata());
  }
  /// Restores what save_checkpoint wrote, its settings held against this
  /// run's: a checkpoint folder written at any layout the model allows
  /// (train::load_checkpoint_folder: the layout may change, the model,
  /// precision, optimizer, global batch and corpus may not), or a ".bin"
  /// file (train::load_checkpoint: the same layout); then restarts the
  /// loader at the checkpoint's step. Collective.
  void load_checkpoint(const std::filesystem::path& path) {
    nlohmann::json run;
    step_ = path.extension() == ".bin"
                ? train::load_checkpoint<S>(*chunks_, mesh_, path, metadata(), cfg_.steps, &run)
                : train::load_checkpoint_folder(*chunks_, mesh_, path, metadata(), cfg_.steps,
                                                &run);
    restore_precision_state<P>(run, path, steps_->scaler(), *chunks_, mesh_, *ctx_);
    steps_->restart(step_);
  }
  /// Writes the model as a Hugging Face Llama folder (train::export_hf). Collective.
  void export_hf(const std::filesystem::path& dir, std::string torch_dtype = "",
                 std::uint64_t max_shard_bytes = nn::hf_default_shard_bytes) {
    ctx_->apply_threads();
    train::export_hf(*chunks_, mesh_, dir, std::move(torch_dtype), max_shard_bytes);
  }

  /// Checks that every rank holds the same `settings` (train::agree_settings
  /// over the mesh; collective). Throws config_error on every rank naming
  /// `what`, the first differing setting and its values on world rank 0
  /// and on the lowest rank that differs.
  void agree_settings(const nlohmann::json& settings, const std::string& what) {
    auto world = mesh_reduction(mesh_, *ctx_);
    train::agree_settings(world, world_rank(), settings, what);
  }

  /// Records the timeline of the steps that follow (off: none); the last
  /// traced step's actions are executor().timeline().
  void set_tracing(bool on) { executor().set_tracing(on); }
  /// Every rank's timeline of the last traced step, on every rank
  /// (train::gather_timeline; collective).
  std::vector<trace_event> gather_timeline() {
    return train::gather_timeline(mesh_, *ctx_, executor().timeline());
  }

  /// The checkpoint's metadata (train/metadata.hpp): the run's settings,
  /// the step, under tp and pp this rank's position in the layout, and
  /// the precision policy's settings (train/precision_state.hpp).
  nlohmann::json metadata() const {
    nlohmann::json m =
        run_metadata(model().config(), cfg_, P::name, O::name, cfg_.template optimizer_config<O>(),
                     S::name, mesh_.dp(), step_, chunks_->flat_elements(), *data_);
    if (mesh_.cp() > 1) {  // a layout key: a load onto another cp reshards
      m["cp"] = mesh_.cp();
      m["cp_kind"] = nn::to_string(cfg_.cp_kind);
    }
    if (mesh_.tp() > 1) {  // a tp rank's shards resume at the same layout only
      m["tp"] = mesh_.tp();
      m["tp_rank"] = mesh_.tp_rank();  // sequence parallelism keeps the layout: not recorded
    }
    if (cfg_.pp > 1) {  // the stage's chunks; the schedule does not change them: not recorded
      m["pp"] = cfg_.pp;
      m["pp_stage"] = mesh_.stage();
      m["virtual_stages"] = cfg_.virtual_stages;
      nlohmann::json blocks = nlohmann::json::array();
      for (int c = 0; c < chunks(); ++c)
        blocks.push_back(
            {model(c).options().stage.first_block, model(c).options().stage.last_block});
      m["stage_blocks"] = blocks;
    }
    add_precision_settings<P>(m, cfg_, steps_ ? steps_->scaler() : nullptr);
    return m;
  }

 private:
  // metadata() and, under an FP8 policy, "fp8_state": every block's FP8
  // linear states by global name (nn::llama::fp8_state), gathered over pp
  // so the run state world rank 0 writes holds every block (the tp and dp
  // ranks of a stage hold equal states). Collective over the mesh.
  nlohmann::json checkpoint_metadata() const {
    nlohmann::json m = metadata();
    if constexpr (precision::fp8_linear<P>)
      m["fp8_state"] = gather_fp8_state(*chunks_, mesh_, *ctx_, cfg_);
    return m;
  }

  // A context of the trainer's own (on a GPU, on a stream of its own: the
  // dp group's collectives run on theirs, ordered by events,
  // parallel/stream_order.hpp).
  static std::unique_ptr<kernels::owned_context<Ctx>> make_context() {
    return std::make_unique<kernels::owned_context<Ctx>>();
  }
  static std::optional<C> make_self(const Ctx& ctx) {
    if constexpr (std::is_constructible_v<C, const Ctx&>)
      return std::optional<C>(std::in_place, ctx);
    else
      throw config_error("trainer: a data-parallel trainer needs its communicator");
  }
  // The schedule a Schedule type fixes is the run's.
  static train_config with_schedule(train_config cfg) {
    if constexpr (parallel::fixed_schedule<Schedule>) cfg.pipeline = Schedule::kind;
    return cfg;
  }
  static Schedule make_schedule_policy(const train_config& cfg) {
    if constexpr (parallel::fixed_schedule<Schedule>)
      return Schedule{};
    else
      return Schedule{cfg.pipeline};
  }

  // Every rank trains the same run: a seed, step count, schedule or bucket
  // size given to one rank only is refused here, naming it, not trained
  // into diverged replicas or a hang (the data fingerprint compares the
  // corpora too). Hashing the corpus may fail on one rank only: that is
  // agreed first. Then the Hugging Face folder opens on every rank or on
  // none (a folder missing on one node fails every rank now, not at a
  // later collective).
  void agree_start(const nn::llama_config& model_cfg, const parallel::data_parallel_options& dpo) {
    auto world = mesh_reduction(mesh_, *ctx_);
    nlohmann::json mine;
    std::exception_ptr failed;
    try {
      mine = run_metadata(model_cfg, cfg_, P::name, O::name, cfg_.template optimizer_config<O>(),
                          S::name, mesh_.dp(), 0, 0, *data_);
      mine["tp"] = mesh_.tp();
      mine["cp"] = mesh_.cp();
      mine["cp_kind"] = nn::to_string(cfg_.cp_kind);
      mine["pp"] = cfg_.pp;
      mine["virtual_stages"] = cfg_.virtual_stages;
      mine["stage_blocks"] = cfg_.stage_blocks;
      mine["pipeline"] = parallel::to_string(cfg_.pipeline);
      mine["sequence_parallel"] = cfg_.sequence_parallel;
      mine["checkpointing"] = {static_cast<int>(cfg_.checkpointing.mode), cfg_.checkpointing.every};
      mine["eval_every"] = cfg_.eval_every;
      mine["eval_windows"] = cfg_.eval_windows;
      mine["bucket_bytes"] = dpo.bucket_bytes;
      mine["prefetch"] = dpo.prefetch;
      mine["grad_reduction"] = parallel::to_string(dpo.reduction);
      mine["init_from_hf"] = cfg_.init_from_hf;
      mine["fp8"] = cfg_.fp8.to_json();
      mine["loss_scale"] = cfg_.loss_scale.to_json();
      mine.erase("rng");  // its seed is "seed": one name for one setting
    } catch (...) {
      failed = std::current_exception();
    }
    agree_or_throw(world, world_rank(), failed, "the trainer's start-up");
    train::agree_settings(world, world_rank(), mine, "the trainer's settings");
    if (cfg_.init_from_hf.empty()) return;
    try {
      hf_ = nn::open_hf_for(model_cfg, cfg_.init_from_hf);
      hf_reader_ = hf_->reader();
    } catch (...) {
      failed = std::current_exception();
    }
    agree_or_throw(world, world_rank(), failed,
                   "opening the Hugging Face folder '" + cfg_.init_from_hf + "'");
  }

  std::unique_ptr<kernels::owned_context<Ctx>> own_ctx_;  // null on the caller's context
  const Ctx* ctx_;
  std::optional<C> self_;  // the one-rank communicator of a single-rank trainer
  C* dp_;                  // the dp group: the layout's, or self_
  layout_type mesh_;
  train_config cfg_;
  const data::token_file* data_;
  Schedule schedule_;
  std::shared_ptr<const nn::hf_checkpoint> hf_;  // cfg.init_from_hf, mapped (the models read it)
  nn::tensor_reader hf_reader_;                  // its reader, which the models' options point at
  std::unique_ptr<chunks_type> chunks_;
  std::unique_ptr<step_runner<chunks_type>> steps_;
  std::optional<data::val_windows> val_;
  optim::lr_schedule lr_schedule_;  // the learning rate of each step
  std::int64_t step_ = 0;
  double peak_flops_ = 0, blas_flops_ = 0;
};

}  // namespace tessera::train
