#pragma once
/// \file train/trainer.hpp
/// The trainer: `trainer<Precision, Backend, Optimizer, Sharding,
/// Communicator>`, one rank of a training run composed from compile-time
/// policies, written once. One rank is dp = 1 with zero<0> over a
/// one-rank communicator (the defaults); data parallelism is the same class
/// over a communicator of dp ranks; the GPU is Backend = cuda:
///
///   trainer<precision::fp32>                                   one CPU rank
///   trainer<precision::bf16_mixed, host, optim::sgd>           SGD instead of AdamW
///   trainer<precision::fp32, host, optim::adamw, zero<2>, local_communicator>   threads
///   trainer<precision::bf16_mixed, cuda, optim::adamw, zero<1>, nccl_communicator>  GPUs
///   trainer<precision::fp32, host, optim::adamw, zero<1>, mpi_communicator,
///           tensor_parallel_layers<mpi_communicator>>(model, cfg, data, dp, {&tp}, pp)  3-D
///
/// One optimizer step on rank r of dp (DESIGN.md, "One step"; seeds/004):
///   the global batch of G sequences is dp ranks x A micro-batches x B rows;
///   rank r trains on global micro-batches r*A .. r*A + A-1
///   (data::global_micro_batch), so the union over ranks is exactly the
///   1-rank job's batch -> count the scored tokens of the whole step on the
///   host, all_reduce the count (the loss is the mean over every scored
///   token of the global batch) -> the schedule's actions (no_pipeline:
///   forward, backward per micro-batch, grad_scale 1/(global scored)) run
///   by the executor, fed by the double-buffered loader, buckets reduced as
///   the last backward produces them -> global norm over every shard and
///   rank -> clip -> optimizer on the owned elements -> gather -> one read
///   of the losses and the norm back to the host, the metrics.
///
/// Under a pipeline (the dp x tp x pp constructor) rank k of the pp group
/// holds the model chunks of stage k (parallel::partition_stages; V chunks
/// under the interleaved schedule), each with its engine over the dp
/// group; the A micro-batches run through the stages under the schedule
/// cfg.pipeline (parallel::make_schedule): the first stage reads the ids,
/// the last the targets and writes the losses, the hidden states and their
/// gradients go by send and recv on the pp group, and the norm is summed
/// over the stages before the clip (parallel/executor.hpp).
///
/// So `G` stays the number of sequences per optimizer step whatever dp, tp,
/// pp and the strategy are, and the loss curve does not change beyond
/// rounding.
/// train_step(), evaluate() and generate() are collectives: every rank
/// calls them in the same order and gets the same global figures. The
/// constructor and each of them set the calling thread's OpenMP thread
/// count to the context's `threads` (kernels::host_context; 0 keeps it).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/comm/communicator.hpp"
#include "tessera/comm/self.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/nvtx.hpp"
#include "tessera/data/device_loader.hpp"
#include "tessera/data/sampler.hpp"
#include "tessera/data/token_file.hpp"
#include "tessera/kernels/context.hpp"
#include "tessera/nn/flops.hpp"
#include "tessera/nn/hf_llama.hpp"
#include "tessera/nn/llama.hpp"
#include "tessera/optim/adamw.hpp"
#include "tessera/optim/clip.hpp"
#include "tessera/optim/optimizer.hpp"
#include "tessera/optim/schedule.hpp"
#include "tessera/parallel/executor.hpp"
#include "tessera/parallel/pipeline_partition.hpp"
#include "tessera/parallel/pipeline_schedule.hpp"
#include "tessera/parallel/schedule.hpp"
#include "tessera/parallel/sharding.hpp"
#include "tessera/parallel/zero.hpp"
#include "tessera/precision/policy.hpp"
#include "tessera/train/agree.hpp"
#include "tessera/train/checkpoint.hpp"
#include "tessera/train/config.hpp"
#include "tessera/train/metadata.hpp"
#include "tessera/train/metrics.hpp"
#include "tessera/train/sampling.hpp"
#include "tessera/train/trace.hpp"

namespace tessera::train {

/// One rank of a training run (file comment). `P` precision policy,
/// `Backend` host or cuda, `O` optimizer policy, `S` sharding strategy,
/// `C` communicator over the dp ranks in the backend's memory. A type that
/// is not an optimizer policy, a sharding strategy or a communicator fails
/// to compile with a message naming what it lacks.
/// Thread-safety: one trainer per rank, used from that rank's thread.
template <precision::policy P, class Backend = host, class O = optim::adamw,
          class S = parallel::zero<0>,
          class C = comm::self_communicator<kernels::context_t<Backend>>,
          class L = nn::dense_layers>
class trainer {
  static_assert(optim::check_optimizer_policy<O>());
  static_assert(parallel::check_sharding_strategy<S>());
  static_assert(comm::check_communicator<C>());

 public:
  using Ctx = kernels::context_t<Backend>;
  using model_type = nn::llama<P, Backend, L>;
  using engine_type = parallel::data_parallel<model_type, O, S, C>;
  using optimizer_type = typename engine_type::optimizer_type;
  using Param = typename P::param_type;
  using Acc = typename P::accum_type;
  using Master = typename P::master_type;
  static constexpr std::int32_t ignore_index = -100;

  /// One rank (dp = 1, zero<0> over a one-rank communicator) on a context
  /// of its own (kernels::owned_context: a counted host resource of its own
  /// on the host, a new stream of the current device on a GPU). Builds the model (weights from cfg.seed), the
  /// optimizer state (now, so the memory floor is visible before step 0),
  /// the samplers and the loader, and prefetches the first micro-batch.
  /// `data` is not owned and must outlive the trainer. Throws config_error
  /// for an invalid config or a corpus smaller than one window, naming the
  /// values; what the backend throws when it runs out of memory.
  trainer(nn::llama_config model_cfg, train_config cfg, const data::token_file& data,
          parallel::data_parallel_options dpo = {})
    requires std::same_as<C, comm::self_communicator<Ctx>>
      : trainer(own_context{}, std::move(model_cfg), cfg, data, nullptr, L{}, dpo) {}

  /// One rank of a data-parallel run over `comm` (cfg.dp == comm.size()),
  /// on a context of its own (on a GPU: the communicator's stream, so
  /// kernels and collectives are ordered on one stream). Every rank must
  /// construct it with the same settings and call the same member functions
  /// in the same order (they are collectives). Throws as the single-rank
  /// constructor, and config_error naming dp and the world size.
  trainer(nn::llama_config model_cfg, train_config cfg, const data::token_file& data, C& comm,
          parallel::data_parallel_options dpo = {})
    requires std::same_as<L, nn::dense_layers>
      : trainer(own_context{}, std::move(model_cfg), cfg, data, &comm, L{}, dpo) {}

  /// One rank of a run on a dp x tp mesh: `comm` is this rank's dp group
  /// (cfg.dp == comm.size()), `layers` holds its tp group
  /// (nn::tensor_parallel_layers; cfg.tp == its size; not owned, it must
  /// outlive the trainer). The ranks of a tp group train on the same
  /// micro-batches (the dp rank picks them), each holds its shards of the
  /// blocks' weights, gradients and optimizer state; ZeRO shards over the
  /// dp group. Every rank of the world must construct it with the same
  /// settings and call the same member functions in the same order. Throws
  /// as above, and config_error naming tp when it does not match the group
  /// or does not split the heads or F (nn::check_tensor_parallel), or
  /// with cfg.sequence_parallel when tp is 1 or does not divide T. The
  /// family's `sequence_parallel` is taken from cfg.sequence_parallel.
  trainer(nn::llama_config model_cfg, train_config cfg, const data::token_file& data, C& comm,
          L layers, parallel::data_parallel_options dpo = {})
      : trainer(own_context{}, std::move(model_cfg), cfg, data, &comm, layers, dpo) {}

  /// One rank of a run on a dp x tp x pp mesh (comm::device_mesh, Megatron
  /// order): `comm` its dp group, `layers` its tp group (dense_layers{}
  /// without tp), `pp` its pipeline group (cfg.pp == pp.size(), ranked by
  /// stage; not owned, must outlive the trainer). This rank holds the
  /// cfg.virtual_stages model chunks of stage k = pp.rank(): chunk c is
  /// virtual stage c K + k of parallel::partition_stages (cfg.stage_blocks,
  /// or balanced by FLOPs); each chunk has its engine over the dp group. The
  /// G / (B dp) micro-batches of a step run through the pipeline under
  /// cfg.pipeline; the loss is the last stage's, the gradient norm summed
  /// over every stage. Throws as above, and config_error naming the
  /// numbers when pp does not match the group, the schedule cannot run
  /// the micro-batch count or the virtual stages
  /// (parallel::check_pipeline), there are more stages than layers, or
  /// with zero<3> (its per-segment gathers are not pipelined).
  trainer(nn::llama_config model_cfg, train_config cfg, const data::token_file& data, C& comm,
          L layers, C& pp, parallel::data_parallel_options dpo = {})
      : trainer(own_context{}, std::move(model_cfg), cfg, data, &comm, layers, dpo, &pp) {}

  /// As above, on the caller's context `ctx` (not owned; must outlive the
  /// trainer): its memory resource, threads, tiles or stream. A temporary
  /// context is refused at compile time.
  trainer(nn::llama_config model_cfg, train_config cfg, const data::token_file& data, C& comm,
          const Ctx& ctx, parallel::data_parallel_options dpo = {})
    requires std::same_as<L, nn::dense_layers>
      : trainer(&ctx, std::move(model_cfg), cfg, data, &comm, L{}, dpo) {}
  trainer(nn::llama_config, train_config, const data::token_file&, C&, const Ctx&&,
          parallel::data_parallel_options = {}) = delete;

  trainer(const trainer&) = delete;
  trainer& operator=(const trainer&) = delete;

  /// The model (under a pipeline: this rank's chunk c, a stage of it).
  model_type& model(int c = 0) { return *models_[static_cast<std::size_t>(c)]; }
  const model_type& model(int c = 0) const { return *models_[static_cast<std::size_t>(c)]; }
  /// The data-parallel engine of chunk c.
  engine_type& engine(int c = 0) { return *engines_[static_cast<std::size_t>(c)]; }
  optimizer_type& optimizer(int c = 0) { return engine(c).optimizer(); }
  /// This rank's model chunks (1 unless interleaved).
  int chunks() const { return static_cast<int>(models_.size()); }
  /// The pipeline stage of this rank (0 without a pipeline) and the degree.
  int pp_rank() const { return stage_; }
  int pp_size() const { return static_cast<int>(cfg_.pp); }
  /// The schedule's action list of this rank for one step.
  const std::vector<parallel::action>& actions() const { return schedule_; }
  /// The executor (its timeline when tracing is on).
  parallel::executor<model_type, engine_type>& executor() { return *executor_; }
  const train_config& config() const { return cfg_; }
  const Ctx& context() const { return *ctx_; }
  C& communicator() { return *comm_; }
  int rank() const { return comm_->rank(); }
  /// This rank's index in its tensor-parallel group (0 without one).
  int tp_rank() const { return layers_.rank(); }
  /// The tensor-parallel degree (1 without tensor parallelism).
  int tp_size() const { return layers_.size(); }
  /// Whether this rank holds the last virtual stage (the head: the losses).
  bool holds_head() const { return models_.back()->options().stage.head; }
  /// Optimizer steps taken so far (the data position: step s reads the windows of step s).
  std::int64_t step() const { return step_; }
  /// Peak FLOP/s of one rank, for MFU (kernels::peak_flops::flops; 0: no MFU).
  void set_peak_flops(double f) { peak_flops_ = f; }
  /// The sgemm rate one rank measured, for MFU "of BLAS peak" beside it (0: none).
  void set_blas_flops(double f) { blas_flops_ = f; }

  /// One optimizer step over A = G / (B dp) micro-batches on this rank
  /// (collective). Returns the global figures, the same on every rank:
  /// loss over every scored token of the global batch, gradient norm over
  /// all shards and ranks, tokens of the global batch. A non-finite
  /// gradient norm skips the update on every rank (metrics.skipped).
  step_metrics train_step() {
    TESSERA_NVTX_RANGE("train step");
    const auto t0 = std::chrono::steady_clock::now();
    comm::note_step(step_ + 1);  // for a rank stopped by its launcher (comm/mpi.hpp)
    ctx_->apply_threads();
    memory_resource& mr = ctx_->resource();
    mr.reset_peak();
    const std::int64_t A = cfg_.accum_steps(), B = cfg_.micro_batch, T = cfg_.seq;
    step_metrics m;
    m.lr = sched_(step_);
    // The loss is normalised by the scored tokens of the whole step, which
    // must be known before the first backward: count them on the host from
    // the sampler (the loader checks and copies the same windows).
    std::int64_t scored = 0;
    for (std::int64_t a = 0; a < A; ++a) {
      sampler_.fill(static_cast<std::uint64_t>(step_), first_micro_batch() + static_cast<std::uint64_t>(a),
                    windows_.data());
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t t = 1; t <= T; ++t)
          scored += windows_[static_cast<std::size_t>(b * (T + 1) + t)] != ignore_index;
    }
    scored = all_reduce_value(scored);
    TESSERA_THROW_IF(scored == 0, config_error, "step ", step_,
                     " has no scored tokens on any rank (every target is ignore_index)");
    typename executor_type::inputs in;
    in.grad_scale = static_cast<Acc>(1.0 / static_cast<double>(scored));
    in.d_losses = scalars_.data() + scalar_losses;
    in.lr = m.lr;
    in.max_norm = cfg_.grad_clip;
    in.d_sum_squares = scalars_.data() + scalar_sum_squares;
    in.d_clip = clip_.data();
    executor_->run(schedule_, [&](std::int64_t a) { return next_micro_batch(a); }, in);
    // One read back: the micro-batches' losses and the norm.
    std::vector<double> h(static_cast<std::size_t>(A + 1));
    ctx_->to_host(h.data(), scalars_.data(), h.size() * sizeof(double));
    double loss_sum = 0;  // the last stage's (the losses are written there)
    if (holds_head())
      for (std::int64_t a = 0; a < A; ++a) loss_sum += h[static_cast<std::size_t>(1 + a)];
    m.grad_norm = std::sqrt(h[0]);
    m.clip = optim::clip_coefficient(m.grad_norm, cfg_.grad_clip);
    if (!std::isfinite(m.clip)) {
      m.skipped = true;  // the optimizer kernel wrote nothing
      for (int c = 0; c < chunks(); ++c) optimizer(c).skipped();
    }
    loss_sum = all_reduce_value(loss_sum);
    if (pp_) pp_all_reduce_values(&loss_sum, 1);
    m.loss = loss_sum / static_cast<double>(scored);
    ++step_;
    m.step = step_;
    m.tokens = cfg_.global_batch * T;
    m.scored = scored;
    m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    m.tokens_per_s = static_cast<double>(m.tokens) / m.seconds;
    m.flops = nn::flops_per_token(model().config(), T) * static_cast<double>(m.tokens);
    const double ranks = static_cast<double>(comm_->size()) * model().tp_size() * pp_size();
    m.mfu = peak_flops_ > 0 ? m.flops / m.seconds / (peak_flops_ * ranks) : 0.0;
    m.mfu_blas = blas_flops_ > 0 ? m.flops / m.seconds / (blas_flops_ * ranks) : 0.0;
    const auto st = mr.stats();
    m.mem_allocated = st.allocated;
    m.mem_peak = st.peak_allocated;
    return m;
  }

  /// Mean loss (nats per token) over the first `windows` fixed validation
  /// windows (-1: the configured eval_windows; 0: every window of the split,
  /// the whole held-out range), split across the ranks by batch (batch j to
  /// rank j mod dp; a rank without a batch in the last round repeats batch 0
  /// and discards it, so every rank runs the same forwards, which zero<3>'s
  /// gathers need). Collective; the same value on every rank.
  double evaluate(std::int64_t windows = -1) {
    TESSERA_NVTX_RANGE("evaluate");
    ctx_->apply_threads();
    const std::int64_t B = cfg_.micro_batch, T = cfg_.seq, dp = comm_->size();
    const data::val_windows val =
        windows < 0 ? val_ : data::val_windows(*data_, split_.val, T, windows);
    std::vector<std::int32_t> buf(static_cast<std::size_t>(B * (T + 1)));
    double sum[2] = {0, 0};  // loss sum, scored
    const std::int64_t nb = val.batches(B), rounds = (nb + dp - 1) / dp;
    for (std::int64_t j = 0; j < rounds; ++j) {
      const std::int64_t k = j * dp + rank();
      const std::int64_t rows = val.fill(k < nb ? k : 0, B, buf.data());
      const nn::loss_sum r = pp_ ? pipeline_forward_loss(buf.data(), rows, T)
                                 : (engine().begin_forward_only(),
                                    model().forward_loss(buf.data(), rows, T));
      if (k < nb) {
        sum[0] += r.sum;
        sum[1] += static_cast<double>(r.scored);
      }
    }
    all_reduce_values(sum, 2);
    if (pp_) pp_all_reduce_values(sum, 2);  // the last stage's sums
    return sum[1] > 0 ? sum[0] / sum[1] : std::nan("");
  }

  /// Samples `n` tokens after `prompt` (token ids) from the full softmax at
  /// `temperature`, deterministic in `seed`, on the model's own backend
  /// (V logits read back per token). The context is the last min(max_seq,
  /// seq) tokens. Returns the prompt followed by the n sampled tokens.
  /// Collective (zero<3> gathers); the same tokens on every rank. Throws
  /// config_error for an empty prompt, an id outside the vocabulary, a
  /// negative n or a temperature that is not > 0.
  std::vector<std::int32_t> generate(std::vector<std::int32_t> prompt, std::int64_t n,
                                     double temperature, std::uint64_t seed) {
    ctx_->apply_threads();
    return generate_tokens(std::move(prompt), n, temperature, seed, model().config().vocab,
                           std::min(model().config().max_seq, cfg_.seq),
                           [&](const std::int32_t* ids, std::int64_t len, float* logits) {
                             if (pp_) return pipeline_logits(ids, len, logits);
                             engine().begin_forward_only();
                             model().next_token_logits(ids, len, logits);
                           });
  }

  /// zero<0>: rank 0 writes the parameters and the optimizer state to
  /// `path` (streamed to a temporary file through host blocks, fsync'ed,
  /// renamed; train/checkpoint.hpp), with the run's metadata; collective
  /// (the ranks wait for the file). Under tensor and pipeline parallelism
  /// dp rank 0 of every (tp, pp) position writes its shards: tp rank r of
  /// stage k to `path`.pp<k>.tp<r> (".pp<k>" only for k > 0, ".tp<r>" only
  /// for r > 0; every chunk of the stage in one file), and the metadata
  /// records tp, pp, V and the position: a resume needs the same layout;
  /// shards of an earlier run at a larger tp or pp are removed. zero<1..3>:
  /// throws config_error before any work: sharded checkpoints are not
  /// supported yet. If a write fails on any rank, every rank throws the
  /// same io_error, naming the step, the path, the failing world rank and
  /// its error (agree_or_throw).
  void save_checkpoint(const std::filesystem::path& path_) {
    refuse_sharded("save");
    const std::filesystem::path path = shard_path(path_);
    std::exception_ptr failed;
    if (rank() == 0) {
      try {
        std::size_t bytes = 0;
        for (int c = 0; c < chunks(); ++c) bytes += param_bytes(c) + optimizer(c).serialized_bytes();
        write_checkpoint(path, metadata(), bytes, [&](checkpoint_writer& w) {
          for (int c = 0; c < chunks(); ++c) {
            optim::detail::write_from(*ctx_, w, model(c).params(), param_bytes(c));
            optimizer(c).save(w);
          }
        });
        // Shards of an earlier run at a larger tp or pp would be stale beside this one.
        if (layers_rank() == 0) remove_stale_shards(stage_path(path_), "tp", model().tp_size());
        if (layers_rank() == 0 && stage_ == 0) remove_stale_shards(path_, "pp", pp_size());
      } catch (...) {
        failed = std::current_exception();
      }
    }
    // Every shard is written when any rank returns; a failed write (a full
    // disk) ends every rank now with the writer's message, not the others
    // at their next collective's timeout.
    agree_or_throw(failed, detail::str("checkpoint save at step ", step_, " to '", path_.string(), "'"));
  }

  /// zero<0>: every rank restores what save_checkpoint wrote (model,
  /// optimizer state, step), verified whole before any state changes, and
  /// the loader restarts at the resumed step. Throws io_error for a
  /// missing, truncated or corrupt file, config_error if its settings
  /// (model, precision, optimizer, batch, dp, strategy, ...) differ from
  /// this run's, naming the field and both values; zero<1..3>: config_error
  /// as save_checkpoint. Under tensor or pipeline parallelism (collective
  /// over the tp and pp groups) the ranks agree first: a missing shard of a
  /// checkpoint written at another tp names both degrees; a rank whose
  /// shard fails makes every rank throw; shards of different steps (a save
  /// interrupted between ranks) throw config_error naming the steps.
  void load_checkpoint(const std::filesystem::path& path_) {
    refuse_sharded("load");
    const std::filesystem::path path = shard_path(path_);
    nlohmann::json meta;
    std::vector<char> payload;
    std::int64_t step = 0;
    std::size_t bytes = 0;
    for (int c = 0; c < chunks(); ++c) bytes += param_bytes(c) + optimizer(c).serialized_bytes();
    std::exception_ptr failed;
    try {
      if (path != path_ && !std::filesystem::exists(path) && std::filesystem::exists(path_)) {
        // No shard for this position: the first shard says how it was written.
        read_checkpoint(path_, meta, payload);
        nlohmann::json mine = metadata();
        if (mine.contains("tp_rank")) mine["tp_rank"] = 0;
        if (mine.contains("pp_stage")) mine["pp_stage"] = 0;
        (void)check_resume_metadata(path_, meta, mine, cfg_.steps);  // names the tp first
        throw io_error("checkpoint '" + path_.string() + "' has no shard '" + path.string() +
                       "' for tp rank " + std::to_string(layers_rank()) + " of stage " +
                       std::to_string(stage_));
      }
      read_checkpoint(path, meta, payload);
      step = check_resume_metadata(path, meta, metadata(), cfg_.steps);
      TESSERA_THROW_IF(payload.size() != bytes, io_error, "checkpoint '", path.string(),
                       "' holds ", payload.size(), " payload bytes; this run needs ", bytes);
    } catch (...) {
      failed = std::current_exception();
    }
    // The shards of the tp and pp ranks are one checkpoint only if every
    // one loads and all are of the same step (a save interrupted between
    // two ranks' renames leaves shards of two steps): agreed before any
    // state changes.
    if (L::tensor_parallel || pp_) {
      double v[3] = {failed ? 1.0 : 0.0, static_cast<double>(step), -static_cast<double>(step)};
      tensor<double, Backend> d = kernels::make_tensor<double>(*ctx_, 3);
      ctx_->from_host(d.data(), v, sizeof v);
      if constexpr (L::tensor_parallel) layers_.all_reduce_values(d.data(), 3, true);
      if (pp_) pp_->all_reduce(d.data(), 3, comm::reduce_op::max);
      ctx_->to_host(v, d.data(), sizeof v);
      TESSERA_THROW_IF(!failed && v[0] > 0, io_error, "checkpoint '", path_.string(),
                       "': another tp or pp rank could not load its shard (its error names it)");
      TESSERA_THROW_IF(!failed && v[1] != -v[2], config_error, "checkpoint '", path_.string(),
                       "': its shards are of different steps (", static_cast<std::int64_t>(-v[2]),
                       " to ", static_cast<std::int64_t>(v[1]),
                       "): a save was interrupted between ranks; resume from a complete checkpoint");
    }
    if (failed) std::rethrow_exception(failed);
    std::size_t at = 0;
    for (int c = 0; c < chunks(); ++c) {
      ctx_->from_host(model(c).params(), payload.data() + at, param_bytes(c));
      at += param_bytes(c);
      optimizer(c).load(payload.data() + at);
      at += optimizer(c).serialized_bytes();
    }
    step_ = step;
    loader_.prefetch(static_cast<std::uint64_t>(step_), first_micro_batch());
  }

  /// Writes the model as a Hugging Face Llama folder `dir` (created if
  /// missing; nn/hf_llama.hpp): config.json for LlamaForCausalLM and the
  /// tensors under transformers' names, in model.safetensors, or, above
  /// `max_shard_bytes` or under a pipeline (each stage writes its own
  /// files), in model-0000i-of-0000N.safetensors listed by
  /// model.safetensors.index.json. The tensors are the parameters the
  /// model computes with (bf16 under bf16_mixed, not the fp32 master
  /// weights) stored as `torch_dtype`: float32, bfloat16, float16 or
  /// float64; empty: bfloat16 for bf16 parameters, float64 for double,
  /// else float32. Under tensor parallelism the shards are gathered over
  /// the tp group (padding rows dropped); zero<3> gathers over dp. dp
  /// rank 0 and tp rank 0 of each stage writes (each file atomically);
  /// world rank 0 then writes config.json and the index and removes the
  /// weight files of an earlier export in `dir` that this one does not
  /// write. Collective over the dp, tp and pp groups; every rank throws
  /// when any rank fails (io_error naming the file there, the others
  /// naming the failure elsewhere). Memory: each rank gathers its stage's
  /// parameters of the whole tp group (tp x the stage's parameters, in the
  /// context's memory and on the host), and the writer holds one file's
  /// bytes. Throws config_error for an unknown dtype before any work.
  void export_hf(const std::filesystem::path& dir, std::string torch_dtype = "",
                 std::uint64_t max_shard_bytes = nn::hf_default_shard_bytes) {
    ctx_->apply_threads();
    if (torch_dtype.empty())
      torch_dtype = std::is_same_v<Param, bf16>     ? "bfloat16"
                    : std::is_same_v<Param, double> ? "float64"
                                                    : "float32";
    const std::string dtype = nn::hf_safetensors_dtype(torch_dtype);
    const nn::llama_config& c = model().config();
    const int K = pp_size(), V = chunks(), T = tp_size();
    const auto files = nn::plan_hf_files(
        c, parallel::partition_stages(c, cfg_.seq, K * V, cfg_.stage_blocks),
        data::safetensors_dtype_bytes(dtype), max_shard_bytes);
    const bool writer = rank() == 0 && tp_rank() == 0;
    std::exception_ptr failed;
    try {
      if (writer) std::filesystem::create_directories(dir);
    } catch (...) {
      failed = std::current_exception();
    }
    for (int ch = 0; ch < V; ++ch) {
      // This chunk's parameters of every tp rank, on the host (collective).
      // 16-bit parameters travel as pairs in 32-bit words (as zero's
      // gathers): the stride rounds up to even.
      const std::int64_t n = model(ch).flat_size();
      const std::int64_t stride = sizeof(Param) == 2 ? (n + 1) / 2 * 2 : n;
      tensor<Param, Backend> full = kernels::make_tensor<Param>(*ctx_, stride);
      engine(ch).full_params(full.data());
      std::vector<Param> h(static_cast<std::size_t>(stride * T));
      if constexpr (L::tensor_parallel) {
        tensor<Param, Backend> all = kernels::make_tensor<Param>(*ctx_, stride * T);
        if constexpr (comm::comm_element<Param>)
          layers_.group->all_gather(full.data(), all.data(), static_cast<std::size_t>(stride));
        else
          layers_.group->all_gather(reinterpret_cast<const std::int32_t*>(full.data()),
                                    reinterpret_cast<std::int32_t*>(all.data()),
                                    static_cast<std::size_t>(stride / 2));
        ctx_->to_host(h.data(), all.data(), h.size() * sizeof(Param));
      } else {
        ctx_->to_host(h.data(), full.data(), h.size() * sizeof(Param));
      }
      if (!writer || failed) continue;
      try {
        write_hf_chunk(dir, files, virtual_stage(ch), model(ch), h, stride, dtype);
      } catch (...) {
        failed = std::current_exception();
      }
    }
    // Every stage's files are in place before the folder names them: then
    // world rank 0 writes config.json and the index and removes weight
    // files of an earlier export that this one does not have.
    agree_or_throw(failed, "export to '" + dir.string() + "'");
    if (world_rank() == 0) {
      try {
        write_json_file(dir / "config.json", nn::hf_config_json(c, torch_dtype));
        const std::filesystem::path index = dir / "model.safetensors.index.json";
        if (files.size() > 1) write_json_file(index, nn::hf_index_json(files));
        std::set<std::string> mine{"model.safetensors.index.json"};
        if (files.size() == 1) mine.erase("model.safetensors.index.json");
        for (const auto& f : files) mine.insert(f.name);
        std::vector<std::filesystem::path> stale;
        for (const auto& e : std::filesystem::directory_iterator(dir)) {
          const std::string n = e.path().filename().string();
          if (n.starts_with("model") && (n.ends_with(".safetensors") || n == "model.safetensors.index.json") &&
              !mine.contains(n))
            stale.push_back(e.path());
        }
        for (const auto& p : stale) std::filesystem::remove(p);
      } catch (...) {
        failed = std::current_exception();
      }
    }
    agree_or_throw(failed, "export to '" + dir.string() + "'");
  }

  /// Checks that every rank holds the same `settings` (collective over the
  /// tp, dp and pp groups; train::agree_settings, train/agree.hpp). At
  /// construction the trainer checks its model, run, schedule, bucket,
  /// optimizer and data settings this way; a program may add its own.
  /// Throws config_error on every rank naming `what`, the first differing
  /// setting and its values on world rank 0 and on the lowest rank that
  /// differs.
  void agree_settings(const nlohmann::json& settings, const std::string& what) {
    auto world = [this](std::vector<double>& v, comm::reduce_op op) { reduce_world(v, op); };
    train::agree_settings(world, world_rank(), settings, what);
  }

  /// Records the timeline of the steps that follow (off: none); the last
  /// traced step's actions are timeline().
  void set_tracing(bool on) { executor_->set_tracing(on); }
  /// This rank's world rank in the mesh (comm::device_mesh order: tp
  /// fastest, then dp, then pp).
  int world_rank() const {
    return (stage_ * comm_->size() + comm_->rank()) * tp_size() + tp_rank();
  }
  /// Every rank's timeline of the last traced step, on every rank
  /// (collective over the tp, dp and pp groups: all-gathers).
  std::vector<trace_event> gather_timeline() {
    std::vector<double> v;
    for (const auto& t : executor_->timeline())
      v.insert(v.end(), {static_cast<double>(world_rank()), static_cast<double>(t.a.kind),
                         static_cast<double>(t.a.micro_batch), static_cast<double>(t.a.chunk),
                         t.start, t.end, static_cast<double>(t.allocated)});
    auto over = [&](auto& group) {
      if (group.size() == 1) return;
      double n = static_cast<double>(v.size());
      tensor<double, Backend> d = kernels::make_tensor<double>(*ctx_, 1);
      ctx_->from_host(d.data(), &n, sizeof n);
      group.all_reduce(d.data(), 1, comm::reduce_op::max);
      ctx_->to_host(&n, d.data(), sizeof n);
      const auto chunk = static_cast<std::size_t>(n);
      v.resize(chunk, -1.0);  // padding rows: rank -1
      tensor<double, Backend> send = kernels::make_tensor<double>(*ctx_, static_cast<std::int64_t>(chunk));
      tensor<double, Backend> all = kernels::make_tensor<double>(
          *ctx_, static_cast<std::int64_t>(chunk) * group.size());
      ctx_->from_host(send.data(), v.data(), chunk * sizeof(double));
      group.all_gather(send.data(), all.data(), chunk);
      std::vector<double> h(chunk * static_cast<std::size_t>(group.size()));
      ctx_->to_host(h.data(), all.data(), h.size() * sizeof(double));
      v.clear();
      for (std::size_t i = 0; i + 7 <= h.size(); i += 7)
        if (h[i] >= 0) v.insert(v.end(), h.begin() + static_cast<std::ptrdiff_t>(i),
                                h.begin() + static_cast<std::ptrdiff_t>(i + 7));
    };
    if constexpr (L::tensor_parallel) over(*layers_.group);
    over(*comm_);
    if (pp_) over(*pp_);
    std::vector<trace_event> out;
    for (std::size_t i = 0; i + 7 <= v.size(); i += 7)
      out.push_back({static_cast<int>(v[i]),
                     {{static_cast<parallel::action_kind>(static_cast<int>(v[i + 1])),
                       static_cast<std::int64_t>(v[i + 2]), static_cast<int>(v[i + 3])},
                      v[i + 4],
                      v[i + 5],
                      static_cast<std::int64_t>(v[i + 6])}});
    return out;
  }

  /// The checkpoint's metadata (train/metadata.hpp).
  nlohmann::json metadata() const {
    std::int64_t flat = 0;
    for (const auto& m : models_) flat += m->flat_size();
    nlohmann::json m = run_metadata(models_.front()->config(), cfg_, P::name, O::name,
                                    cfg_.template optimizer_config<O>(), S::name, comm_->size(),
                                    step_, flat, *data_);
    if (models_.front()->tp_size() > 1) {  // a tp rank's shards resume at the same layout only
      m["tp"] = models_.front()->tp_size();
      m["tp_rank"] = layers_rank();  // sequence parallelism keeps the layout: not recorded
    }
    if (cfg_.pp > 1) {  // the stage's chunks; the schedule does not change them: not recorded
      m["pp"] = cfg_.pp;
      m["pp_stage"] = stage_;
      m["virtual_stages"] = cfg_.virtual_stages;
      nlohmann::json blocks = nlohmann::json::array();
      for (const auto& md : models_)
        blocks.push_back({md->options().stage.first_block, md->options().stage.last_block});
      m["stage_blocks"] = blocks;
    }
    return m;
  }

 private:
  using executor_type = parallel::executor<model_type, engine_type>;
  struct own_context {};
  // Scalars in the context's memory: the norm, then the A losses.
  static constexpr std::int64_t scalar_sum_squares = 0, scalar_losses = 1;

  trainer(own_context, nn::llama_config model_cfg, train_config cfg, const data::token_file& data,
          C* comm, L layers, parallel::data_parallel_options dpo, C* pp = nullptr)
      : trainer(make_context(comm), std::move(model_cfg), cfg, data, comm, layers, dpo, pp) {}
  trainer(std::unique_ptr<kernels::owned_context<Ctx>> own, nn::llama_config model_cfg,
          train_config cfg, const data::token_file& data, C* comm, L layers,
          parallel::data_parallel_options dpo, C* pp)
      : trainer(&own->ctx, std::move(model_cfg), cfg, data, comm, layers, dpo, pp) {
    own_ctx_ = std::move(own);
  }
  trainer(const Ctx* ctx, nn::llama_config model_cfg, train_config cfg,
          const data::token_file& data, C* comm, L layers, parallel::data_parallel_options dpo,
          C* pp = nullptr)
      : ctx_((ctx->apply_threads(), ctx)),
        self_(comm ? std::nullopt : make_self(*ctx)),
        comm_(comm ? comm : &*self_),
        pp_(pp && pp->size() > 1 ? pp : nullptr),
        layers_(layers),
        cfg_(checked(model_cfg, cfg, data, *comm_, layers.size(), pp)),
        stage_(pp ? pp->rank() : 0),
        data_(&data),
        split_(data.split()),
        sampler_(data, split_.train, cfg_.micro_batch, cfg_.seq, cfg_.seed),
        val_(data, split_.val, cfg_.seq, cfg_.eval_windows),
        loader_(data::loader_system_for<Backend>::make(*ctx_), sampler_, model_cfg.vocab,
                cfg_.accum_steps(), first_micro_batch(), ignore_index),
        sched_(cfg_.schedule()),
        scalars_(kernels::make_tensor<double>(*ctx_, 1 + cfg_.accum_steps())),
        clip_(kernels::make_tensor<Master>(*ctx_, 1)),
        count_(kernels::make_tensor<double>(*ctx_, 2)),
        windows_(static_cast<std::size_t>(cfg_.micro_batch * (cfg_.seq + 1))) {
    const int K = static_cast<int>(cfg_.pp), V = static_cast<int>(cfg_.virtual_stages);
    // A device pipeline group works on the context's stream, after the
    // kernels that wrote what it sends (as the model does with its tp group).
    if constexpr (requires(C& c) { c.set_stream(ctx_->stream()); })
      if (pp_) pp_->set_stream(ctx_->stream());
    // Every rank trains the same run: a seed, step count, schedule or
    // bucket size given to one rank only is refused here, naming it, not
    // trained into diverged replicas or a hang (the data fingerprint
    // compares the corpora too). Hashing the corpus may fail on one rank
    // only: that is agreed first.
    {
      nlohmann::json mine;
      std::exception_ptr failed;
      try {
        mine = run_metadata(model_cfg, cfg_, P::name, O::name, cfg_.template optimizer_config<O>(),
                            S::name, comm_->size(), 0, 0, data);
        mine["tp"] = layers.size();
        mine["pp"] = cfg_.pp;
        mine["virtual_stages"] = cfg_.virtual_stages;
        mine["stage_blocks"] = cfg_.stage_blocks;
        mine["pipeline"] = parallel::to_string(cfg_.pipeline);
        mine["sequence_parallel"] = cfg_.sequence_parallel;
        mine["checkpointing"] = {static_cast<int>(cfg_.checkpointing.mode),
                                 cfg_.checkpointing.every};
        mine["eval_every"] = cfg_.eval_every;
        mine["eval_windows"] = cfg_.eval_windows;
        mine["bucket_bytes"] = dpo.bucket_bytes;
        mine["prefetch"] = dpo.prefetch;
        mine["init_from_hf"] = cfg_.init_from_hf;
        mine.erase("rng");  // its seed is "seed": one name for one setting
      } catch (...) {
        failed = std::current_exception();
      }
      agree_or_throw(failed, "the trainer's start-up");
      agree_settings(mine, "the trainer's settings");
    }
    // The Hugging Face folder opens on every rank or on none (a folder
    // missing on one node fails every rank now, not at a later collective).
    {
      std::exception_ptr failed;
      try {
        hf_ = open_hf(model_cfg, cfg_);
        if (hf_) hf_reader_ = hf_->reader();
      } catch (...) {
        failed = std::current_exception();
      }
      if (!cfg_.init_from_hf.empty())
        agree_or_throw(failed, "opening the Hugging Face folder '" + cfg_.init_from_hf + "'");
    }
    const std::vector<nn::stage_range> stages =
        parallel::partition_stages(model_cfg, cfg_.seq, K * V, cfg_.stage_blocks);
    std::vector<typename executor_type::chunk> ch;
    for (int c = 0; c < V; ++c) {
      nn::llama_options o = model_options(cfg_);
      o.stage = stages[static_cast<std::size_t>(c * K + stage_)];
      if (hf_) o.weights = &hf_reader_;
      models_.push_back(std::make_unique<model_type>(model_cfg, o, *ctx_, with_config(layers, cfg_)));
      engines_.push_back(std::make_unique<engine_type>(init_model(*models_.back(), cfg_.seed),
                                                       *comm_, cfg_.template optimizer_config<O>(),
                                                       cfg_.seed, dpo));
      ch.push_back({models_.back().get(), engines_.back().get()});
    }
    const std::int64_t A = cfg_.accum_steps();
    if (K == 1 && cfg_.pipeline != parallel::schedule_kind::zero_bubble_h1)
      schedule_ = parallel::no_pipeline(A);
    else
      schedule_ = parallel::make_schedule(cfg_.pipeline, stage_, {K, A, V});
    std::vector<std::int64_t> capacity;
    for (int c = 0; c < V; ++c)
      capacity.push_back(std::max<std::int64_t>(1, parallel::peak_in_flight(schedule_, c)));
    executor_ = std::make_unique<executor_type>(
        std::move(ch), parallel::pipeline_place<C>{pp, stage_, K, V}, std::move(capacity));
    executor_->set_micro_batch(cfg_.micro_batch, cfg_.seq);
    loader_.prefetch(0, first_micro_batch());
  }

  // A device communicator's stream becomes the context's stream (the engine
  // requires one stream for kernels and collectives).
  static std::unique_ptr<kernels::owned_context<Ctx>> make_context(C* comm) {
    using owned = kernels::owned_context<Ctx>;
    if constexpr (requires(C& c) { owned(c.stream()); }) {
      if (comm) return std::make_unique<owned>(comm->stream());
    }
    return std::make_unique<owned>();
  }
  static std::optional<C> make_self(const Ctx& ctx) {
    if constexpr (std::is_constructible_v<C, const Ctx&>)
      return std::optional<C>(std::in_place, ctx);
    else
      throw config_error("trainer: a data-parallel trainer needs its communicator");
  }
  static train_config checked(const nn::llama_config& c, train_config cfg,
                              const data::token_file& d, const C& comm, int tp, const C* pp) {
    check_run(c, cfg, d, comm.size());
    const int K = pp ? pp->size() : 1;
    TESSERA_THROW_IF(cfg.pp != K, config_error, "pp=", cfg.pp,
                     " does not match the pipeline group's ", K, " ranks");
    TESSERA_THROW_IF(3 * static_cast<std::int64_t>(K) * cfg.virtual_stages > 32767, config_error,
                     "pp=", K, " x virtual stages V=", cfg.virtual_stages,
                     ": the pipeline's message tags (3 K V) exceed MPI's bound of 32767");
    TESSERA_THROW_IF(K > 1 && S::shards_parameters, config_error, S::name,
                     " gathers each block's parameters per pass, which a pipeline does not "
                     "schedule; use zero 0, 1 or 2 with pp=", K);
    TESSERA_THROW_IF(cfg.virtual_stages < 1 || cfg.virtual_stages > 1024, config_error,
                     "virtual stages V=", cfg.virtual_stages, " must be in [1, 1024]");
    parallel::check_pipeline(cfg.pipeline,
                             {K, cfg.accum_steps(), static_cast<int>(cfg.virtual_stages)},
                             c.n_layers);
    (void)parallel::partition_stages(c, cfg.seq, K * static_cast<int>(cfg.virtual_stages),
                                     cfg.stage_blocks);
    TESSERA_THROW_IF(cfg.tp != tp, config_error, "tp=", cfg.tp,
                     " does not match the tensor-parallel group's ", tp, " ranks");
    nn::check_tensor_parallel(c, tp);
    if (cfg.sequence_parallel) nn::check_sequence_parallel(cfg.seq, tp);
    return cfg;
  }
  // The files of `files` that virtual stage v writes, from `h`: this
  // chunk's flat parameters of every tp rank (rank r's at r * stride),
  // each tensor reassembled whole (nn::param_entry::full_index) and
  // converted to `dtype`.
  static void write_hf_chunk(const std::filesystem::path& dir, const std::vector<nn::hf_file>& files,
                             int v, const model_type& m, const std::vector<Param>& h,
                             std::int64_t stride, const std::string& dtype) {
    const nn::llama_config& c = m.config();
    const int T = m.tp_size();
    [[maybe_unused]] const std::int64_t n = m.flat_size();  // checked with contracts on
    const std::int64_t lo = m.flat_begin();
    std::vector<nn::param_layout> layouts;
    for (int r = 0; r < T; ++r) layouts.push_back(nn::make_llama_layout(c, {T, r}));
    const std::size_t eb = data::safetensors_dtype_bytes(dtype);
    for (const auto& f : files) {
      if (f.virtual_stage != v) continue;
      std::vector<std::vector<unsigned char>> bytes;
      std::vector<data::safetensors_entry> entries;
      for (const auto& name : f.tensors) {
        const nn::param_entry& e0 = layouts[0].at(name);
        TESSERA_EXPECTS(e0.offset >= lo && e0.offset + e0.numel <= lo + n,
                        "an exported tensor outside its stage's chunk");
        const std::int64_t whole = e0.full.numel();
        std::vector<double> w(static_cast<std::size_t>(whole));
        for (int r = 0; r < (e0.shard_dim < 0 ? 1 : T); ++r) {
          const nn::param_entry& e = layouts[static_cast<std::size_t>(r)].at(name);
          const Param* src = h.data() + static_cast<std::size_t>(r * stride + e.offset - lo);
          for (std::int64_t j = 0; j < e.numel; ++j) {
            const std::int64_t at = e.full_index(j);
            if (at < whole) w[static_cast<std::size_t>(at)] = to<double>(src[j]);
          }
        }
        auto& b = bytes.emplace_back(static_cast<std::size_t>(whole) * eb);
        auto put = [&](auto tag) {
          using D = decltype(tag);
          for (std::int64_t i = 0; i < whole; ++i) {
            const D x = to<D>(w[static_cast<std::size_t>(i)]);
            std::memcpy(b.data() + static_cast<std::size_t>(i) * sizeof(D), &x, sizeof(D));
          }
        };
        if (dtype == "F32") put(float{});
        else if (dtype == "BF16") put(bf16{});
        else if (dtype == "F16") put(fp16{});
        else put(double{});
        std::vector<std::int64_t> shape;
        for (int d = 0; d < e0.full.rank; ++d) shape.push_back(e0.full[d]);
        entries.push_back({nn::hf_tensor_name(name), dtype, shape, b.data(), b.size()});
      }
      data::write_safetensors(dir / f.name, entries, {{"format", "pt"}});
    }
  }
  // Reduces h over the tp, dp and pp groups (every rank of the world ends
  // with the same result; collective).
  void reduce_world(std::vector<double>& h, comm::reduce_op op) {
    const auto n = static_cast<std::int64_t>(h.size());
    tensor<double, Backend> d = kernels::make_tensor<double>(*ctx_, n);
    ctx_->from_host(d.data(), h.data(), h.size() * sizeof(double));
    if constexpr (L::tensor_parallel) layers_.group->all_reduce(d.data(), n, op);
    comm_->all_reduce(d.data(), n, op);
    if (pp_) pp_->all_reduce(d.data(), n, op);
    ctx_->to_host(h.data(), d.data(), h.size() * sizeof(double));
  }
  // Ends an operation that may have failed on some ranks: every rank
  // throws the lowest failing rank's message (train::agree_or_throw).
  void agree_or_throw(std::exception_ptr failed, const std::string& what) {
    auto world = [this](std::vector<double>& v, comm::reduce_op op) { reduce_world(v, op); };
    train::agree_or_throw(world, world_rank(), std::move(failed), what);
  }
  // cfg.init_from_hf opened and its config.json held against the model's
  // (every differing size named at once); nullptr without one.
  static std::shared_ptr<const nn::hf_checkpoint> open_hf(const nn::llama_config& c,
                                                          const train_config& cfg) {
    if (cfg.init_from_hf.empty()) return nullptr;
    auto hf = std::make_shared<const nn::hf_checkpoint>(cfg.init_from_hf);
    const nn::llama_config& h = hf->config();
    std::string diff;
    auto cmp = [&](const char* ours, auto a, const char* theirs, auto b) {
      if (a != b) diff += tessera::detail::str(diff.empty() ? "" : ", ", ours, "=", a, " vs ", theirs, "=", b);
    };
    cmp("dim", c.dim, "hidden_size", h.dim);
    cmp("ffn_dim", c.ffn_dim, "intermediate_size", h.ffn_dim);
    cmp("n_layers", c.n_layers, "num_hidden_layers", h.n_layers);
    cmp("n_heads", c.n_heads, "num_attention_heads", h.n_heads);
    cmp("n_kv_heads", c.n_kv_heads, "num_key_value_heads", h.n_kv_heads);
    cmp("vocab", c.vocab, "vocab_size", h.vocab);
    cmp("max_seq", c.max_seq, "max_position_embeddings", h.max_seq);
    cmp("norm_eps", c.norm_eps, "rms_norm_eps", h.norm_eps);
    cmp("rope_theta", c.rope_theta, "rope_theta", h.rope_theta);
    TESSERA_THROW_IF(!diff.empty(), config_error, "model '", c.name,
                     "' differs from the Hugging Face checkpoint '", cfg.init_from_hf, "': ", diff,
                     " (take the model config from its config.json: nn::llama_config_from_hf)");
    return hf;
  }
  // The layer family as the run configures it (sequence parallelism).
  static L with_config(L layers, const train_config& cfg) {
    if constexpr (L::tensor_parallel) layers.sequence_parallel = cfg.sequence_parallel;
    return layers;
  }
  static nn::llama_options model_options(const train_config& cfg) {
    nn::llama_options o;
    o.ce_chunk = cfg.ce_chunk;
    o.ignore_index = ignore_index;
    o.external_params = S::shards_parameters;
    o.external_grads = S::shards_gradients;
    o.checkpointing = cfg.checkpointing;
    return o;
  }
  static model_type& init_model(model_type& m, std::uint64_t seed) {
    if constexpr (!S::shards_parameters) m.init_weights(seed);
    return m;
  }
  std::uint64_t first_micro_batch() const {
    return data::global_micro_batch(static_cast<std::uint64_t>(comm_->rank()),
                                    static_cast<std::uint64_t>(cfg_.accum_steps()), 0);
  }
  // The feed of the executor: micro-batch a of this step from the loader.
  nn::micro_batch<Param> next_micro_batch(std::int64_t a) {
    (void)a;  // checked only with contracts on
    const data::device_batch b = loader_.next();
    TESSERA_EXPECTS(b.step == static_cast<std::uint64_t>(step_) &&
                        b.micro_batch == first_micro_batch() + static_cast<std::uint64_t>(a),
                    "loader out of order");
    return {b.d_inputs, b.d_targets, nullptr, cfg_.micro_batch, cfg_.seq};
  }
  // The file of this stage's tp rank 0: `path`, or `path`.pp<k> for stage k > 0.
  std::filesystem::path stage_path(const std::filesystem::path& p) const {
    if (stage_ == 0) return p;
    return std::filesystem::path(p.string() + ".pp" + std::to_string(stage_));
  }
  // This rank's shard file: stage_path, and ".tp<r>" for tp rank r > 0.
  std::filesystem::path shard_path(const std::filesystem::path& p) const {
    const std::filesystem::path sp = stage_path(p);
    if (model().tp_size() == 1 || layers_rank() == 0) return sp;
    return std::filesystem::path(sp.string() + ".tp" + std::to_string(layers_rank()));
  }
  int layers_rank() const { return layers_.rank(); }
  std::size_t param_bytes(int c) const {
    return sizeof(Param) * static_cast<std::size_t>(models_[static_cast<std::size_t>(c)]->flat_size());
  }
  // Removes `path`.<what><k>... for every k >= `degree` (files of a run at a
  // larger tp or pp, which this checkpoint replaces). Errors are ignored: a
  // stale shard is refused by its metadata anyway.
  static void remove_stale_shards(const std::filesystem::path& path, const char* what,
                                  int degree) {
    const std::string prefix = path.filename().string() + "." + what;
    const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : ".";
    std::error_code ec;
    std::vector<std::filesystem::path> stale;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
      const std::string n = e.path().filename().string();
      if (n.size() <= prefix.size() || n.compare(0, prefix.size(), prefix) != 0) continue;
      const std::string rest = n.substr(prefix.size());
      const std::size_t digits = rest.find_first_not_of("0123456789");
      const std::string k = rest.substr(0, digits);
      if (k.empty() || k.size() > 4) continue;
      if (digits != std::string::npos && rest.compare(digits, 3, ".tp") != 0) continue;
      if (std::stoi(k) >= degree) stale.push_back(e.path());
    }
    for (const auto& p : stale) std::filesystem::remove(p, ec);
  }

  // ---- forward-only passes through the pipeline (evaluation, generation) ----
  // Tags of forward-only messages: 2 K V + the sending virtual stage, above
  // the training messages' 2 v and 2 v + 1 (checked() keeps 3 K V within
  // MPI's smallest tag bound, 32767).
  int eval_tag() const { return static_cast<int>(2 * cfg_.pp * cfg_.virtual_stages); }
  int virtual_stage(int c) const { return c * static_cast<int>(cfg_.pp) + stage_; }
  int last_virtual_stage() const {
    return static_cast<int>(cfg_.pp * cfg_.virtual_stages) - 1;
  }
  int rank_of_stage(int v) const { return v % static_cast<int>(cfg_.pp); }

  // One (rows, T) batch of windows in host memory through every chunk of
  // this rank in virtual-stage order: the loss sum and scored count on the
  // rank of the last stage, zeros elsewhere (the caller sums over pp).
  nn::loss_sum pipeline_forward_loss(const std::int32_t* h_windows, std::int64_t B, std::int64_t T) {
    const std::int64_t N = B * T;
    std::vector<std::int32_t> h(static_cast<std::size_t>(2 * N));
    std::int64_t scored = 0;
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = 0; t < T; ++t) {
        const std::size_t i = static_cast<std::size_t>(b * T + t);
        h[i] = h_windows[b * (T + 1) + t];
        h[i + static_cast<std::size_t>(N)] = h_windows[b * (T + 1) + t + 1];
        scored += h[i + static_cast<std::size_t>(N)] != ignore_index;
      }
    tensor<std::int32_t, Backend> tok = kernels::make_tensor<std::int32_t>(*ctx_, 2 * N);
    ctx_->from_host(tok.data(), h.data(), h.size() * sizeof(std::int32_t));
    tensor<double, Backend> d_loss = kernels::make_tensor<double>(*ctx_, 1);
    nn::loss_sum r;
    run_forward_only(
        [&](int c) {
          const int v = virtual_stage(c);
          return nn::micro_batch<Param>{v == 0 ? tok.data() : nullptr,
                                        v == last_virtual_stage() ? tok.data() + N : nullptr,
                                        nullptr, B, T};
        },
        [&](int c, const nn::micro_batch<Param>& mb) {
          model(c).forward_loss(mb, d_loss.data());
          ctx_->to_host(&r.sum, d_loss.data(), sizeof(double));
          r.scored = scored;
        },
        false);
    return r;
  }

  // Next-token logits of one sequence through the pipeline: every rank gets
  // the last stage's V logits (broadcast over the pp group).
  void pipeline_logits(const std::int32_t* h_ids, std::int64_t len, float* h_logits) {
    tensor<std::int32_t, Backend> ids = kernels::make_tensor<std::int32_t>(*ctx_, len);
    ctx_->from_host(ids.data(), h_ids, static_cast<std::size_t>(len) * sizeof(std::int32_t));
    const std::int64_t V = model().config().vocab;
    tensor<float, Backend> logits = kernels::make_tensor<float>(*ctx_, V);
    run_forward_only(
        [&](int c) {
          return nn::micro_batch<Param>{virtual_stage(c) == 0 ? ids.data() : nullptr, nullptr,
                                        nullptr, 1, len};
        },
        [&](int c, const nn::micro_batch<Param>& mb) {
          model(c).next_token_logits_from(mb, logits.data());
        },
        true);
    pp_->broadcast(logits.data(), static_cast<std::size_t>(V), static_cast<int>(cfg_.pp) - 1);
    ctx_->to_host(h_logits, logits.data(), static_cast<std::size_t>(V) * sizeof(float));
  }

  // This rank's chunks in virtual-stage order: the hidden states received
  // from the previous virtual stage (except on the first), the chunk's
  // forward_hidden sent to the next, or on the last virtual stage `last`.
  // `whole_rows`: every token row (generation), else the residual stream's.
  template <class Batch, class Last>
  void run_forward_only(Batch&& batch, Last&& last, bool whole_rows) {
    using request = decltype(parallel::detail::p2p_isend(*pp_, static_cast<const Param*>(nullptr),
                                                         0, 0, 0));
    struct send {  // the buffer goes after its request (which waits when destroyed)
      tensor<Param, Backend> buf;
      request req;
    };
    std::vector<send> sends;
    for (int c = 0; c < chunks(); ++c) {
      const int v = virtual_stage(c);
      engine(c).begin_forward_only();
      nn::micro_batch<Param> mb = batch(c);
      const std::int64_t rows =
          whole_rows ? mb.B * mb.T : model(c).stream_rows(mb.B * mb.T);
      tensor<Param, Backend> in;
      if (v > 0) {
        in = kernels::make_tensor<Param>(*ctx_, rows * model(c).config().dim);
        parallel::detail::p2p_recv(*pp_, in.data(), in.numel(), rank_of_stage(v - 1),
                                   eval_tag() + v - 1);
        mb.hidden = in.data();
      }
      if (v == last_virtual_stage()) {
        last(c, mb);
        continue;
      }
      tensor<Param, Backend> x = model(c).forward_hidden(mb, whole_rows);
      request q = parallel::detail::p2p_isend(*pp_, x.data(), x.numel(), rank_of_stage(v + 1),
                                              eval_tag() + v);
      sends.push_back({std::move(x), std::move(q)});
    }
    for (auto& x : sends) x.req.wait();
  }
  void pp_all_reduce_values(double* h, std::size_t n) {
    ctx_->from_host(count_.data(), h, n * sizeof(double));
    pp_->all_reduce(count_.data(), n, comm::reduce_op::sum);
    ctx_->to_host(h, count_.data(), n * sizeof(double));
  }

  // Sum over the ranks of a host value, through the context's memory.
  template <class T>
  T all_reduce_value(T v) {
    double d = static_cast<double>(v);
    all_reduce_values(&d, 1);
    return static_cast<T>(d);
  }
  void all_reduce_values(double* h, std::size_t n) {
    if (comm_->size() == 1) return;
    ctx_->from_host(count_.data(), h, n * sizeof(double));
    comm_->all_reduce(count_.data(), n, comm::reduce_op::sum);
    ctx_->to_host(h, count_.data(), n * sizeof(double));
  }
  void refuse_sharded(const char* what) const {
    TESSERA_THROW_IF(S::shards_optimizer_state, config_error, what, "_checkpoint: ", S::name,
                     " keeps the optimizer state sharded over dp=", comm_->size(),
                     " ranks; sharded checkpoints are not supported yet (use --zero 0 to "
                     "checkpoint a data-parallel run)");
  }

  std::unique_ptr<kernels::owned_context<Ctx>> own_ctx_;  // set after delegation: ctx_ points at it
  const Ctx* ctx_;
  std::optional<C> self_;  // the one-rank communicator of a single-rank trainer
  C* comm_;
  C* pp_;     // the pipeline group (nullptr without a pipeline); not owned
  L layers_;  // the layer family (its tp group under tensor parallelism)
  train_config cfg_;
  int stage_;  // this rank's pipeline stage
  std::shared_ptr<const nn::hf_checkpoint> hf_;  // cfg.init_from_hf, mapped (the models read it)
  nn::tensor_reader hf_reader_;                  // its reader, which the models' options point at
  std::vector<std::unique_ptr<model_type>> models_;    // this rank's chunks (1 unless interleaved)
  std::vector<std::unique_ptr<engine_type>> engines_;  // one per chunk, over the dp group
  std::unique_ptr<executor_type> executor_;
  const data::token_file* data_;
  data::split_view split_;
  data::batch_sampler sampler_;
  data::val_windows val_;
  data::loader_for<Backend> loader_;
  optim::warmup_cosine sched_;
  std::vector<parallel::action> schedule_;
  tensor<double, Backend> scalars_;  // (1 + A): sum of squares, then each micro-batch's loss
  tensor<Master, Backend> clip_;     // (1): the clip coefficient
  tensor<double, Backend> count_;    // (2): host values on their way through a collective
  std::vector<std::int32_t> windows_;  // (B, T+1): the host's scored-token count
  std::int64_t step_ = 0;
  double peak_flops_ = 0, blas_flops_ = 0;
};

}  // namespace tessera::train
