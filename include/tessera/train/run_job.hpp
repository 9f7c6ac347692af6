#pragma once
/// \file train/run_job.hpp
/// Running a prepared job (train/job_data.hpp) on every rank of its world:
/// the one dispatch from the job's names (optimizer, ZeRO stage) to the
/// trainer's types, written once for both backends
/// (dispatch_job<Backend, P>); the ranks (job_world<Backend>: threads or
/// MPI processes on the host; a build with the CUDA backend specializes
/// job_world<cuda>, one GPU per MPI process over NCCL); and train::fit on
/// each rank with the console log and the job's own observer (run.toml,
/// the tokenizer beside an export).
///
///   train::job j;  j.preset = "tiny";  j.cfg.steps = 50;  j.out = "runs/t";
///   train::check_job(j);
///   created_paths created;  train::job_session s;
///   if (train::prepare_job(j, created, s))
///     return train::dispatch_job<host, precision::fp32>(j, s.tokens, created);

#include <omp.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <type_traits>
#include <utility>
#include <vector>

#include "tessera/comm/any_communicator.hpp"
#include "tessera/comm/device_mesh.hpp"
#include "tessera/comm/local.hpp"
#include "tessera/core/dispatch.hpp"
#include "tessera/core/file.hpp"
#include "tessera/data/hf_tokenizer.hpp"
#include "tessera/data/prepare.hpp"
#include "tessera/kernels/blas.hpp"
#include "tessera/kernels/peak.hpp"
#include "tessera/nn/tensor_parallel.hpp"
#include "tessera/optim/adafactor.hpp"
#include "tessera/optim/lion.hpp"
#include "tessera/optim/muon.hpp"
#include "tessera/optim/sgd.hpp"
#include "tessera/train/agree.hpp"
#include "tessera/train/console.hpp"
#include "tessera/train/fit.hpp"
#include "tessera/train/job_data.hpp"
#include "tessera/train/stop_signals.hpp"
#include "tessera/train/trainer.hpp"
#include "tessera/train/validate.hpp"
#if defined(TESSERA_HAS_MPI) && TESSERA_HAS_MPI
#include "tessera/comm/mpi.hpp"
#endif

namespace tessera::train {

/// What a job does around train::fit beyond the console log: writes the
/// settings as given to OUT/run.toml (read back by --resume OUT) once the
/// run has started (its outputs are kept from then on), and copies the
/// data's tokenizer beside a Hugging Face export.
struct job_observer : observer {
  job& j;
  created_paths& created;
  job_observer(job& jb, created_paths& c) : j(jb), created(c) {}
  void on_start(const run_start&) override {
    if (j.sample_only) return;
    write_file_atomically(std::filesystem::path(j.out) / "run.toml",
                          [&](std::ofstream& f) { f << j.config_toml; });
    created.keep();
  }
  void on_export(const std::filesystem::path& dir) override {
    if (!j.tokenizer.empty())
      std::filesystem::copy_file(j.tokenizer, dir / "tokenizer.json",
                                 std::filesystem::copy_options::overwrite_existing);
  }
};

/// train::fit's run_options of the job on a rank of world rank `rank`
/// (rank 0 measures the 4-gram baseline of the data at `tok`).
inline run_options run_options_of(const job& j, int rank, const std::filesystem::path& tok) {
  run_options r;
  r.out = j.out;
  r.resume = j.resume.empty() ? std::filesystem::path() : std::filesystem::path(j.resume);
  r.checkpoint_every = j.checkpoint_every;
  r.keep_checkpoints = j.keep;
  r.async_checkpoints = j.async_save;
  r.overwrite = j.overwrite;
  r.lock = false;  // the job holds it from before it writes there (job_session)
  r.stop_on_signals = true;  // run_job holds the stop_signals
  r.settings = j.config_json;
  r.baseline = j.baseline;
  if (rank == 0 && !j.sample_only && !j.no_baseline && !r.baseline)
    r.baseline = data::ngram_baseline(tok, j.data);
  r.val_bytes_per_token = j.tokenizer.empty() ? 0 : j.val_bytes_per_token;
  r.trace = j.trace;
  r.trace_step = j.trace_step;
  r.export_hf = j.export_hf;
  r.hf_dtype = j.hf_dtype;
  r.prompt = j.prompt_ids;
  if (j.tokenizer.empty()) {
    const auto ids = data::byte_tokenizer::encode(j.prompt);
    r.prompt.assign(ids.begin(), ids.end());
  }
  r.sample_tokens = j.sample_bytes;
  r.sample_only = j.sample_only;
  return r;
}

/// One rank's run of the job: train::fit over `tr` with the console log
/// and the job_observer. Returns the exit status: 1 when the run diverged,
/// 128 + the signal when SIGINT or SIGTERM stopped it (as a shell reports
/// a process a signal ended, so a script can tell it from a finished run).
template <class Trainer>
int fit_job(job& j, Trainer& tr, const data::token_file& data, const std::filesystem::path& tok,
            created_paths& created, const kernels::peak_flops& peak) {
  run_options r = run_options_of(j, tr.world_rank(), tok);
  r.peak = peak;
  console_log::options c;
  c.data_path = tok.string();
  c.tokenizer = j.tokenizer;
  c.data = &data;
  c.communicator = j.comm;
  c.planned_steps = j.planned_steps;
  if (!j.tokenizer.empty())
    c.decode = [t = data::hf_tokenizer(j.tokenizer)](const std::vector<std::int32_t>& ids) {
      return t.decode(std::vector<std::uint32_t>(ids.begin(), ids.end()));
    };
  console_log log(std::move(c));
  job_observer obs(j, created);
  const run_end e = fit(tr, r, {&obs, &log});
  return e.stopped_by != 0 ? 128 + e.stopped_by : e.diverged ? 1 : 0;
}

/// The ranks of a job's world on `Backend`. run(j, ranks) calls
/// ranks(world communicator, one rank's peak) on every rank and returns
/// rank 0's exit status.
template <class Backend>
struct job_world;

/// The host's world: dp x cp x tp x pp threads of this process (--comm local,
/// each with its share of the OpenMP threads), or this MPI process
/// (--comm mpi; the job's settings agreed first on every rank). Either
/// is handed to the ranks as a `comm_type`, so each trainer is compiled
/// once for both.
template <>
struct job_world<host> {
  static constexpr bool one_device = false;  // one rank is a world of one thread
#if defined(TESSERA_HAS_MPI) && TESSERA_HAS_MPI
  using comm_type = comm::any_communicator<comm::local_communicator, comm::mpi_communicator>;
#else
  using comm_type = comm::any_communicator<comm::local_communicator>;
#endif
  /// One rank's peak for MFU: `threads` threads, `blas` measured FLOP/s.
  static kernels::peak_flops peak(const job& j, int threads, double blas) {
    auto p = kernels::host_peak(threads, blas, j.peak_tflops * 1e12);
    p.how += tessera::detail::str(", BLAS ", kernels::blas_core_name());
    return p;
  }
  template <class Ranks>
  static int run(job& j, Ranks&& ranks) {
    const int n = j.world_size();
    if (j.comm == "local") {
      const int per_rank = std::max(1, omp_get_max_threads() / n);
      const auto pk = peak(j, per_rank, kernels::measure_sgemm_flops() / n);
      int rc = 0;
      comm::local_world::run(
          n,
          [&](comm::local_communicator& w) {
            omp_set_num_threads(per_rank);
            comm_type world(w.split(0, w.rank()));
            const int r = ranks(world, pk);
            if (w.rank() == 0) rc = r;
          },
          comm_options_of(j));
      return rc;
    }
#if defined(TESSERA_HAS_MPI) && TESSERA_HAS_MPI
    comm::mpi_environment env;
    comm::mpi_communicator w(MPI_COMM_WORLD, comm_options_of(j));
    return comm::mpi_run_notifying(
        [&] {
          // Ranks launched with different options stop here, before any
          // group is split or collective issued, naming the option.
          auto reduce = world_reduction(w);
          agree_settings(reduce, w.rank(), j.config_json, j.program + "'s options");
          double blas = w.rank() == 0 ? kernels::measure_sgemm_flops() : 0.0;
          w.broadcast(&blas, 1, 0);
          TESSERA_THROW_IF(w.size() != n, config_error, "--comm mpi: the mesh dp=", j.dp,
                           " x cp=", j.cfg.cp, " x tp=", j.tp, " x pp=", j.cfg.pp, " needs ", n,
                           " MPI processes but the job has ", w.size(), " (start it as mpirun -np ",
                           n, " ...)");
          comm_type world(w.split(0, w.rank()));
          return ranks(world, peak(j, omp_get_max_threads(), blas));
        },
        [&] { return report_failure(j); });
#else
    throw config_error("--comm '" + j.comm + "': this build has no MPI (valid: local)");
#endif
  }
};

/// Trains the job with policies (Backend, P, O, S): every check on this
/// thread first (train::validate, and on the host the planner against the
/// machine's memory), then the trainer of each rank on its groups of the
/// dp x cp x tp x pp mesh, and fit_job. Returns the exit status.
///
/// The layers are the tensor-parallel family at every tp, as
/// Megatron-Core's are: at tp 1 its collectives are over a group of one
/// (nn::all_reduce returns at once), and each (precision, optimizer, ZeRO
/// stage) compiles one trainer rather than two. One device without a
/// communicator (job_world::one_device, no --comm) runs the plain
/// single-device trainer.
template <class Backend, class P, class O, class S>
int run_job(job& j, const std::filesystem::path& tok, created_paths& created) {
  const comm::device_mesh mesh(comm::mesh_degrees{.dp = j.dp,
                                                 .cp = static_cast<int>(j.cfg.cp),
                                                 .tp = j.tp,
                                                 .pp = static_cast<int>(j.cfg.pp)});
  const parallel::data_parallel_options dpo = data_parallel_options_of(j);
  {
    const data::token_file data(tok);
    validate<S, P>(model_config(j), run_config(j), data, mesh, dpo);
  }
  auto ranks = [&](auto& w, const kernels::peak_flops& peak) {
    using Comm = std::remove_reference_t<decltype(w)>;
    using L = nn::tensor_parallel_layers<Comm>;
    auto g = comm::make_groups(w, mesh);
    L layers{};
    layers.group = &g.tp;
    const data::token_file data(tok);
    trainer<P, Backend, O, S, Comm, L> tr(model_config(j), run_config(j), data,
                                          parallel::layout{g, layers}, dpo);
    return fit_job(j, tr, data, tok, created, peak);
  };
  if constexpr (std::is_same_v<Backend, host>) check_host_memory(j, plan::dtype_sizes::of<P>());
  // SIGINT and SIGTERM stop the run after a step with a checkpoint; set
  // on every process before its ranks exist (train/stop_signals.hpp).
  const stop_signals stop;
  if constexpr (job_world<Backend>::one_device && S::stage == 0)
    if (!j.parallel) return job_world<Backend>::template run_one<P, O>(j, tok, created);
  return job_world<Backend>::run(j, ranks);
}

/// The dispatch from the job's names to types, once for both backends: the
/// optimizer and the ZeRO stage of precision P on Backend, then run_job.
/// Throws config_error for an unknown name.
template <class Backend, class P>
int dispatch_job(job& j, const std::filesystem::path& tok, created_paths& created) {
  return pick<optim::adamw, optim::sgd, optim::lion, optim::adafactor, optim::muon>(
      "optimizer", j.optimizer, {"adamw", "sgd", "lion", "adafactor", "muon"}, [&](auto opt) {
        using O = typename decltype(opt)::type;
        return pick<parallel::zero<0>, parallel::zero<1>, parallel::zero<2>, parallel::zero<3>>(
            "ZeRO stage", std::to_string(j.zero), {"0", "1", "2", "3"}, [&](auto zero) {
              using S = typename decltype(zero)::type;
              return run_job<Backend, P, O, S>(j, tok, created);
            });
      });
}

}  // namespace tessera::train
