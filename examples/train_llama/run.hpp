// train_llama's shared parts: the options, the checks and helpers main.cpp
// runs before any training, and the one loop every trainer runs
// (train::trainer<P, Backend, Optimizer, Sharding, Communicator>: one CPU
// rank, thread or MPI ranks, one GPU or NCCL ranks). The trainers are
// instantiated in run_host_*.cpp and run_cuda.cpp, one translation unit per
// precision, so they compile in parallel.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tessera/comm/communicator.hpp"
#include "tessera/comm/device_mesh.hpp"
#include "tessera/core/file.hpp"
#include "tessera/data/fingerprint.hpp"
#include "tessera/data/hf_tokenizer.hpp"
#include "tessera/data/token_file.hpp"
#include "tessera/data/tokenizer.hpp"
#include "tessera/kernels/peak.hpp"
#include "tessera/nn/checkpointing.hpp"
#include "tessera/nn/hf_llama.hpp"
#include "tessera/nn/llama_config.hpp"
#include "tessera/plan/state.hpp"
#include "tessera/train/agree.hpp"
#include "tessera/train/metadata.hpp"
#include "tessera/train/metrics.hpp"
#include "tessera/train/trainer.hpp"
#if defined(TESSERA_HAS_MPI) && TESSERA_HAS_MPI
#include "tessera/comm/mpi.hpp"
#endif

namespace train_llama {

namespace fs = std::filesystem;
using namespace tessera;

struct options {
  std::string backend = "host";        // host, or cuda (builds with the cuda preset)
  double peak_tflops = 0;              // the peak for MFU; 0: theoretical (host) or datasheet (GPU)
  std::string checkpointing;           // none or full; default: none on the host, full on cuda
  std::int64_t checkpoint_layers = 1;  // with full: every k-th block recomputes
  std::string preset = "small";
  std::string data;                  // default: data/fortunes.txt found by find_resource
  std::string data_format = "auto";  // auto (by extension), text or tokens
  std::string
      precision;  // fp32, bf16, bf16_mixed_bf16_grads, fp64; default: fp32 / bf16 grads on cuda
  std::string optimizer = "adamw";  // adamw or sgd
  std::string out = "runs/main";
  std::string resume;
  train::train_config cfg;
  std::int64_t checkpoint_every = 200;
  std::int64_t sample_bytes = 300;
  std::optional<double> baseline;
  bool no_baseline = false;
  std::string prompt = "The ";
  int dp = 1;
  int tp = 1;  // tensor-parallel degree (threads with --comm local, or MPI ranks)
  std::string schedule = "1f1b";  // pipeline schedule: gpipe, 1f1b, interleaved, zb1
  std::string trace;              // Chrome trace JSON of one step ("": none)
  std::int64_t trace_step = 0;    // the traced step (0: the last)
  int zero = 0;                   // ZeRO stage of the data-parallel path
  std::string comm = "auto";  // local, mpi, nccl, or auto (mpi or nccl under mpirun, else local)
  double bucket_mb = 25;      // gradient bucket size of the data-parallel path
  double comm_timeout = 300;  // seconds a collective or message may wait (comm_options::timeout)
  bool parallel = false;      // the data-parallel path (dp > 1, --zero, --comm or mpirun)
  // Overrides of the preset's sizes.
  std::optional<std::int64_t> dim, layers, heads, kv_heads, ffn;
  std::string init_from_hf;  // a Hugging Face Llama folder to start from ("": seeded weights)
  std::string export_hf;     // a folder to write the trained model to as a Hugging Face Llama
  std::string hf_dtype;      // the export's dtype ("": bfloat16 for bf16 weights, else float32)
  bool sample_only = false;  // with --resume: sample from the checkpoint, no training
  std::optional<std::int64_t> vocab;  // the model's vocabulary; default: the data's
  std::uint64_t data_vocab = 0;       // the token file's vocabulary (set by main)
  std::string tokenizer;              // a tokenizer.json (default: beside the data, if there)
  // With a tokenizer: the prompt's ids and the validation split's bytes per token.
  std::vector<std::int32_t> prompt_ids;
  double val_bytes_per_token = 0;
  // The run's settings as given (CLI11's TOML, explicitly set options only:
  // DIR/run.toml, read back by --resume DIR) and all of them (metrics.jsonl's
  // first line).
  std::string config_toml;
  nlohmann::json config_json;
  std::optional<std::int64_t> planned_steps;  // --resume: the steps the checkpoint's run planned
};

/// This process's rank and the world size as the MPI launcher tells them
/// (Open MPI, MPICH/PMI, PMIx), before MPI_Init; {0, 1} when not launched
/// by one.
struct launch_world {
  int rank = 0, size = 1;
};
inline launch_world launched_world() {
  launch_world w;
  auto num = [](const char* v) -> int {
    const char* s = std::getenv(v);
    return s ? std::atoi(s) : -1;
  };
  for (const char* r : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"})
    if (num(r) >= 0) {
      w.rank = num(r);
      break;
    }
  for (const char* n : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"})
    if (num(n) > 0) {
      w.size = num(n);
      break;
    }
  return w;
}

/// The first of the places a bundled file `rel` (data/fortunes.txt,
/// scripts/ngram_baseline.py) may be: the current folder, the executable's
/// folder and up to three above it (a build tree: build/host/examples/),
/// and PREFIX/share/tessera beside an installed bin/. No path of the build
/// machine is compiled in. Returns "" when none holds it; `tried` lists
/// the places.
inline fs::path find_resource(const std::string& rel, std::string* tried = nullptr) {
  std::vector<fs::path> places{fs::current_path()};
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    fs::path d = exe.parent_path();
    for (int up = 0; up < 4 && !d.empty(); ++up, d = d.parent_path()) places.push_back(d);
    places.push_back(exe.parent_path().parent_path() / "share" / "tessera");
  }
  for (const auto& p : places) {
    if (tried) *tried += (tried->empty() ? "" : ", ") + (p / rel).string();
    if (fs::exists(p / rel, ec)) return p / rel;
  }
  return {};
}

/// Files and folders this run created, removed again if it fails on bad input.
struct created_paths {
  std::vector<fs::path> paths;
  bool keep = false;
  ~created_paths() {
    if (keep) return;
    std::error_code ec;
    for (auto it = paths.rbegin(); it != paths.rend(); ++it) fs::remove(*it, ec);
  }
};

/// The model sizes of the run: the config.json of --init-from-hf, or the
/// preset with the --dim/--layers/... overrides.
inline nn::llama_config model_config(const options& o) {
  if (!o.init_from_hf.empty()) {
    const fs::path cj = fs::path(o.init_from_hf) / "config.json";
    std::ifstream in(cj);
    TESSERA_THROW_IF(!in, io_error, "--init-from-hf: cannot read '", cj.string(), "'");
    const auto j = nlohmann::json::parse(in, nullptr, false);
    TESSERA_THROW_IF(j.is_discarded(), io_error, "--init-from-hf: '", cj.string(), "' is not JSON");
    return nn::llama_config_from_hf(j, cj.string(), fs::path(o.init_from_hf).filename().string());
  }
  nn::llama_config mc = nn::llama_config::from_name(o.preset);
  if (o.dim) mc.dim = *o.dim;
  if (o.layers) mc.n_layers = *o.layers;
  if (o.heads) mc.n_heads = *o.heads;
  if (o.kv_heads) mc.n_kv_heads = *o.kv_heads;
  if (o.ffn) mc.ffn_dim = *o.ffn;
  // The vocabulary follows the data unless --vocab sets it.
  if (o.vocab)
    mc.vocab = *o.vocab;
  else if (o.data_vocab > 0)
    mc.vocab = static_cast<std::int64_t>(o.data_vocab);
  return mc;
}

/// Quotes a string for /bin/sh (single quotes, embedded ones escaped).
inline std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

/// The 4-gram Kneser-Ney validation loss of the token file `tok`
/// (scripts/ngram_baseline.py), printed beside the model's: computed once
/// per corpus and cached as JSON beside `corpus` (the file the user named;
/// beside `tok` when that folder is not writable), keyed by the token
/// file's fingerprint. nullopt if python3 or the script is unavailable (the
/// run goes on without it).
inline std::optional<double> compute_baseline(const fs::path& tok, const fs::path& corpus) {
  const data::token_file tf(tok);
  const std::string fp = data::fingerprint(tf);
  std::vector<fs::path> caches{corpus.string() + ".ngram4.json", tok.string() + ".ngram4.json"};
  for (const auto& c : caches) {
    std::ifstream in(c);
    if (!in) continue;
    const auto j = nlohmann::json::parse(in, nullptr, false);
    if (!j.is_discarded() && j.contains("fingerprint") && j["fingerprint"] == fp &&
        j.contains("val_nats_per_byte") && j["val_nats_per_byte"].is_number())
      return j["val_nats_per_byte"].get<double>();
  }
  const fs::path script = find_resource("scripts/ngram_baseline.py");
  if (script.empty()) return std::nullopt;
  const std::string cmd = "python3 " + shell_quote(script.string()) + " --json " +
                          shell_quote(tok.string()) + " 2>/dev/null";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return std::nullopt;
  std::string outp;
  char buf[512];
  while (std::fgets(buf, sizeof buf, p)) outp += buf;
  ::pclose(p);
  auto nl = outp.find_last_of('{');
  if (nl == std::string::npos) return std::nullopt;
  auto j = nlohmann::json::parse(outp.substr(nl), nullptr, false);
  if (j.is_discarded() || !j.contains("val_nats_per_byte")) return std::nullopt;
  const double v = j["val_nats_per_byte"].get<double>();
  for (const auto& c : caches) {  // the first folder that takes it
    try {
      tessera::write_json_file(c, {{"fingerprint", fp},
                                   {"val_nats_per_byte", v},
                                   {"order", 4},
                                   {"token_file", tok.string()}});
      break;
    } catch (const std::exception&) {
    }
  }
  return v;
}

/// True when this process was started by mpirun / srun (an MPI launcher).
inline bool launched_by_mpi() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK");
}

/// The train_config of the run: the options' with dp and the checkpointing policy.
inline train::train_config run_config(const options& o) {
  train::train_config c = o.cfg;
  c.dp = o.dp;
  c.tp = o.tp;
  c.pipeline = parallel::parse_schedule_kind(o.schedule);
  c.checkpointing = {nn::parse_checkpointing(o.checkpointing), o.checkpoint_layers};
  if (o.resume.empty()) c.init_from_hf = o.init_from_hf;  // a resume loads its own weights
  return c;
}

// The memory this process's ranks can use, in bytes: MemAvailable plus
// SwapFree of /proc/meminfo, or less where a cgroup (v2: Slurm, Kubernetes,
// containers) limits it to memory.max - memory.current; 0 when unknown
// (the check is skipped).
inline std::uint64_t available_host_memory() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  std::uint64_t kib = 0, total = 0;
  std::string unit;
  while (in >> key >> kib) {
    std::getline(in, unit);
    if (key == "MemAvailable:" || key == "SwapFree:") total += kib * 1024;
  }
  std::ifstream mx("/sys/fs/cgroup/memory.max"), cur("/sys/fs/cgroup/memory.current");
  std::uint64_t limit = 0, used = 0;
  if (mx >> limit && cur >> used && limit > used && total > 0)  // "max" fails the read: no limit
    total = std::min(total, limit - used);
  return total;
}

// Refuses, before anything is allocated, a host run whose model state
// alone (weights, gradients, master weights, optimizer state: the
// planner's persistent bytes, plan/memory.hpp, under this --zero and --tp)
// does not fit the memory this process's ranks share, naming the settings
// and the limit. Activations come on top of it: an allocation that fails
// later is reported with the settings as well (main, exit status 2).
inline void check_host_memory(const options& o, const nn::llama_config& mc,
                              const train::train_config& rc) {
  const std::uint64_t avail = available_host_memory();
  if (avail == 0) return;
  const auto d = plan::dtype_sizes::from_name(o.precision == "bf16" ? "bf16_mixed" : o.precision);
  const plan::sharding sh{
      o.zero, o.dp, 0, std::max<std::int64_t>(1, std::llround(o.bucket_mb * 1e6)), 0, o.tp, 0};
  const auto st = plan::plan_state(mc, d, plan::optimizer_spec::from_name(o.optimizer), sh);
  // Ranks in this process (threads) or on this machine (mpirun's local size).
  std::uint64_t here = static_cast<std::uint64_t>(o.dp) * o.tp * std::max<std::int64_t>(1, rc.pp);
  if (o.comm == "mpi" || launched_by_mpi()) {
    const char* ls = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    here = ls ? std::max(1, std::atoi(ls)) : 1;
  }
  // Stages split the layers: a pipeline's ranks hold one copy between them.
  const std::uint64_t stages = static_cast<std::uint64_t>(std::max<std::int64_t>(1, rc.pp));
  const double need = static_cast<double>(st.persistent()) * static_cast<double>(here) /
                      static_cast<double>(stages);
  TESSERA_THROW_IF(
      need > static_cast<double>(avail), config_error, "the model state of this run needs ",
      std::llround(need / plan::gib), " GiB (", mc.num_params(), " parameters of --dim ", mc.dim,
      " --layers ", mc.n_layers, " --ffn ", mc.ffn_dim, " --vocab ", mc.vocab, ": weights, ",
      "gradients and optimizer state under --precision ", o.precision, " --zero ", o.zero, ", ",
      here, " rank(s) on this machine; the planner, plan/memory.hpp) but ", "the machine has ",
      std::llround(static_cast<double>(avail) / plan::gib),
      " GiB available (MemAvailable + SwapFree): reduce the model, or shard its state over more "
      "machines (--zero, --dp, --tp, --pp under mpirun)");
}

/// Everything the trainers would refuse, checked on the launching thread
/// before any rank is started or any device is asked for (a bad
/// configuration then fails at once, not inside dp x tp rank threads).
/// Throws config_error or io_error as the trainer would.
inline void check_before_ranks(const options& o, const fs::path& tok) {
  const nn::llama_config mc = model_config(o);
  const train::train_config rc = run_config(o);
  data::token_file data(tok);
  const comm::device_mesh mesh(o.dp, o.tp, static_cast<int>(rc.pp));
  switch (o.zero) {
    case 3:
      train::validate<parallel::zero<3>>(mc, rc, data, mesh);
      break;
    default:
      train::validate<parallel::zero<0>>(mc, rc, data, mesh);
  }
  TESSERA_THROW_IF(o.trace_step < 0 || o.trace_step > rc.steps, config_error, "--trace-step ",
                   o.trace_step, " must be in [0, steps=", rc.steps, "] (0: the last)");
  if (rc.sequence_parallel) nn::check_sequence_parallel(rc.seq, o.tp);
  (void)data::val_windows(data, data.split().val, rc.seq, rc.eval_windows);
  (void)data::batch_sampler(data, data.split().train, rc.micro_batch, rc.seq, rc.seed);
  if (o.backend != "cuda") check_host_memory(o, mc, rc);
  if (!o.resume.empty()) {
    const fs::path from = fs::path(o.resume) / "checkpoint.bin";
    TESSERA_THROW_IF(!fs::exists(from), io_error, "cannot open checkpoint '", from.string(), "'");
  }
}

// The communicators' options: --comm-timeout.
inline comm::comm_options comm_opts(const options& o) {
  comm::comm_options c;
  c.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(o.comm_timeout * 1000));
  return c;
}

// An error line of train_llama. Bad settings are refused alike on every
// rank of an MPI launch, so they are reported once, by rank 0; any other
// failure may be one rank's own, and each rank reports it.
inline void report(const char* what, const std::string& msg, bool same_on_every_rank) {
  if (!same_on_every_rank || launched_world().rank == 0)
    std::fprintf(stderr, "train_llama: %s: %s\n", what, msg.c_str());
}

// What drove a failed allocation: the sizes of the model and of a micro-batch.
inline std::string oom_sizes(const options& o) {
  try {
    const nn::llama_config mc = model_config(o);
    return tessera::detail::str(" (this run: ", mc.num_params(), " parameters of --dim ", mc.dim,
                                " --layers ", mc.n_layers, " --ffn ", mc.ffn_dim, " --vocab ",
                                mc.vocab, ", --micro-batch ", o.cfg.micro_batch, " x --seq ",
                                o.cfg.seq, ", --precision ", o.precision, " --zero ", o.zero,
                                " --checkpointing ", o.checkpointing,
                                "; examples/plan with the same flags lists the bytes)");
  } catch (const std::exception&) {
    return {};
  }
}

// Reports the exception in flight as train_llama's error line and returns
// the exit status: 2 for bad input (config_error, io_error) and for memory
// that cannot be had (out_of_memory, std::bad_alloc; the sizes named), 1
// for anything else.
inline int report_failure(const options& o) {
  try {
    throw;
  } catch (const config_error& e) {
    report("error", e.what(), true);
    return 2;
  } catch (const io_error& e) {
    report("error", e.what(), false);
    return 2;
  } catch (const out_of_memory& e) {
    report("error", e.what() + oom_sizes(o), false);
    return 2;
  } catch (const std::bad_alloc&) {  // a std::vector or string of the host
    report("error", "out of memory: a host allocation failed (std::bad_alloc)" + oom_sizes(o),
           false);
    return 2;
  } catch (const std::exception& e) {
    report("failed", e.what(), false);
    return 1;
  }
}

#if defined(TESSERA_HAS_MPI) && TESSERA_HAS_MPI
// Runs `f` on this MPI rank. An error only this rank sees (a failed write,
// a check, an exception mid-step) is sent to every other rank through the
// communicators' error path, so their waits end at once naming this rank
// and the cause, not at the timeout; and it is reported here, before
// mpi_environment ends MPI (after a failure mpirun may end the job as soon
// as one process exits). Returns f's status or the error's.
template <class F>
int notify_peers_on_error(const options& o, F&& f) {
  try {
    return f();
  } catch (...) {
    try {
      throw;
    } catch (const std::exception& e) {
      comm::mpi_notify_failure(e.what());
    } catch (...) {
      comm::mpi_notify_failure("unknown exception");
    }
    return report_failure(o);
  }
}
#endif

// Rethrows the exception in flight, `prefix` before its message, as its
// class (config_error, io_error, comm_error, out_of_memory; anything else
// as error), so main's exit status stays the same.
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

/// The one training loop: resume, step logs, evaluations, metrics,
/// checkpoints, the final sample. Every rank runs it (the trainer's calls
/// are collectives); rank 0 prints and writes. `peak` is one rank's peak
/// for MFU (with the sgemm rate beside it on the host) and how it was obtained.
template <class Trainer>
int train_loop(options& o, Trainer& tr, const data::token_file& data, const fs::path& tok_path,
               created_paths& created, const kernels::peak_flops& peak) {
  const bool lead = tr.rank() == 0 && tr.tp_rank() == 0 && tr.pp_rank() == 0;
  const int dp = tr.communicator().size();
  const fs::path out(o.out);
  const fs::path ckpt = out / "checkpoint.bin";
  const fs::path metrics_path = out / "metrics.jsonl";
  if (!o.resume.empty()) tr.load_checkpoint(fs::path(o.resume) / "checkpoint.bin");
  tr.communicator().barrier();
  std::optional<train::jsonl_writer> metrics;
  if (lead && !o.sample_only) {
    if (!o.resume.empty()) {
      train::jsonl_writer::truncate_after(metrics_path, tr.step());
    } else {
      std::error_code ec;
      fs::remove(metrics_path, ec);
    }
    // The settings as given, read back by --resume OUT.
    const std::string toml = o.config_toml;
    write_file_atomically(out / "run.toml", [&](std::ofstream& f) { f << toml; });
    created.keep = true;  // inputs are valid: from here on, outputs are kept
    if (!o.no_baseline && !o.baseline) o.baseline = compute_baseline(tok_path, o.data);
    const auto& c = tr.model().config();
    std::printf(
        "train_llama: model %s (dim %lld, layers %lld, heads %lld/%lld kv, ffn %lld, "
        "vocab %lld) %.2fM params, precision %s, optimizer %s, backend %s\n",
        c.name.c_str(), (long long)c.dim, (long long)c.n_layers, (long long)c.n_heads,
        (long long)c.n_kv_heads, (long long)c.ffn_dim, (long long)c.vocab, c.num_params() / 1e6,
        o.precision.c_str(), o.optimizer.c_str(), o.backend.c_str());
    std::printf("train_llama: data %s (%llu tokens, train %llu, val %llu)\n", tok_path.c_str(),
                (unsigned long long)data.size(), (unsigned long long)data.split().train.size(),
                (unsigned long long)data.split().val.size());
    if (o.parallel)
      std::printf(
          "train_llama: data parallel dp=%d, zero%d, %s communicator, %zu gradient "
          "buckets\n",
          dp, o.zero, o.comm.c_str(), tr.engine().plan().size());
    if (tr.tp_size() > 1)
      std::printf(
          "train_llama: tensor parallel tp=%d (mesh dp %d x tp %d, tp fastest): each "
          "rank holds %.2fM of the %.2fM parameters%s\n",
          tr.tp_size(), dp, tr.tp_size(), tr.model().num_params() / 1e6, c.num_params() / 1e6,
          tr.model().sequence_parallel()
              ? "; sequence parallel: norms and residuals hold T/tp tokens"
              : "");
    if (tr.pp_size() > 1) {
      std::string stages;
      const std::int64_t K = tr.pp_size(), V = tr.config().virtual_stages;
      const auto parts =
          parallel::partition_stages(c, o.cfg.seq, static_cast<int>(K * V), o.cfg.stage_blocks);
      for (const auto& st : parts)
        stages += tessera::detail::str(stages.empty() ? "" : " ", st.last_block - st.first_block);
      std::printf(
          "train_llama: pipeline parallel pp=%lld, schedule %s, %lld virtual stage%s per "
          "rank, blocks per stage [%s] (embedding on the first, head on the last)\n",
          (long long)K, o.schedule.c_str(), (long long)V, V > 1 ? "s" : "", stages.c_str());
    }
    std::printf(
        "train_llama: G=%lld sequences/step = dp %d x %lld micro-batches x B=%lld, "
        "T=%lld, %lld steps, lr %.1e, warmup %lld, checkpointing %s\n",
        (long long)o.cfg.global_batch, dp, (long long)tr.config().accum_steps(),
        (long long)o.cfg.micro_batch, (long long)o.cfg.seq, (long long)o.cfg.steps, o.cfg.lr,
        (long long)o.cfg.warmup, o.checkpointing.c_str());
    std::printf("train_llama: MFU against %s\n", kernels::describe_peak(peak).c_str());
    if (o.zero > 0)
      std::printf(
          "train_llama: zero%d: no checkpoints are written (sharded checkpoints are not "
          "supported yet; use --zero 0 to checkpoint)\n",
          o.zero);
    if (o.baseline)
      std::printf("train_llama: 4-gram Kneser-Ney baseline on val: %.4f nats/byte\n", *o.baseline);
    if (!o.init_from_hf.empty() && tr.step() == 0)
      std::printf("train_llama: weights from the Hugging Face Llama %s\n", o.init_from_hf.c_str());
    if (tr.step() > 0) std::printf("train_llama: resumed from step %lld\n", (long long)tr.step());
    if (o.planned_steps && *o.planned_steps != o.cfg.steps)
      std::printf(
          "train_llama: the schedule now runs to step %lld (the checkpoint's run planned "
          "%lld): warmup %lld, cosine decay to step %lld\n",
          (long long)o.cfg.steps, (long long)*o.planned_steps, (long long)o.cfg.warmup,
          (long long)o.cfg.steps);
    std::fflush(stdout);
    if (!o.sample_only) {
      metrics.emplace(metrics_path);
      // The run's whole configuration: the first line of a fresh file, a
      // record of each resume after the steps it continues.
      nlohmann::json rec = {{"config", o.config_json},
                            {"model", train::model_metadata(tr.model().config())}};
      if (tr.step() > 0) rec["resumed_at"] = tr.step();
      metrics->write(rec);
    }
  }
  tr.set_peak_flops(peak.flops);
  tr.set_blas_flops(peak.blas_flops);
  const bool tty = lead && train::stdout_is_terminal();
  const auto t_start = std::chrono::steady_clock::now();
  std::optional<double> last_val;
  const std::int64_t trace_at = o.trace_step > 0 ? o.trace_step : o.cfg.steps;
  while (!o.sample_only && tr.step() < o.cfg.steps) {
    // A failure names the step (and, under MPI, reaches every rank with it).
    const std::int64_t at = tr.step() + 1;
    try {
      const bool traced = !o.trace.empty() && tr.step() + 1 == trace_at;
      if (traced) tr.set_tracing(true);
      train::step_metrics m = tr.train_step();
      if (traced) {
        tr.set_tracing(false);
        const auto events = tr.gather_timeline();  // collective
        if (lead) {
          nlohmann::json meta = {{"dp", dp},
                                 {"tp", tr.tp_size()},
                                 {"pp", tr.pp_size()},
                                 {"schedule", o.schedule},
                                 {"virtual_stages", tr.config().virtual_stages},
                                 {"micro_batches", tr.config().accum_steps()},
                                 {"step", m.step}};
          // Only this rank writes: a failure here must not leave the others
          // waiting in the next collective, so it is reported, not thrown.
          try {
            train::write_chrome_trace(o.trace, events, meta);
            const auto b = train::measure_bubble(events, dp * tr.tp_size() * tr.pp_size());
            std::printf("train_llama: trace of step %lld written to %s (bubble %.1f%% of %.3f s)\n",
                        (long long)m.step, o.trace.c_str(), 100 * b.bubble_fraction, b.span);
          } catch (const std::exception& e) {
            std::fprintf(stderr, "train_llama: warning: %s (the run goes on)\n", e.what());
          }
        }
      }
      const bool last = m.step == o.cfg.steps;
      const bool eval_now = last || (o.cfg.eval_every > 0 && m.step % o.cfg.eval_every == 0);
      // Periodic evaluations use the first --eval-windows windows; the last one
      // scores the whole held-out split, as the 4-gram baseline does.
      if (eval_now) last_val = m.val_loss = tr.evaluate(last ? 0 : -1);
      if (lead) {
        nlohmann::json j = m.to_json();
        j["dp"] = dp;
        j["zero"] = o.zero;
        j["tp"] = tr.tp_size();
        j["pp"] = tr.pp_size();
        if (o.baseline) j["baseline_4gram"] = *o.baseline;
        if (m.val_loss)  // nats per byte whatever the tokenizer (bytes: the same number)
          j["val_nats_per_byte"] =
              o.tokenizer.empty() ? *m.val_loss : *m.val_loss / o.val_bytes_per_token;
        metrics->write(j);
        const std::string line = train::format_step(m, o.cfg.steps, o.baseline);
        if (tty) {
          std::printf("\r\033[K%s", train::progress_bar(m.step, o.cfg.steps, line).c_str());
          if (eval_now) std::printf("\n");
        } else {
          std::printf("%s\n", line.c_str());
        }
        std::fflush(stdout);
      }
      if (o.zero == 0 && ((o.checkpoint_every > 0 && m.step % o.checkpoint_every == 0) || last))
        tr.save_checkpoint(ckpt);
    } catch (...) {
      rethrow_with(tessera::detail::str("step ", at, " of ", o.cfg.steps, ": "));
    }
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  if (lead && !o.sample_only) {
    if (tty) std::printf("\n");
    std::printf("train_llama: done, %lld steps in %.1f s", (long long)o.cfg.steps, secs);
    if (last_val && o.tokenizer.empty())
      std::printf(", final val loss %.4f nats/byte (whole held-out split)", *last_val);
    else if (last_val)
      std::printf(
          ", final val loss %.4f nats/token = %.4f nats/byte (%.3f bytes per token; whole "
          "held-out split)",
          *last_val, *last_val / o.val_bytes_per_token, o.val_bytes_per_token);
    if (last_val && o.baseline)
      std::printf(" (4-gram %.4f: %s)", *o.baseline,
                  *last_val < *o.baseline ? "beaten" : "NOT beaten");
    std::printf("\ntrain_llama: %s%s, metrics %s\n", o.zero > 0 ? "no checkpoint" : "checkpoint ",
                o.zero > 0 ? "" : ckpt.c_str(), metrics_path.c_str());
  }
  if (last_val && !std::isfinite(*last_val)) {
    // Check the result before reporting success: a diverged run is a failure.
    if (lead)
      std::fprintf(stderr, "train_llama: training diverged: final validation loss %f (lr %g)\n",
                   *last_val, o.cfg.lr);
    return 1;
  }
  if (!o.export_hf.empty()) {  // every rank takes part (tp gathers, each stage its files)
    tr.export_hf(o.export_hf, o.hf_dtype);
    // The data's tokenizer beside the weights: what transformers users decode with.
    if (lead && !o.tokenizer.empty())
      fs::copy_file(o.tokenizer, fs::path(o.export_hf) / "tokenizer.json",
                    fs::copy_options::overwrite_existing);
    if (lead)
      std::printf(
          "train_llama: Hugging Face Llama written to %s (config.json, safetensors; "
          "LlamaForCausalLM.from_pretrained reads it)\n",
          o.export_hf.c_str());
  }
  if (o.sample_bytes > 0) {  // every rank generates (zero 3 gathers), rank 0 prints
    std::vector<std::int32_t> prompt = o.prompt_ids;
    if (o.tokenizer.empty()) {
      const auto ids = data::byte_tokenizer::encode(o.prompt);
      prompt.assign(ids.begin(), ids.end());
    }
    auto outp = tr.generate(prompt, o.sample_bytes, 0.8, o.cfg.seed);
    std::vector<std::uint32_t> u(outp.begin(), outp.end());
    std::string text;
    if (!o.tokenizer.empty()) {
      text = data::hf_tokenizer(o.tokenizer).decode(u);
    } else {  // bytes; an id of a larger vocabulary (--vocab, --init-from-hf) shown as <id>
      for (std::uint32_t id : u)
        text += id < 256 ? std::string(1, static_cast<char>(id)) : "<" + std::to_string(id) + ">";
    }
    if (lead) std::printf("---- sample (temperature 0.8) ----\n%s\n----\n", text.c_str());
  }
  return 0;
}

/// The backends' entry points (run_host.cpp, run_cuda.cpp): build the
/// trainer the options name and run the loop.
int run_host(options& o, const fs::path& tok, created_paths& created);
int run_cuda(options& o, const fs::path& tok, created_paths& created);

}  // namespace train_llama
