// train_llama: the main job. Trains a Llama on a token file (or UTF-8 text,
// byte-tokenized on the fly) on the host backend (or, with --backend cuda in
// a cuda-preset build, on one GPU), evaluates on the held-out
// split, writes step logs, a JSONL metrics file and checkpoints, and prints
// a sample at the end. With no arguments it trains the `small` preset on the
// bundled corpus (data/fortunes.txt).
//
//   build/host/examples/train_llama                       # the main job
//   build/host/examples/train_llama --preset tiny --steps 50 --out runs/tiny
//   build/host/examples/train_llama --resume runs/tiny    # continue exactly
//   build/cuda/examples/train_llama --backend cuda --precision bf16 --out runs/gpu   # one GPU
//
// Data parallel (docs/parallel.md): --dp N ranks, --zero {0,1,2,3} the ZeRO
// stage, --comm local (ranks are threads of this process) or mpi (ranks are
// the processes of mpirun; the default when launched by mpirun). The global
// batch --global-batch stays the sequences per optimizer step whatever dp is.
//
//   build/host/examples/train_llama --steps 50 --dp 4 --micro-batch 4 --zero 2   # threads
//   OMP_NUM_THREADS=1 mpirun -np 4 build/host/examples/train_llama --steps 50 --dp 4 --micro-batch 4 --zero 3
//
// Exit status: 0 on success, 2 on bad input (one-line error naming the value
// and the limit; nothing partial left behind), 1 on any other failure.

#include <sys/stat.h>
#include <unistd.h>

#include <omp.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tessera/data/token_file.hpp"
#include "tessera/data/tokenizer.hpp"
#include "tessera/kernels/blas.hpp"
#include "tessera/nn/checkpointing.hpp"
#include "tessera/nn/llama_config.hpp"
#include "tessera/train/trainer.hpp"
#include "tessera/comm/local.hpp"
#include "tessera/parallel/data_parallel_trainer.hpp"
#if defined(TESSERA_EXAMPLE_CUDA)
#include "tessera/train/cuda_trainer.hpp"
#endif
#if defined(TESSERA_HAS_MPI) && TESSERA_HAS_MPI
#include "tessera/comm/mpi.hpp"
#endif

#ifndef TESSERA_SOURCE_DIR
#define TESSERA_SOURCE_DIR "."
#endif

namespace fs = std::filesystem;
using namespace tessera;

namespace {

struct options {
  std::string backend = "host";        // host, or cuda (builds with the cuda preset)
  double peak_tflops = 989;            // cuda: the GPU's dense bf16 peak, for MFU
  std::string checkpointing;           // none or full; default: none on the host, full on cuda
  std::string preset = "small";
  std::string data = std::string(TESSERA_SOURCE_DIR) + "/data/fortunes.txt";
  std::string precision;  // fp32, bf16, fp64; default: fp32 on the host, bf16 on cuda
  std::string out = "runs/main";
  std::string resume;
  train::train_config cfg;
  std::int64_t checkpoint_every = 200;
  std::int64_t sample_bytes = 300;
  std::optional<double> baseline;
  bool no_baseline = false;
  std::string prompt = "The ";
  int dp = 1;
  int zero = 0;              // ZeRO stage of the data-parallel path
  std::string comm = "auto";  // local, mpi, or auto (mpi under mpirun, else local)
  double bucket_mb = 25;      // gradient bucket size of the data-parallel path
  // Overrides of the preset's sizes (0: keep the preset's value).
  std::optional<std::int64_t> dim, layers, heads, kv_heads, ffn;
};

// Files and folders this run created, removed again if it fails on bad input.
struct created_paths {
  std::vector<fs::path> paths;
  bool keep = false;
  ~created_paths() {
    if (keep) return;
    std::error_code ec;
    for (auto it = paths.rbegin(); it != paths.rend(); ++it) fs::remove(*it, ec);
  }
};

bool is_token_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  char m[8] = {};
  in.read(m, 8);
  return in.gcount() == 8 && std::string(m, 8) == data::token_file_magic;
}

// Returns a token file path for `data`: the file itself, or (for UTF-8 text)
// a byte-tokenized copy in the output folder.
fs::path prepare_tokens(const fs::path& data, const fs::path& out, created_paths& created) {
  std::error_code ec;
  TESSERA_THROW_IF(!fs::exists(data, ec), io_error, "data file '", data.string(), "' does not exist");
  TESSERA_THROW_IF(fs::is_directory(data, ec), io_error, "data path '", data.string(),
                   "' is a directory, not a file");
  std::ifstream probe(data, std::ios::binary);
  TESSERA_THROW_IF(!probe, io_error, "data file '", data.string(), "' is not readable");
  if (is_token_file(data)) return data;
  // Text: byte-tokenized into the output folder on every run (2.5 MB takes
  // milliseconds), so a cached file can never stand in for different text.
  const fs::path tok = out / (data.stem().string() + ".tok");
  std::string text((std::istreambuf_iterator<char>(probe)), std::istreambuf_iterator<char>());
  TESSERA_THROW_IF(text.empty(), io_error, "data file '", data.string(), "' is empty");
  const std::size_t bad = data::first_invalid_utf8(text);
  TESSERA_THROW_IF(bad != std::string::npos, io_error, "data file '", data.string(),
                   "' is neither a tessera token file nor UTF-8 text (invalid UTF-8 at byte ", bad,
                   " of ", text.size(), ")");
  const bool existed = fs::exists(tok);
  auto tokens = data::byte_tokenizer::encode(text);
  data::write_token_file(tok, tokens, data::byte_tokenizer::vocab_size, data::token_dtype::u16);
  if (existed) return tok;
  created.paths.push_back(tok);
  return tok;
}

// Quotes a string for /bin/sh (single quotes, embedded ones escaped).
std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Runs scripts/ngram_baseline.py on the token file: the 4-gram Kneser-Ney
// validation loss printed beside the model's. nullopt if python3 or the
// script is unavailable (the run goes on without it).
std::optional<double> compute_baseline(const fs::path& tok) {
  const std::string script = std::string(TESSERA_SOURCE_DIR) + "/scripts/ngram_baseline.py";
  if (!fs::exists(script)) return std::nullopt;
  const std::string cmd = "python3 " + shell_quote(script) + " --json " + shell_quote(tok.string()) + " 2>/dev/null";
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
  return j["val_nats_per_byte"].get<double>();
}

// The model sizes of the run: the preset with the --dim/--layers/... overrides.
nn::llama_config model_config(const options& o) {
  nn::llama_config mc = nn::llama_config::from_name(o.preset);
  if (o.dim) mc.dim = *o.dim;
  if (o.layers) mc.n_layers = *o.layers;
  if (o.heads) mc.n_heads = *o.heads;
  if (o.kv_heads) mc.n_kv_heads = *o.kv_heads;
  if (o.ffn) mc.ffn_dim = *o.ffn;
  return mc;
}

// The single-rank loop over a trainer (train::trainer<P> on the host,
// train::cuda_trainer on one GPU): resume, step logs, evaluations, metrics,
// checkpoints, the final sample. `peak` gives the peak FLOP/s for MFU and a
// line saying what it is; it runs after the inputs are validated.
template <class Trainer, class Peak>
int train_loop(options& o, Trainer& tr, const data::token_file& data, const fs::path& tok_path,
               created_paths& created, const char* precision, Peak peak_of) {
  const fs::path out(o.out);
  const fs::path ckpt = out / "checkpoint.bin";
  const fs::path metrics_path = out / "metrics.jsonl";
  if (!o.resume.empty()) {
    const fs::path from = fs::path(o.resume) / "checkpoint.bin";
    tr.load_checkpoint(from);
    train::jsonl_writer::truncate_after(metrics_path, tr.step());
  } else {
    std::error_code ec;
    fs::remove(metrics_path, ec);
  }
  created.keep = true;  // inputs are valid: from here on, outputs are kept

  const auto [peak, peak_line] = peak_of();
  tr.set_peak_flops(peak);
  if (!o.no_baseline && !o.baseline) o.baseline = compute_baseline(tok_path);

  const auto& c = tr.model().config();
  std::printf("train_llama: model %s (dim %lld, layers %lld, heads %lld/%lld kv, ffn %lld, vocab %lld) "
              "%.2fM params, precision %s, backend %s\n",
              c.name.c_str(), (long long)c.dim, (long long)c.n_layers, (long long)c.n_heads,
              (long long)c.n_kv_heads, (long long)c.ffn_dim, (long long)c.vocab,
              tr.model().num_params() / 1e6, precision, o.backend.c_str());
  std::printf("train_llama: data %s (%llu tokens, train %llu, val %llu)\n", tok_path.c_str(),
              (unsigned long long)data.size(), (unsigned long long)data.split().train.size(),
              (unsigned long long)data.split().val.size());
  std::printf("train_llama: G=%lld sequences/step, B=%lld, T=%lld, %lld micro-batches/step, "
              "%lld steps, lr %.1e, warmup %lld\n",
              (long long)o.cfg.global_batch, (long long)o.cfg.micro_batch, (long long)o.cfg.seq,
              (long long)o.cfg.accum_steps(), (long long)o.cfg.steps, o.cfg.lr,
              (long long)o.cfg.warmup);
  std::printf("train_llama: %s\n", peak_line.c_str());
  if (o.baseline) std::printf("train_llama: 4-gram Kneser-Ney baseline on val: %.4f nats/byte\n", *o.baseline);
  if (tr.step() > 0) std::printf("train_llama: resumed from step %lld\n", (long long)tr.step());
  std::fflush(stdout);

  train::jsonl_writer metrics(metrics_path);
  const bool tty = train::stdout_is_terminal();
  const auto t_start = std::chrono::steady_clock::now();
  std::optional<double> last_val;
  while (tr.step() < o.cfg.steps) {
    train::step_metrics m = tr.train_step();
    const bool last = m.step == o.cfg.steps;
    const bool eval_now = last || (o.cfg.eval_every > 0 && m.step % o.cfg.eval_every == 0);
    // Periodic evaluations use the first --eval-windows windows; the last one
    // scores the whole held-out split, as the 4-gram baseline does.
    if (eval_now) last_val = m.val_loss = tr.evaluate(last ? 0 : -1);
    nlohmann::json j = m.to_json();
    if (o.baseline) j["baseline_4gram"] = *o.baseline;
    metrics.write(j);
    const std::string line = train::format_step(m, o.cfg.steps, o.baseline);
    if (tty) {
      std::printf("\r\033[K%s", train::progress_bar(m.step, o.cfg.steps, line).c_str());
      if (eval_now) std::printf("\n");
    } else {
      std::printf("%s\n", line.c_str());
    }
    std::fflush(stdout);
    if ((o.checkpoint_every > 0 && m.step % o.checkpoint_every == 0) || m.step == o.cfg.steps)
      tr.save_checkpoint(ckpt);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  if (tty) std::printf("\n");
  std::printf("train_llama: done, %lld steps in %.1f s", (long long)o.cfg.steps, secs);
  if (last_val) std::printf(", final val loss %.4f nats/byte (whole held-out split)", *last_val);
  if (last_val && o.baseline)
    std::printf(" (4-gram %.4f: %s)", *o.baseline, *last_val < *o.baseline ? "beaten" : "NOT beaten");
  std::printf("\ntrain_llama: checkpoint %s, metrics %s\n", ckpt.c_str(), metrics_path.c_str());
  if (last_val && !std::isfinite(*last_val)) {
    // Check the result before reporting success: a diverged run is a failure.
    std::fprintf(stderr, "train_llama: training diverged: final validation loss %f (lr %g)\n",
                 *last_val, o.cfg.lr);
    return 1;
  }
  if (o.sample_bytes > 0) {
    auto ids = data::byte_tokenizer::encode(o.prompt);
    std::vector<std::int32_t> prompt(ids.begin(), ids.end());
    auto outp = tr.generate(prompt, o.sample_bytes, 0.8, o.cfg.seed);
    std::vector<std::uint32_t> u(outp.begin(), outp.end());
    std::printf("---- sample (temperature 0.8) ----\n%s\n----\n", data::byte_tokenizer::decode(u).c_str());
  }
  return 0;
}

template <precision::policy P>
int run(options& o, const fs::path& tok_path, created_paths& created) {
  data::token_file data(tok_path);
  train::trainer<P> tr(model_config(o), o.cfg, data);  // validates everything before any output
  return train_loop(o, tr, data, tok_path, created, P::name, [] {
    const std::string blas = kernels::blas_core_name();
    const double peak = kernels::measure_sgemm_flops();
    return std::pair<double, std::string>(
        peak, detail::str("BLAS ", blas, ", ", kernels::blas_threads(), " threads, measured sgemm peak ",
                  peak / 1e9, " GFLOP/s (MFU is against it)"));
  });
}

#if defined(TESSERA_EXAMPLE_CUDA)
// --backend cuda: train::cuda_trainer on the current GPU (bf16_mixed).
int run_cuda(options& o, const fs::path& tok_path, created_paths& created) {
  TESSERA_THROW_IF(o.precision != "bf16" && o.precision != "bf16_mixed", config_error,
                   "--precision ", o.precision, ": the cuda backend trains bf16 (bf16_mixed)");
  TESSERA_THROW_IF(!(o.peak_tflops > 0) || !std::isfinite(o.peak_tflops), config_error,
                   "--peak-tflops ", o.peak_tflops, " must be a finite number > 0");
  data::token_file data(tok_path);
  {  // what the trainer would refuse, checked before asking for the device
    train::check_single_rank(model_config(o), o.cfg, data);
    (void)data::val_windows(data, data.split().val, o.cfg.seq, o.cfg.eval_windows);
    (void)data::batch_sampler(data, data.split().train, o.cfg.micro_batch, o.cfg.seq, o.cfg.seed);
    if (!o.resume.empty()) {
      const fs::path from = fs::path(o.resume) / "checkpoint.bin";
      TESSERA_THROW_IF(!fs::exists(from), io_error, "cannot open checkpoint '", from.string(), "'");
    }
  }
  TESSERA_THROW_IF(tessera::cuda::device_count() < 1, config_error,
                   "--backend cuda: no CUDA device is visible");
  train::cuda_trainer tr(model_config(o), o.cfg, data,
                         nn::parse_checkpointing(o.checkpointing));
  return train_loop(o, tr, data, tok_path, created, precision::bf16_mixed::name, [&] {
    cudaDeviceProp p{};
    TESSERA_CUDA_CHECK(cudaGetDeviceProperties(&p, tessera::cuda::current_device()));
    return std::pair<double, std::string>(
        o.peak_tflops * 1e12, detail::str("GPU ", p.name, " (sm_", p.major, p.minor, "), MFU against ",
                                  o.peak_tflops, " TFLOP/s (--peak-tflops), checkpointing ",
                                  o.checkpointing));
  });
}
#endif

// ---- Data parallel: --dp N --zero {0,1,2,3} --comm {local,mpi} ----------------------------
// One rank of the run: rank 0 prints, writes the metrics and the checkpoint
// (zero 0; sharded stages write none and say so); every rank trains.

// True when this process was started by mpirun / srun (an MPI launcher).
bool launched_by_mpi() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") ||
         std::getenv("PMIX_RANK");
}

template <precision::policy P, class S, class Comm>
int run_dp_rank(options& o, const fs::path& tok_path, created_paths& created, Comm& comm,
                double peak) {
  const bool lead = comm.rank() == 0;
  data::token_file data(tok_path);
  nn::llama_config mc = nn::llama_config::from_name(o.preset);
  if (o.dim) mc.dim = *o.dim;
  if (o.layers) mc.n_layers = *o.layers;
  if (o.heads) mc.n_heads = *o.heads;
  if (o.kv_heads) mc.n_kv_heads = *o.kv_heads;
  if (o.ffn) mc.ffn_dim = *o.ffn;
  o.cfg.dp = o.dp;
  // Validates everything (dp against the world size, G against dp x B) before any output.
  parallel::data_parallel_options dpo;
  dpo.bucket_bytes = static_cast<std::int64_t>(o.bucket_mb * 1e6);
  parallel::data_parallel_trainer<P, S, Comm> tr(mc, o.cfg, data, comm, dpo);
  const fs::path out(o.out);
  const fs::path ckpt = out / "checkpoint.bin";
  const fs::path metrics_path = out / "metrics.jsonl";
  if (!o.resume.empty()) tr.load_checkpoint(fs::path(o.resume) / "checkpoint.bin");
  comm.barrier();
  std::optional<train::jsonl_writer> metrics;
  if (lead) {
    if (!o.resume.empty()) {
      train::jsonl_writer::truncate_after(metrics_path, tr.step());
    } else {
      std::error_code ec;
      fs::remove(metrics_path, ec);
    }
    created.keep = true;
    if (!o.no_baseline && !o.baseline) o.baseline = compute_baseline(tok_path);
    const auto& c = tr.model().config();
    std::printf("train_llama: model %s (dim %lld, layers %lld, heads %lld/%lld kv, ffn %lld, vocab "
                "%lld) %.2fM params, precision %s\n",
                c.name.c_str(), (long long)c.dim, (long long)c.n_layers, (long long)c.n_heads,
                (long long)c.n_kv_heads, (long long)c.ffn_dim, (long long)c.vocab,
                tr.model().num_params() / 1e6, P::name);
    std::printf("train_llama: data parallel dp=%d, %s, %s communicator, %zu gradient buckets\n",
                comm.size(), S::name, o.comm.c_str(), tr.engine().plan().size());
    std::printf("train_llama: G=%lld sequences/step = dp %d x %lld micro-batches x B=%lld, T=%lld, "
                "%lld steps, lr %.1e, warmup %lld\n",
                (long long)o.cfg.global_batch, comm.size(), (long long)o.cfg.accum_steps(),
                (long long)o.cfg.micro_batch, (long long)o.cfg.seq, (long long)o.cfg.steps,
                o.cfg.lr, (long long)o.cfg.warmup);
    if (S::shards_optimizer_state)
      std::printf("train_llama: %s: no checkpoints are written (sharded checkpoints are not "
                  "supported yet; use --zero 0 to checkpoint)\n",
                  S::name);
    if (tr.step() > 0) std::printf("train_llama: resumed from step %lld\n", (long long)tr.step());
    std::fflush(stdout);
    metrics.emplace(metrics_path);
  }
  tr.set_peak_flops(peak);
  const bool tty = lead && train::stdout_is_terminal();
  const auto t_start = std::chrono::steady_clock::now();
  std::optional<double> last_val;
  while (tr.step() < o.cfg.steps) {
    train::step_metrics m = tr.train_step();
    const bool last = m.step == o.cfg.steps;
    const bool eval_now = last || (o.cfg.eval_every > 0 && m.step % o.cfg.eval_every == 0);
    if (eval_now) last_val = m.val_loss = tr.evaluate(last ? 0 : -1);
    if (lead) {
      nlohmann::json j = m.to_json();
      j["dp"] = comm.size();
      j["zero"] = S::stage;
      if (o.baseline) j["baseline_4gram"] = *o.baseline;
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
    if (!S::shards_optimizer_state &&
        ((o.checkpoint_every > 0 && m.step % o.checkpoint_every == 0) || last))
      tr.save_checkpoint(ckpt);
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  if (lead) {
    if (tty) std::printf("\n");
    std::printf("train_llama: done, %lld steps in %.1f s", (long long)o.cfg.steps, secs);
    if (last_val) std::printf(", final val loss %.4f nats/byte (whole held-out split)", *last_val);
    if (last_val && o.baseline)
      std::printf(" (4-gram %.4f: %s)", *o.baseline,
                  *last_val < *o.baseline ? "beaten" : "NOT beaten");
    std::printf("\ntrain_llama: %s%s, metrics %s\n",
                S::shards_optimizer_state ? "no checkpoint" : "checkpoint ",
                S::shards_optimizer_state ? "" : ckpt.c_str(), metrics_path.c_str());
  }
  if (o.sample_bytes > 0) {  // every rank generates (zero 3 gathers), rank 0 prints
    auto ids = data::byte_tokenizer::encode(o.prompt);
    std::vector<std::int32_t> prompt(ids.begin(), ids.end());
    auto outp = tr.generate(prompt, o.sample_bytes, 0.8, o.cfg.seed);
    std::vector<std::uint32_t> u(outp.begin(), outp.end());
    if (lead)
      std::printf("---- sample (temperature 0.8) ----\n%s\n----\n",
                  data::byte_tokenizer::decode(u).c_str());
  }
  return 0;
}

template <precision::policy P, class S>
int run_dp_comm(options& o, const fs::path& tok, created_paths& created) {
  if (o.comm == "local") {
    // Ranks are threads: each gets its share of the OpenMP threads.
    const int per_rank = std::max(1, omp_get_max_threads() / o.dp);
    const double peak = kernels::measure_sgemm_flops() / o.dp;
    int rc = 0;
    comm::local_world::run(o.dp, [&](comm::local_communicator& c) {
      omp_set_num_threads(per_rank);
      const int r = run_dp_rank<P, S>(o, tok, created, c, peak);
      if (c.rank() == 0) rc = r;
    });
    return rc;
  }
#if defined(TESSERA_HAS_MPI) && TESSERA_HAS_MPI
  if (o.comm == "mpi") {
    comm::mpi_environment env;
    comm::mpi_communicator c(MPI_COMM_WORLD);
    double peak = c.rank() == 0 ? kernels::measure_sgemm_flops() : 0.0;
    c.broadcast(&peak, 1, 0);
    return run_dp_rank<P, S>(o, tok, created, c, peak);
  }
  throw config_error("--comm '" + o.comm + "' is not one of local, mpi");
#else
  throw config_error("--comm '" + o.comm + "': this build has no MPI (valid: local)");
#endif
}

template <precision::policy P>
int run_dp(options& o, const fs::path& tok, created_paths& created) {
  switch (o.zero) {
    case 0:
      return run_dp_comm<P, parallel::zero<0>>(o, tok, created);
    case 1:
      return run_dp_comm<P, parallel::zero<1>>(o, tok, created);
    case 2:
      return run_dp_comm<P, parallel::zero<2>>(o, tok, created);
    case 3:
      return run_dp_comm<P, parallel::zero<3>>(o, tok, created);
  }
  throw config_error("--zero " + std::to_string(o.zero) + " is not a ZeRO stage (valid: 0, 1, 2, 3)");
}

}  // namespace

int main(int argc, char** argv) {
  kernels::check_blas_core(argv);
  options o;
  // The main job's defaults: about 2400 x 2048 tokens (~2 epochs of the
  // corpus) in under 10 minutes on two cores (benchmarks/RESULTS.md).
  o.cfg.steps = 2400;
  o.cfg.global_batch = 16;
  o.cfg.micro_batch = 16;
  o.cfg.seq = 128;
  o.cfg.lr = 2e-3;
  o.cfg.warmup = 50;
  o.cfg.eval_every = 200;
  o.cfg.eval_windows = 256;
  o.cfg.adamw.weight_decay = 0.1;
  o.cfg.adamw.beta2 = 0.99;

  CLI::App app{"train_llama: train a Llama on a token file or UTF-8 text (the host, or one GPU with --backend cuda)"};
  app.add_option("--preset", o.preset, "model preset: tiny, small, llama2_7b, llama3_8b")->capture_default_str();
  app.add_option("--dim", o.dim, "override the preset's model dimension H");
  app.add_option("--layers", o.layers, "override the preset's number of blocks L");
  app.add_option("--heads", o.heads, "override the preset's query heads nh");
  app.add_option("--kv-heads", o.kv_heads, "override the preset's key/value heads nkv");
  app.add_option("--ffn", o.ffn, "override the preset's SwiGLU dimension F");
  app.add_option("--data", o.data, "token file, or UTF-8 text to byte-tokenize")->capture_default_str();
  app.add_option("--steps", o.cfg.steps, "optimizer steps")->capture_default_str();
  app.add_option("--seed", o.cfg.seed, "seed of weights and data order")->capture_default_str();
  app.add_option("--precision", o.precision, "fp32, bf16 (bf16_mixed) or fp64; default fp32 on the host, bf16 on cuda");
  app.add_option("--global-batch", o.cfg.global_batch, "G: sequences per optimizer step")->capture_default_str();
  app.add_option("--micro-batch", o.cfg.micro_batch, "B: sequences per forward")->capture_default_str();
  app.add_option("--seq", o.cfg.seq, "T: tokens per sequence")->capture_default_str();
  app.add_option("--lr", o.cfg.lr, "peak learning rate")->capture_default_str();
  app.add_option("--min-lr-ratio", o.cfg.min_lr_ratio, "final lr / peak lr")->capture_default_str();
  app.add_option("--warmup", o.cfg.warmup, "linear warmup steps")->capture_default_str();
  app.add_option("--weight-decay", o.cfg.adamw.weight_decay, "AdamW decoupled weight decay")->capture_default_str();
  app.add_option("--grad-clip", o.cfg.grad_clip, "max global gradient norm (0: off)")->capture_default_str();
  app.add_option("--eval-every", o.cfg.eval_every, "evaluate every N steps (0: only at the end)")->capture_default_str();
  app.add_option("--eval-windows", o.cfg.eval_windows, "validation windows per evaluation (0: all)")->capture_default_str();
  app.add_option("--checkpoint-every", o.checkpoint_every, "save a checkpoint every N steps (and at the end)")->capture_default_str();
  app.add_option("--out", o.out, "output folder: checkpoint.bin, metrics.jsonl")->capture_default_str();
  app.add_option("--resume", o.resume, "folder whose checkpoint.bin to continue from");
  app.add_option("--dp", o.dp, "data-parallel ranks (threads with --comm local, processes under mpirun)")->capture_default_str();
  app.add_option("--zero", o.zero, "ZeRO stage of data parallelism: 0, 1, 2 or 3")->capture_default_str();
  app.add_option("--bucket-mb", o.bucket_mb, "gradient bucket size in MB (data parallel; zero 3 uses one per block)")->capture_default_str();
  app.add_option("--comm", o.comm, "communicator: local (threads), mpi, or auto (mpi under mpirun)")->capture_default_str();
  app.add_option("--sample-bytes", o.sample_bytes, "bytes to generate at the end (0: none)")->capture_default_str();
  app.add_option("--prompt", o.prompt, "prompt of the sample")->capture_default_str();
  app.add_option("--baseline", o.baseline, "4-gram baseline in nats/byte to print beside val loss");
  app.add_flag("--no-baseline", o.no_baseline, "do not run scripts/ngram_baseline.py");
  app.add_option("--ce-chunk", o.cfg.ce_chunk, "token rows per LM-head/cross-entropy chunk")->capture_default_str();
  app.add_option("--backend", o.backend, "host, or cuda (one GPU; a build with the cuda preset)")->capture_default_str();
  app.add_option("--checkpointing", o.checkpointing, "activation checkpointing: none (the host's only one) or full (cuda's default)");
  app.add_option("--peak-tflops", o.peak_tflops, "cuda: the GPU's dense bf16 peak TFLOP/s, for MFU")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "train_llama: error: %s\n", e.what());
    return 2;
  }
  // The default warmup (50) suits the main job; a short run that did not ask
  // for a warmup gets a tenth of its steps instead of an error.
  if (app.count("--warmup") == 0 && o.cfg.warmup >= o.cfg.steps) o.cfg.warmup = o.cfg.steps / 10;
  created_paths created;
  try {
    TESSERA_THROW_IF(!(o.cfg.lr > 0 && o.cfg.lr <= 1), config_error, "lr=", o.cfg.lr,
                     " must be in (0, 1]");
    TESSERA_THROW_IF(o.sample_bytes < 0 || o.sample_bytes > 100000, config_error, "--sample-bytes ",
                     o.sample_bytes, " must be in [0, 100000]");
    TESSERA_THROW_IF(o.sample_bytes > 0 && o.prompt.empty(), config_error,
                     "--prompt is empty; generation needs at least one byte of prompt");
    TESSERA_THROW_IF(o.checkpoint_every < 0, config_error, "--checkpoint-every ", o.checkpoint_every,
                     " must be >= 0 (0: only at the end)");
    TESSERA_THROW_IF(!(o.cfg.grad_clip >= 0), config_error, "--grad-clip ", o.cfg.grad_clip,
                     " must be >= 0 (0: off)");
    TESSERA_THROW_IF(o.dp < 1, config_error, "dp=", o.dp, " must be >= 1");
    TESSERA_THROW_IF(o.zero < 0 || o.zero > 3, config_error, "--zero ", o.zero,
                     " is not a ZeRO stage (valid: 0, 1, 2, 3)");
    TESSERA_THROW_IF(o.backend != "host" && o.backend != "cuda", config_error, "unknown backend '",
                     o.backend, "' (valid: host, cuda)");
    const bool gpu = o.backend == "cuda";
    if (o.precision.empty()) o.precision = gpu ? "bf16" : "fp32";
    if (o.checkpointing.empty()) o.checkpointing = gpu ? "full" : "none";
    TESSERA_THROW_IF(o.precision != "fp32" && o.precision != "bf16" && o.precision != "bf16_mixed" &&
                         o.precision != "fp64",
                     config_error, "unknown precision '", o.precision, "' (valid: fp32, bf16, fp64)");
    (void)nn::parse_checkpointing(o.checkpointing);
    TESSERA_THROW_IF(!std::isfinite(o.bucket_mb) || !(o.bucket_mb > 0) || o.bucket_mb > 1e6,
                     config_error, "--bucket-mb ", o.bucket_mb, " must be in (0, 1e6]");
    TESSERA_THROW_IF(o.dp > 1024, config_error, "dp=", o.dp, " exceeds the limit of 1024 ranks");
    TESSERA_THROW_IF(o.backend == "host" && o.checkpointing != "none", config_error,
                     "--checkpointing ", o.checkpointing,
                     ": the host backend has no activation checkpointing (valid: none)");
    if (o.comm == "auto") o.comm = launched_by_mpi() ? "mpi" : "local";
    // The data-parallel path: any of --dp > 1, --zero, --comm, or mpirun.
    const bool parallel_path = o.dp > 1 || app.count("--zero") > 0 || app.count("--comm") > 0 ||
                               o.comm == "mpi";
    if (!o.resume.empty() && o.out == "runs/main") o.out = o.resume;
    const fs::path out(o.out);
    std::error_code ec;
    if (!fs::exists(out)) {
      // Every folder this run creates (runs/ too, for runs/main) is removed
      // again if the run fails on bad input.
      std::vector<fs::path> missing;
      for (fs::path p = fs::absolute(out); !p.empty() && !fs::exists(p); p = p.parent_path()) {
        missing.push_back(p);
        if (p == p.parent_path()) break;
      }
      fs::create_directories(out, ec);
      TESSERA_THROW_IF(ec, io_error, "cannot create output folder '", out.string(), "': ", ec.message());
      for (auto it = missing.rbegin(); it != missing.rend(); ++it) created.paths.push_back(*it);
    }
    TESSERA_THROW_IF(::access(out.c_str(), W_OK) != 0, io_error, "output folder '", out.string(),
                     "' is not writable");
    TESSERA_THROW_IF(o.backend == "cuda" && parallel_path, config_error,
                     "--backend cuda trains on one GPU: --dp, --zero and --comm are host-only");
    const fs::path tok = prepare_tokens(o.data, out, created);
    if (o.backend == "cuda") {
#if defined(TESSERA_EXAMPLE_CUDA)
      return run_cuda(o, tok, created);
#else
      throw config_error(
          "--backend cuda: this build has no CUDA backend (configure with the cuda preset: "
          "cmake --preset cuda)");
#endif
    }
    if (parallel_path) {
      if (o.precision == "fp32") return run_dp<precision::fp32>(o, tok, created);
      if (o.precision == "bf16" || o.precision == "bf16_mixed")
        return run_dp<precision::bf16_mixed>(o, tok, created);
      if (o.precision == "fp64") return run_dp<precision::fp64>(o, tok, created);
      throw config_error("unknown precision '" + o.precision + "' (valid: fp32, bf16, fp64)");
    }
    if (o.precision == "fp32") return run<precision::fp32>(o, tok, created);
    if (o.precision == "bf16" || o.precision == "bf16_mixed") return run<precision::bf16_mixed>(o, tok, created);
    if (o.precision == "fp64") return run<precision::fp64>(o, tok, created);
    throw config_error("unknown precision '" + o.precision + "' (valid: fp32, bf16, fp64)");
  } catch (const config_error& e) {
    std::fprintf(stderr, "train_llama: error: %s\n", e.what());
    return 2;
  } catch (const io_error& e) {
    std::fprintf(stderr, "train_llama: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_llama: failed: %s\n", e.what());
    return 1;
  }
}
