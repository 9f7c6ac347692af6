#pragma once
/// \file train/fit.hpp
/// The training loop, in the library (torchtitan's Trainer.train, with its
/// checkpoint manager and metrics processor; Megatron-LM's train()):
/// `train::fit(trainer, run_options, observers)` runs a composed trainer
/// from its step (or a checkpoint's) to cfg.steps with everything a run
/// does around the steps:
///
///   the run folder `out` locked, a fresh run refused where it holds a
///   checkpoint unless `overwrite` (train/run_folder.hpp) -> resume from
///   `resume`'s newest checkpoint folder (written at any layout; or its
///   checkpoint.bin) -> metrics.jsonl in `out` (a fresh
///   file, or the resumed one cut after the checkpoint's step; the run's
///   settings as its first line) -> each step: train_step, the trace of
///   `trace_step` (Chrome trace JSON, with its measured bubble), an
///   evaluation every cfg.eval_every steps (of cfg.eval_windows windows)
///   and at the end (of the whole held-out split), a line of metrics, a
///   checkpoint folder `out`/step-NNNNNN every `checkpoint_every` steps and
///   at the end (the newest `keep_checkpoints` kept) -> the
///   Hugging Face export -> a sample of `sample_tokens` tokens.
///
/// Observers see the run as it goes (a console log, a progress bar, a
/// user's own metrics sink): train::observer's hooks, called on world rank
/// 0 of the mesh only, the rank that holds every global figure and writes
/// the files. fit itself is collective: every rank of the mesh calls it
/// with the same options.
///
/// A failure inside a step is rethrown as its class with the step named
/// ("step 12 of 100: ..."). A run whose final validation loss is not
/// finite reports `diverged`. Under `stop_on_signals`, SIGINT or SIGTERM
/// on any rank (while a train::stop_signals lives) stops every rank after
/// the same step, with a checkpoint of it (train/stop_signals.hpp):
/// run_end::stopped_by.

#include <chrono>
#include <cmath>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/core/error.hpp"
#include "tessera/kernels/peak.hpp"
#include "tessera/nn/llama_config.hpp"
#include "tessera/train/agree.hpp"
#include "tessera/train/checkpoint_async.hpp"
#include "tessera/train/config.hpp"
#include "tessera/train/metadata.hpp"
#include "tessera/train/metrics.hpp"
#include "tessera/train/run_folder.hpp"
#include "tessera/train/stop_signals.hpp"
#include "tessera/train/trace.hpp"

namespace tessera::train {

/// What train::fit does around the steps (file comment). Paths that are
/// empty turn their part off.
struct run_options {
  /// The run folder: checkpoint folders step-NNNNNN/ (layout-free:
  /// train/checkpoint_folder.hpp) and metrics.jsonl (empty: neither); its
  /// rules are train/run_folder.hpp's.
  std::filesystem::path out;
  /// A fresh run into an `out` that holds a checkpoint replaces that run's
  /// checkpoints (false: it is refused).
  bool overwrite = false;
  /// Hold `out`'s lock for the run (false: the caller holds it already,
  /// as train_llama does from before it writes there).
  bool lock = true;
  /// Agree before each step on a stop that SIGINT or SIGTERM requested
  /// (train::stop_signals; one all-reduce of a flag per step), then save
  /// and return. The same on every rank.
  bool stop_on_signals = false;
  /// A run folder to resume from (train::resume_checkpoint: its newest
  /// complete checkpoint folder, written at any layout, or the
  /// checkpoint.bin of earlier versions); empty: a fresh run.
  std::filesystem::path resume;
  /// A checkpoint every N steps (0: only at the end), into `out`.
  std::int64_t checkpoint_every = 0;
  /// Save checkpoints in the background (train/checkpoint_async.hpp): the
  /// step copies its shares to host memory and training goes on while a
  /// thread writes them; the save completes (its on_checkpoint) at a later
  /// step, the next save or the end, and a failed write ends the run there.
  bool async_checkpoints = false;
  /// Keep the newest N checkpoint folders in `out` (0: all of them).
  int keep_checkpoints = 0;
  /// The run's settings as given: metrics.jsonl's first line (and a
  /// record of each resume after the steps it continues).
  nlohmann::json settings = nlohmann::json::object();
  /// One rank's peak for MFU (kernels::host_peak; a GPU's datasheet rate).
  kernels::peak_flops peak{};
  /// A baseline validation loss (nats per byte) printed and recorded beside
  /// the model's (the 4-gram model of scripts/ngram_baseline.py).
  std::optional<double> baseline;
  /// Bytes per token of the validation split (a tokenizer's); 0: the tokens
  /// are bytes. metrics.jsonl's val_nats_per_byte divides by it.
  double val_bytes_per_token = 0;
  /// A Chrome trace of step `trace_step` (0: the last) to this file.
  std::filesystem::path trace;
  std::int64_t trace_step = 0;
  /// The trained model as a Hugging Face folder (train::export_hf), in
  /// `hf_dtype` (empty: the parameters' own).
  std::filesystem::path export_hf;
  std::string hf_dtype;
  /// Tokens to sample after `prompt` at the end, at `temperature` (0: none).
  std::vector<std::int32_t> prompt;
  std::int64_t sample_tokens = 0;
  double temperature = 0.8;
  /// With `resume`: sample from the checkpoint, no training.
  bool sample_only = false;
};

/// What a run is, for the observers' on_start (trainer-independent).
struct run_start {
  const nn::llama_config* model = nullptr;  ///< the whole model
  const train_config* config = nullptr;     ///< the run (cfg.steps: the planned steps)
  const char* precision = "";               ///< P::name
  const char* optimizer = "";               ///< O::name
  const char* sharding = "";                ///< S::name
  const char* backend = "";                 ///< "host" or "cuda"
  int zero = 0;                             ///< the ZeRO stage
  int dp = 1, tp = 1, pp = 1;               ///< the mesh
  std::int64_t params_per_rank = 0;         ///< parameters this rank holds (its tp shards)
  bool sequence_parallel = false;
  std::vector<nn::stage_range> stages;      ///< every virtual stage's blocks
  std::size_t buckets = 0;                  ///< the data-parallel engine's gradient buckets
  std::int64_t accum_steps = 1;             ///< A, micro-batches per step and rank
  std::int64_t step = 0;                    ///< the step the run starts from (a resume's)
  bool checkpoints = true;                  ///< whether checkpoints are written
  const run_options* options = nullptr;
};

/// How a run ended, for on_end.
struct run_end {
  std::int64_t steps = 0;           ///< cfg.steps
  std::int64_t step = 0;            ///< the step the run ended at (steps, or a stop's)
  double seconds = 0;               ///< wall time of the steps
  std::optional<double> val_loss;   ///< the last evaluation (nats per token)
  bool diverged = false;            ///< the last validation loss was not finite
  std::filesystem::path checkpoint; ///< the last checkpoint written (empty: none)
  std::filesystem::path metrics;    ///< metrics.jsonl (empty: none)
  int stopped_by = 0;               ///< SIGINT or SIGTERM when one stopped the run early (0: none)
};

/// The hooks of train::fit (file comment), each a no-op unless overridden;
/// called on world rank 0 only, in this order: on_start once, then per
/// step on_trace (the traced step), on_step, on_checkpoint; then on_end,
/// on_export, on_sample. An exception from a hook ends the run (as a
/// failure of that rank).
class observer {
 public:
  virtual ~observer() = default;
  /// After a resume and the metrics file's first line, before the first step.
  virtual void on_start(const run_start&) {}
  /// After a step, with its val_loss on evaluation steps.
  virtual void on_step(const step_metrics&) {}
  /// After the traced step's timeline was written to `path` (its bubble measured).
  virtual void on_trace(std::int64_t /*step*/, const std::filesystem::path& /*path*/,
                        const trace_bubble&) {}
  /// After a checkpoint of `step` was written to `path`.
  virtual void on_checkpoint(std::int64_t /*step*/, const std::filesystem::path& /*path*/) {}
  /// After the last step (or the step a stop signal ended the run at).
  virtual void on_end(const run_end&) {}
  /// After the Hugging Face export was written to `dir`.
  virtual void on_export(const std::filesystem::path& /*dir*/) {}
  /// The sample: the prompt followed by the sampled tokens.
  virtual void on_sample(const std::vector<std::int32_t>& /*tokens*/) {}
};

namespace detail {
// Rethrows the exception in flight, `prefix` before its message, as its
// class (config_error, io_error, comm_error, out_of_memory; std::bad_alloc
// as it is; anything else as error).
[[noreturn]] inline void rethrow_with(const std::string& prefix) {
  try {
    throw;
  } catch (const config_error& e) {
    throw config_error(prefix + e.what());
  } catch (const io_error& e) {
    throw io_error(prefix + e.what());
  } catch (const comm_error& e) {
    throw comm_error(prefix + e.what());
  } catch (const out_of_memory& e) {
    throw out_of_memory(prefix + e.what());
  } catch (const std::bad_alloc&) {
    throw;
  } catch (const std::exception& e) {
    throw error(prefix + e.what());
  }
}
}  // namespace detail

/// Runs `tr` to its cfg.steps (file comment); returns how the run ended.
/// Collective over the mesh. Throws what the trainer throws (a failure in
/// a step with the step named), io_error for a metrics file or a
/// checkpoint that cannot be written, config_error for a run folder in use
/// or one that holds another run's checkpoint (agreed across ranks).
template <class Trainer>
run_end fit(Trainer& tr, const run_options& opt, const std::vector<observer*>& observers = {}) {
  namespace fs = std::filesystem;
  const train_config& cfg = tr.config();
  const bool lead = tr.world_rank() == 0;
  auto notify = [&](auto&& f) {
    if (lead)
      for (observer* o : observers) f(*o);
  };
  using S = typename Trainer::engine_type::sharding_type;
  auto world = mesh_reduction(tr.layout(), tr.context());
  const bool checkpoints = !opt.out.empty() && !opt.sample_only;
  run_end end;
  end.steps = cfg.steps;
  if (!opt.out.empty()) end.metrics = opt.out / "metrics.jsonl";
  // The run folder: locked, and a fresh run (or a resume that writes into
  // another folder) refused where it would replace a run's checkpoints;
  // under `overwrite` those go, with an interrupted save's leftovers.
  std::optional<run_folder_lock> lock;
  std::exception_ptr failed;
  if (checkpoints && lead) try {
      std::filesystem::create_directories(opt.out);
      if (opt.lock) lock.emplace(opt.out);
      std::error_code ec;
      if (opt.resume.empty() || !fs::equivalent(opt.resume, opt.out, ec)) {
        check_fresh_run(opt.out, opt.overwrite,
                        "resume it (run_options::resume) or replace it (run_options::overwrite)");
        remove_checkpoints(opt.out);
      }
    } catch (...) {
      failed = std::current_exception();
    }
  agree_or_throw(world, tr.world_rank(), failed, "opening the run folder");
  if (!opt.resume.empty()) tr.load_checkpoint(resume_checkpoint(opt.resume));
  tr.communicator().barrier();
  std::optional<jsonl_writer> metrics;
  if (lead && !opt.sample_only && !end.metrics.empty()) {
    if (!opt.resume.empty()) {
      jsonl_writer::truncate_after(end.metrics, tr.step());
    } else {
      std::error_code ec;
      fs::remove(end.metrics, ec);
    }
    metrics.emplace(end.metrics);
    // The run's whole configuration: the first line of a fresh file, a
    // record of each resume after the steps it continues.
    nlohmann::json rec = {{"config", opt.settings}, {"model", model_metadata(tr.model().config())}};
    if (tr.step() > 0) rec["resumed_at"] = tr.step();
    metrics->write(rec);
  }
  run_start start{&tr.model().config(), &cfg, Trainer::precision_name, Trainer::optimizer_name,
                  S::name, Trainer::backend_name, S::stage, tr.layout().dp(), tr.tp_size(),
                  tr.pp_size(), tr.model().num_params(), tr.model().sequence_parallel(),
                  tr.stages(), tr.engine().plan().size(), cfg.accum_steps(), tr.step(),
                  checkpoints, &opt};
  notify([&](observer& o) { o.on_start(start); });
  tr.set_peak_flops(opt.peak.flops);
  tr.set_blas_flops(opt.peak.blas_flops);
  const auto t_start = std::chrono::steady_clock::now();
  const std::int64_t trace_at = opt.trace_step > 0 ? opt.trace_step : cfg.steps;
  std::int64_t saved = tr.step();  // the step of the newest checkpoint (a resume's)
  auto saved_at = [&](std::int64_t step, const fs::path& ckpt) {
    if (lead && opt.keep_checkpoints > 0) keep_newest_checkpoints(opt.out, opt.keep_checkpoints);
    end.checkpoint = ckpt;
    notify([&](observer& o) { o.on_checkpoint(step, ckpt); });
  };
  // An asynchronous save in flight, and its step: completed at a later
  // step's start once every rank has written (or waited for at the next
  // save and at the end).
  async_checkpoint async;
  std::int64_t async_step = 0;
  auto finish_async = [&](bool wait) {
    fs::path done;
    try {
      done = async.finish(world, wait);
    } catch (...) {
      detail::rethrow_with(tessera::detail::str("the checkpoint of step ", async_step, ": "));
    }
    if (!done.empty()) saved_at(async_step, done);
  };
  auto save = [&](std::int64_t step) {
    const fs::path ckpt = opt.out / checkpoint_folder_name(step);
    saved = step;
    if (opt.async_checkpoints) {
      finish_async(true);  // one save in flight at a time
      tr.begin_checkpoint(ckpt, async);
      async_step = step;
      return;
    }
    tr.save_checkpoint(ckpt);  // agreed: every rank's file, then the metadata
    saved_at(step, ckpt);
  };
  // A stop signal on any rank, agreed before each step.
  auto stop_requested = [&] {
    if (!opt.stop_on_signals) return 0;
    std::vector<double> v{static_cast<double>(stop_signals::requested())};
    world(v, comm::reduce_op::max);
    return static_cast<int>(v[0]);
  };
  while (!opt.sample_only && tr.step() < cfg.steps) {
    if ((end.stopped_by = stop_requested()) != 0) {
      // A second signal during this save ends the process (not consumed yet).
      if (checkpoints) try {
          if (saved != tr.step() && tr.step() > 0) save(tr.step());
          finish_async(true);
        } catch (...) {
          detail::rethrow_with(tessera::detail::str("stopping after step ", tr.step(), " (",
                                                    signal_name(end.stopped_by), "): "));
        }
      stop_signals::consume();  // every rank has read it (the reduction)
      break;
    }
    const std::int64_t at = tr.step() + 1;
    finish_async(false);  // a background save every rank has written: completed
    try {
      const bool traced = !opt.trace.empty() && at == trace_at;
      if (traced) tr.set_tracing(true);
      step_metrics m = tr.train_step();
      if (traced) {
        tr.set_tracing(false);
        const auto events = tr.gather_timeline();  // collective
        if (lead) {
          nlohmann::json meta = {{"dp", tr.layout().dp()},
                                 {"cp", tr.layout().cp()},
                                 {"tp", tr.tp_size()},
                                 {"pp", tr.pp_size()},
                                 {"schedule", parallel::to_string(cfg.pipeline)},
                                 {"virtual_stages", cfg.virtual_stages},
                                 {"micro_batches", cfg.accum_steps()},
                                 {"step", m.step}};
          // Only this rank writes: a failure here must not leave the others
          // waiting in the next collective, so it is reported, not thrown.
          try {
            write_chrome_trace(opt.trace, events, meta);
            const auto b = measure_bubble(events, tr.layout().world_size());
            notify([&](observer& o) { o.on_trace(m.step, opt.trace, b); });
          } catch (const std::exception& e) {
            std::fprintf(stderr, "tessera: warning: %s (the run goes on)\n", e.what());
          }
        }
      }
      const bool last = m.step == cfg.steps;
      const bool eval_now = last || (cfg.eval_every > 0 && m.step % cfg.eval_every == 0);
      // Periodic evaluations use the first eval_windows windows; the last
      // one scores the whole held-out split.
      if (eval_now) end.val_loss = m.val_loss = tr.evaluate(last ? 0 : -1);
      if (lead && metrics) {
        nlohmann::json j = m.to_json();
        j["dp"] = tr.layout().dp();
        j["cp"] = tr.layout().cp();
        j["zero"] = S::stage;
        j["tp"] = tr.tp_size();
        j["pp"] = tr.pp_size();
        if (opt.baseline) j["baseline_4gram"] = *opt.baseline;
        if (m.val_loss)  // nats per byte whatever the tokenizer (bytes: the same number)
          j["val_nats_per_byte"] = opt.val_bytes_per_token > 0
                                       ? *m.val_loss / opt.val_bytes_per_token
                                       : *m.val_loss;
        metrics->write(j);
      }
      notify([&](observer& o) { o.on_step(m); });
      if (checkpoints &&
          ((opt.checkpoint_every > 0 && m.step % opt.checkpoint_every == 0) || last))
        save(m.step);
    } catch (...) {
      detail::rethrow_with(tessera::detail::str("step ", at, " of ", cfg.steps, ": "));
    }
  }
  if (!opt.sample_only) finish_async(true);  // the last save, written in the background
  // A stop asked for during the last step: the run is saved; the export
  // and the sample are skipped.
  if (!opt.sample_only && end.stopped_by == 0 && (end.stopped_by = stop_requested()) != 0)
    stop_signals::consume();
  end.step = tr.step();
  end.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  end.diverged = end.val_loss && !std::isfinite(*end.val_loss);
  if (!opt.sample_only) notify([&](observer& o) { o.on_end(end); });
  // Checked before anything is exported or sampled.
  if (end.diverged || end.stopped_by != 0) return end;
  if (!opt.export_hf.empty()) {  // every rank takes part (tp gathers, each stage its files)
    tr.export_hf(opt.export_hf, opt.hf_dtype);
    notify([&](observer& o) { o.on_export(opt.export_hf); });
  }
  if (opt.sample_tokens > 0) {  // every rank generates (zero 3 gathers)
    const auto tokens = tr.generate(opt.prompt, opt.sample_tokens, opt.temperature, cfg.seed);
    notify([&](observer& o) { o.on_sample(tokens); });
  }
  return end;
}

}  // namespace tessera::train
