// train_llama's typed half: the one dispatch from names to types (written
// once for both backends), the ranks of the run's world (threads, MPI
// processes, or GPUs over NCCL), and the call to train::fit on each rank.
// Instantiated per (backend, precision) in run_host_*.cpp and run_cuda.cpp,
// so the trainers compile in parallel.
#pragma once

#include <omp.h>

#include <array>
#include <filesystem>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/comm/device_mesh.hpp"
#include "tessera/comm/launch.hpp"
#include "tessera/comm/local.hpp"
#include "tessera/core/file.hpp"
#include "tessera/data/hf_tokenizer.hpp"
#include "tessera/data/prepare.hpp"
#include "tessera/kernels/blas.hpp"
#include "tessera/kernels/peak.hpp"
#include "tessera/nn/tensor_parallel.hpp"
#include "tessera/optim/sgd.hpp"
#include "tessera/plan/host_memory.hpp"
#include "tessera/plan/memory.hpp"
#include "tessera/train/console.hpp"
#include "tessera/train/fit.hpp"
#include "tessera/train/trainer.hpp"
#if defined(TESSERA_HAS_MPI) && TESSERA_HAS_MPI
#include "tessera/comm/mpi.hpp"
#endif

namespace train_llama {

namespace fs = std::filesystem;
using namespace tessera;

/// The command line's settings (main.cpp defines them and their checks).
struct options {
  std::string backend = "host", precision, optimizer = "adamw", checkpointing, preset = "small";
  std::string data, data_format = "auto", out = "runs/main", resume, tokenizer, prompt = "The ";
  std::string schedule = "1f1b", trace, comm = "auto", init_from_hf, export_hf, hf_dtype;
  std::string grad_reduce = "step";  // when gradient buckets reduce: step or micro-batch
  train::train_config cfg;
  std::int64_t checkpoint_layers = 1, checkpoint_every = 200, sample_bytes = 300, trace_step = 0;
  std::optional<std::int64_t> dim, layers, heads, kv_heads, ffn, vocab;
  std::optional<double> baseline;
  bool no_baseline = false, sample_only = false, parallel = false;
  int dp = 1, tp = 1, zero = 0;
  double peak_tflops = 0, bucket_mb = 25, comm_timeout = 300;
  std::uint64_t data_vocab = 0;          // the token file's vocabulary (set by main)
  std::vector<std::int32_t> prompt_ids;  // with a tokenizer: the prompt's ids
  double val_bytes_per_token = 0;        // with a tokenizer: the validation split's
  std::string config_toml;               // the settings as given: OUT/run.toml
  nlohmann::json config_json;            // all of them: metrics.jsonl's first line
  std::int64_t planned_steps = 0;        // --resume: the steps the checkpoint's run planned
};

/// The reporting of a failure (main.cpp): one line, the exit status.
int report_failure(const options& o);

/// The model sizes: the config.json of --init-from-hf, or the preset with
/// the --dim/--layers/... overrides; the vocabulary follows the data
/// unless --vocab sets it.
inline nn::llama_config model_config(const options& o) {
  if (!o.init_from_hf.empty()) return nn::llama_config_from_hf_folder(o.init_from_hf);
  nn::llama_config mc = nn::llama_config::from_name(o.preset);
  if (o.dim) mc.dim = *o.dim;
  if (o.layers) mc.n_layers = *o.layers;
  if (o.heads) mc.n_heads = *o.heads;
  if (o.kv_heads) mc.n_kv_heads = *o.kv_heads;
  if (o.ffn) mc.ffn_dim = *o.ffn;
  if (o.vocab)
    mc.vocab = *o.vocab;
  else if (o.data_vocab > 0)
    mc.vocab = static_cast<std::int64_t>(o.data_vocab);
  return mc;
}

/// The run's train_config: the options' with the degrees, the schedule and
/// the activation checkpointing.
inline train::train_config run_config(const options& o) {
  train::train_config c = o.cfg;
  c.dp = o.dp;
  c.tp = o.tp;
  c.pipeline = parallel::parse_schedule_kind(o.schedule);
  c.checkpointing = {nn::parse_checkpointing(o.checkpointing), o.checkpoint_layers};
  if (o.resume.empty()) c.init_from_hf = o.init_from_hf;  // a resume loads its own weights
  return c;
}

inline comm::comm_options comm_opts(const options& o) {
  comm::comm_options c;
  c.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(o.comm_timeout * 1000));
  return c;
}

/// The observer of what only train_llama does around train::fit: the
/// settings as given in OUT/run.toml (read back by --resume OUT) once the
/// run has started (outputs are kept from then on), and the data's
/// tokenizer beside a Hugging Face export.
struct cli_observer : train::observer {
  options& o;
  created_paths& created;
  cli_observer(options& opts, created_paths& c) : o(opts), created(c) {}
  void on_start(const train::run_start&) override {
    if (o.sample_only) return;
    write_file_atomically(fs::path(o.out) / "run.toml",
                          [&](std::ofstream& f) { f << o.config_toml; });
    created.keep();
  }
  void on_export(const fs::path& dir) override {
    if (!o.tokenizer.empty())
      fs::copy_file(o.tokenizer, dir / "tokenizer.json", fs::copy_options::overwrite_existing);
  }
};

/// One rank's run: train::fit over the trainer with the console log.
/// Returns the exit status (1 when the run diverged).
template <class Trainer>
int fit_rank(options& o, Trainer& tr, const data::token_file& data, const fs::path& tok,
             created_paths& created, const kernels::peak_flops& peak) {
  train::run_options r;
  r.out = o.out;
  r.resume = o.resume.empty() ? fs::path() : fs::path(o.resume);
  r.checkpoint_every = o.checkpoint_every;
  r.settings = o.config_json;
  r.peak = peak;
  r.baseline = o.baseline;
  if (tr.world_rank() == 0 && !o.sample_only && !o.no_baseline && !r.baseline)
    r.baseline = data::ngram_baseline(tok, o.data);
  r.val_bytes_per_token = o.tokenizer.empty() ? 0 : o.val_bytes_per_token;
  r.trace = o.trace;
  r.trace_step = o.trace_step;
  r.export_hf = o.export_hf;
  r.hf_dtype = o.hf_dtype;
  r.prompt = o.prompt_ids;
  if (o.tokenizer.empty()) {
    const auto ids = data::byte_tokenizer::encode(o.prompt);
    r.prompt.assign(ids.begin(), ids.end());
  }
  r.sample_tokens = o.sample_bytes;
  r.sample_only = o.sample_only;
  train::console_log::options c;
  c.data_path = tok.string();
  c.tokenizer = o.tokenizer;
  c.data = &data;
  c.communicator = o.comm;
  c.planned_steps = o.planned_steps;
  if (!o.tokenizer.empty())
    c.decode = [t = data::hf_tokenizer(o.tokenizer)](const std::vector<std::int32_t>& ids) {
      return t.decode(std::vector<std::uint32_t>(ids.begin(), ids.end()));
    };
  train::console_log log(std::move(c));
  cli_observer cli(o, created);
  return train::fit(tr, r, {&cli, &log}).diverged ? 1 : 0;
}

/// The ranks of the run's world on `Backend`: world<host> runs them as
/// threads (--comm local) or as this MPI process (--comm mpi);
/// world<cuda> (run_cuda.cpp) as this process's GPU over NCCL. run(o, f)
/// calls f(world communicator, one rank's peak) on every rank.
template <class Backend>
struct world;

template <>
struct world<host> {
  static constexpr bool one_device = false;  // one rank is a world of one thread
  static kernels::peak_flops peak(const options& o, int threads, double blas) {
    auto p = kernels::host_peak(threads, blas, o.peak_tflops * 1e12);
    p.how += tessera::detail::str(", BLAS ", kernels::blas_core_name());
    return p;
  }
  template <class Ranks>
  static int run(options& o, Ranks&& ranks) {
    const int n = o.dp * o.tp * static_cast<int>(o.cfg.pp);
    if (o.comm == "local") {  // threads, each with its share of the OpenMP threads
      const int per_rank = std::max(1, omp_get_max_threads() / n);
      const auto pk = peak(o, per_rank, kernels::measure_sgemm_flops() / n);
      int rc = 0;
      comm::local_world::run(
          n,
          [&](comm::local_communicator& w) {
            omp_set_num_threads(per_rank);
            const int r = ranks(w, pk);
            if (w.rank() == 0) rc = r;
          },
          comm_opts(o));
      return rc;
    }
#if defined(TESSERA_HAS_MPI) && TESSERA_HAS_MPI
    comm::mpi_environment env;
    comm::mpi_communicator w(MPI_COMM_WORLD, comm_opts(o));
    return comm::mpi_run_notifying(
        [&] {
          // Ranks launched with different options stop here, before any
          // group is split or collective issued, naming the option.
          auto reduce = train::world_reduction(w);
          train::agree_settings(reduce, w.rank(), o.config_json, "train_llama's options");
          double blas = w.rank() == 0 ? kernels::measure_sgemm_flops() : 0.0;
          w.broadcast(&blas, 1, 0);
          TESSERA_THROW_IF(w.size() != n, config_error, "--comm mpi: the mesh dp=", o.dp,
                           " x tp=", o.tp, " x pp=", o.cfg.pp, " needs ", n,
                           " MPI processes but the job has ", w.size(), " (start it as mpirun -np ",
                           n, " ...)");
          return ranks(w, peak(o, omp_get_max_threads(), blas));
        },
        [&] { return report_failure(o); });
#else
    throw config_error("--comm '" + o.comm + "': this build has no MPI (valid: local)");
#endif
  }
};

/// Refuses, before anything is allocated, a host run that cannot fit the
/// memory this machine's ranks share (plan::check_host_fit): first its
/// model state (weights, gradients, master weights, optimizer state under
/// this --zero and --tp: the planner's persistent bytes), then one step
/// (the state, the activation peak of a micro-batch and the loader's
/// buffers), naming the settings and the limit.
inline void check_host_memory(const options& o, const plan::dtype_sizes& d) {
  const std::uint64_t avail = plan::available_host_memory();
  if (avail == 0) return;
  const nn::llama_config mc = model_config(o);
  const train::train_config rc = run_config(o);
  const plan::sharding sh{
      o.zero, o.dp, 0, std::max<std::int64_t>(1, std::llround(o.bucket_mb * 1e6)), 0, o.tp, 0};
  plan::activation_options a;
  a.micro_batch = rc.micro_batch;
  a.seq = rc.seq;
  a.model.ce_chunk = rc.ce_chunk;
  a.model.checkpointing = rc.checkpointing;
  a.micro_batches = rc.accum_steps();
  a.tp = o.tp;
  a.sequence_parallel = rc.sequence_parallel;
  const auto m = plan::plan_memory(mc, d, plan::optimizer_spec::from_name(o.optimizer), sh, a);
  // Ranks on this machine: threads of this process, or mpirun's local size;
  // stages split the layers, so a pipeline's ranks hold one copy between them.
  const double here = o.comm == "mpi" || comm::launched_by_mpi()
                          ? comm::launched_world().local_size
                          : static_cast<double>(o.dp) * o.tp * static_cast<double>(o.cfg.pp);
  const double stages = static_cast<double>(std::max<std::int64_t>(1, rc.pp));
  plan::check_host_fit(
      static_cast<double>(m.state.persistent()) * here / stages, avail,
      "the model state of this run",
      tessera::detail::str(mc.num_params(), " parameters of --dim ", mc.dim, " --layers ",
                           mc.n_layers, " --ffn ", mc.ffn_dim, " --vocab ", mc.vocab,
                           ": weights, gradients and optimizer state under --precision ",
                           o.precision, " --zero ", o.zero, ", ", here,
                           " rank(s) on this machine; the planner, plan/memory.hpp"),
      "reduce the model, or shard its state over more machines (--zero, --dp, --tp, --pp under "
      "mpirun)");
  plan::check_host_fit(
      static_cast<double>(m.total()) * here / stages, avail, "one step of this run",
      tessera::detail::str("--micro-batch ", rc.micro_batch, " x --seq ", rc.seq, ": activations ",
                           std::llround(static_cast<double>(m.activations.peak) / plan::gib),
                           " GiB and loader buffers beside the model state, ", here,
                           " rank(s) on this machine; the planner, plan/memory.hpp"),
      "reduce --micro-batch (the accumulation keeps --global-batch) or --seq, or recompute "
      "activations (--checkpointing full)");
}

/// Trains with policies (Backend, P, O, S) and dense or tensor-parallel
/// layers: every check on this thread first (train::validate, and on the
/// host the planner against the machine's memory), then the trainer of
/// each rank on its groups of the dp x tp x pp mesh, and train::fit.
template <class Backend, class P, class O, class S, bool TP>
int launch(options& o, const fs::path& tok, created_paths& created) {
  const comm::device_mesh mesh(o.dp, o.tp, static_cast<int>(o.cfg.pp));
  parallel::data_parallel_options dpo;
  dpo.bucket_bytes = static_cast<std::int64_t>(o.bucket_mb * 1e6);
  dpo.reduction = parallel::parse_grad_reduction(o.grad_reduce);
  {
    const data::token_file data(tok);
    train::validate<S>(model_config(o), run_config(o), data, mesh, dpo);
  }
  auto ranks = [&](auto& w, const kernels::peak_flops& peak) {
    using Comm = std::remove_reference_t<decltype(w)>;
    using L = std::conditional_t<TP, nn::tensor_parallel_layers<Comm>, nn::dense_layers>;
    auto g = comm::make_groups(w, mesh);
    L layers{};
    if constexpr (TP) layers.group = &g.tp;
    const data::token_file data(tok);
    train::trainer<P, Backend, O, S, Comm, L> tr(model_config(o), run_config(o), data,
                                                 parallel::layout{g.dp, layers, g.pp}, dpo);
    return fit_rank(o, tr, data, tok, created, peak);
  };
  if constexpr (std::is_same_v<Backend, host>) check_host_memory(o, plan::dtype_sizes::of<P>());
  if constexpr (world<Backend>::one_device && S::stage == 0 && !TP)
    if (!o.parallel) return world<Backend>::template run_one<P, O>(o, tok, created);
  return world<Backend>::run(o, ranks);
}

/// Calls f(std::type_identity<T>{}) for the T of `types` whose name in
/// `names` (same order) is `name`; throws config_error listing the names.
template <class... T, class F>
int pick(const char* what, const std::string& name,
         const std::array<const char*, sizeof...(T)>& names, F&& f) {
  int rc = 0;
  std::size_t i = 0;
  const bool found =
      ((names[i++] == name ? (rc = f(std::type_identity<T>{}), true) : false) || ...);
  if (found) return rc;
  std::string valid;
  for (const char* n : names) valid += (valid.empty() ? "" : ", ") + std::string(n);
  throw config_error(tessera::detail::str("unknown ", what, " '", name, "' (valid: ", valid, ")"));
}

/// The dispatch from names to types, once for both backends: the
/// optimizer, the ZeRO stage and the layer family of precision P on
/// Backend (run_host_<p>.cpp and run_cuda.cpp instantiate it).
template <class Backend, class P>
int run_precision(options& o, const fs::path& tok, created_paths& created) {
  return pick<optim::adamw, optim::sgd>("optimizer", o.optimizer, {"adamw", "sgd"}, [&](auto opt) {
    using O = typename decltype(opt)::type;
    return pick<parallel::zero<0>, parallel::zero<1>, parallel::zero<2>, parallel::zero<3>>(
        "ZeRO stage", std::to_string(o.zero), {"0", "1", "2", "3"}, [&](auto zero) {
          using S = typename decltype(zero)::type;
          return o.tp > 1 ? launch<Backend, P, O, S, true>(o, tok, created)
                          : launch<Backend, P, O, S, false>(o, tok, created);
        });
  });
}

extern template int run_precision<host, precision::fp32>(options&, const fs::path&, created_paths&);
extern template int run_precision<host, precision::bf16_mixed>(options&, const fs::path&,
                                                               created_paths&);
extern template int run_precision<host, precision::bf16_mixed_bf16_grads>(options&, const fs::path&,
                                                                          created_paths&);
extern template int run_precision<host, precision::fp64>(options&, const fs::path&, created_paths&);

/// --backend cuda (run_cuda.cpp): the precision's instantiation, or a
/// config_error in builds without the CUDA backend.
int run_cuda(options& o, const fs::path& tok, created_paths& created);

}  // namespace train_llama
