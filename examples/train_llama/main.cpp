// train_llama: the main job. Trains a Llama on a token file (or UTF-8 text,
// byte-tokenized on the fly) with train::trainer and train::fit on the host
// backend (or, with --backend cuda in a cuda-preset build, on GPUs),
// evaluates on the held-out split, writes step logs, a JSONL metrics file and
// checkpoints, and prints a sample at the end. With no arguments it trains
// the `small` preset on the bundled corpus (data/fortunes.txt).
//
// clang-format off
//   build/host/examples/train_llama                       # the main job
//   build/host/examples/train_llama --preset tiny --steps 50 --out runs/tiny
//   build/host/examples/train_llama --resume runs/tiny    # continue exactly
//   build/host/examples/train_llama --optimizer sgd --lr 0.05 --out runs/sgd
//   build/host/examples/train_llama --optimizer lion --lr 3e-4 --weight-decay 1 --out runs/lion
//   build/host/examples/train_llama --optimizer adafactor --out runs/adafactor
//   build/host/examples/train_llama --checkpointing full --out runs/ckpt   # recompute blocks
//   build/cuda/examples/train_llama --backend cuda --out runs/gpu          # one GPU
//
// Parallel layouts (--dp, --zero, --tp, --pp, --schedule; docs/parallel.md,
// docs/tensor_parallel.md, docs/pipeline.md), precisions (--precision,
// README's "Precision") and Hugging Face folders (docs/huggingface.md):
// README's "train_llama" lists every option.
//
//   OMP_NUM_THREADS=1 mpirun -np 4 build/host/examples/train_llama --steps 50 --dp 4 --micro-batch 4 --zero 3
//   build/host/examples/train_llama --steps 50 --pp 2 --schedule zb1 --micro-batch 2 --trace runs/zb1.json
// clang-format on
//
// This file is the command line: it reads the options into a train::job
// (CLI11; --config FILE and --resume DIR read run.toml), and hands it to the
// library: train::check_job, train::prepare_job, and the typed dispatch
// train::dispatch_job (tessera/train/run_job.hpp), which runs train::fit
// on every rank. Exit status: 0 on success, 2 on bad input (one line naming
// the value and the limit; nothing partial left behind), 1 on any other
// failure.

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <new>
#include <sstream>

#include "run.hpp"
#include "tessera/core/config.hpp"
#include "tessera/kernels/blas.hpp"

using namespace tessera;

namespace {

// The value of option `name` on the command line ("--name V", "--name=V").
std::string argv_value(int argc, char** argv, const std::string& name, bool* given = nullptr) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == name || a.rfind(name + "=", 0) == 0) {
      if (given) *given = true;
      if (a == name) return i + 1 < argc ? argv[i + 1] : "";
      return a.substr(name.size() + 1);
    }
  }
  return {};
}

// Replaces what CLI11 holds for `name` by the value the run used (what
// run.toml records and --resume reads back).
void set_effective(CLI::App& app, const std::string& name, const std::string& value) {
  CLI::Option* opt = app.get_option(name);
  opt->clear();
  opt->add_result(value);
}

// Every option's value (given, from a --config file, or its default), for
// metrics.jsonl's first line.
nlohmann::json all_settings(const CLI::App& app) {
  nlohmann::json j = nlohmann::json::object();
  for (const CLI::Option* opt : app.get_options()) {
    const std::string name = opt->get_single_name();
    if (name.empty() || name == "help" || name == "version" || name == "config") continue;
    const auto r = opt->reduced_results();
    if (!r.empty())
      j[name] = r.size() == 1 ? nlohmann::json(r[0]) : nlohmann::json(r);
    else if (!opt->get_default_str().empty())
      j[name] = opt->get_default_str();
    else if (opt->get_expected_min() == 0)
      j[name] = "false";
  }
  return j;
}

// CLI11 validators: a finite real number; an unsigned 64-bit integer in digits.
const CLI::Validator finite_number(
    [](std::string& v) -> std::string {
      char* end = nullptr;
      const double x = std::strtod(v.c_str(), &end);
      return end == v.c_str() || *end != '\0' || !std::isfinite(x)
                 ? "'" + v + "' is not a finite number"
                 : std::string();
    },
    "FINITE");
const CLI::Validator u64_digits(
    [](std::string& v) -> std::string {
      const bool digits =
          !v.empty() && v.size() <= 20 && v.find_first_not_of("0123456789") == std::string::npos;
      errno = 0;
      if (digits) (void)std::strtoull(v.c_str(), nullptr, 10);
      return !digits || errno == ERANGE
                 ? "'" + v + "' is not an integer in [0, 18446744073709551615]"
                 : std::string();
    },
    "UINT64");

// A key given twice in a --config file: CLI11 would keep the first value
// unchecked. Throws config_error naming the key and the file.
void refuse_duplicate_keys(const std::string& file) {
  std::ifstream in(file);
  std::map<std::string, int> seen;
  int n = 0;
  for (std::string line; std::getline(in, line);) {
    ++n;
    const std::size_t eq = line.find('=');
    const std::size_t first = line.find_first_not_of(" \t");
    if (eq == std::string::npos || first == std::string::npos || line[first] == '#' ||
        line[first] == '[')
      continue;
    std::string key = line.substr(first, eq - first);
    key.erase(key.find_last_not_of(" \t") + 1);
    TESSERA_THROW_IF(seen.count(key), config_error, "--config '", file, "': '", key,
                     "' is given twice (lines ", seen[key], " and ", n, ")");
    seen[key] = n;
  }
}

// A control character in any option: run.toml, which --resume reads back,
// records the values raw. Throws config_error naming the option.
void refuse_control_characters(const CLI::App& app) {
  for (const CLI::Option* opt : app.get_options())
    for (const std::string& v : opt->results())
      for (std::size_t i = 0; i < v.size(); ++i)
        TESSERA_THROW_IF(static_cast<unsigned char>(v[i]) < 0x20 || v[i] == 0x7f, config_error,
                         "--", opt->get_single_name(), " holds a control character (byte ", i,
                         "): run.toml, which --resume reads back, cannot record it");
}

}  // namespace

int main(int argc, char** argv) {
  kernels::check_blas_core(argv);
  train::job o;
  try {
    kernels::check_openmp_environment();
  } catch (...) {
    return train::report_failure(o);
  }
  // The main job's defaults: about 2400 x 2048 tokens (~2 epochs of the
  // corpus) in under 10 minutes on two cores (benchmarks/RESULTS.md).
  o.cfg.steps = 2400;
  o.cfg.micro_batch = 16;
  o.cfg.lr = 2e-3;
  o.cfg.eval_every = 200;
  o.cfg.adamw.weight_decay = 0.1;
  o.cfg.adamw.beta2 = 0.99;
  const std::string data_default = find_resource("data/fortunes.txt").string();
  o.data = data_default.empty() ? "data/fortunes.txt" : data_default;

  CLI::App app{
      "train_llama: train a Llama on a token file or UTF-8 text (on the host, or on GPUs with "
      "--backend cuda)"};
  app.set_version_flag("--version",
                       tessera::detail::str("train_llama (tessera) ", TESSERA_VERSION_MAJOR, ".",
                                            TESSERA_VERSION_MINOR, ".", TESSERA_VERSION_PATCH));
  // --resume DIR reads the settings of the run from DIR/run.toml (what it
  // was given), unless --config names another file; options on the command
  // line override either.
  bool config_given = false;
  (void)argv_value(argc, argv, "--config", &config_given);
  std::string resume_dir = argv_value(argc, argv, "--resume");
  // --auto-resume: --out (the command line's, else the default) resumes
  // when it holds a checkpoint, as if --resume named it; else a fresh run.
  bool auto_resume = false;
  (void)argv_value(argc, argv, "--auto-resume", &auto_resume);
  if (auto_resume && resume_dir.empty()) {
    bool out_set = false;
    const std::string out = argv_value(argc, argv, "--out", &out_set);
    if (train::holds_checkpoint(out_set ? out : o.out)) resume_dir = out_set ? out : o.out;
  }
  // A --resume folder that is not there: said first (its settings would be
  // the command line's, and their errors would hide this one).
  if (!resume_dir.empty() && !auto_resume && !std::filesystem::is_directory(resume_dir)) {
    train::report_line(o, "error", "--resume '" + resume_dir + "': no such run folder", true);
    return 2;
  }
  std::string config_default;
  if (!resume_dir.empty() && !config_given) {
    if (std::filesystem::exists(std::filesystem::path(resume_dir) / "run.toml"))
      config_default = (std::filesystem::path(resume_dir) / "run.toml").string();
    else if (comm::launched_world().rank == 0)
      std::printf(
          "train_llama: '%s' holds no run.toml (a run of an older train_llama?): the settings are "
          "the command line's\n",
          (std::filesystem::path(resume_dir) / "run.toml").c_str());
  }
  app.allow_config_extras(CLI::config_extras_mode::error);  // an unknown key is refused
  app.set_config("--config", config_default,
                 "read options from a TOML file (CLI11's format, as OUT/run.toml); options on the "
                 "command line override it");
  using R = CLI::Range;
  const std::int64_t big = 1000000000000;
  app.add_option("--preset", o.preset,
                 "model preset: tiny, small, llama2_7b, llama3_8b, llama3_1_8b, llama3_2_1b, "
                 "llama3_2_3b")
      ->capture_default_str();
  app.add_option("--dim", o.dim, "override the preset's model dimension H")
      ->check(R(std::int64_t{1}, std::int64_t{1048576}));
  app.add_option("--layers", o.layers, "override the preset's number of blocks L")
      ->check(R(std::int64_t{1}, std::int64_t{65536}));
  app.add_option("--heads", o.heads, "override the preset's query heads nh")
      ->check(R(std::int64_t{1}, std::int64_t{65536}));
  app.add_option("--kv-heads", o.kv_heads, "override the preset's key/value heads nkv")
      ->check(R(std::int64_t{1}, std::int64_t{65536}));
  app.add_option("--ffn", o.ffn, "override the preset's SwiGLU dimension F")
      ->check(R(std::int64_t{1}, std::int64_t{16777216}));
  app.add_flag("--tie-embeddings", o.tie_embeddings,
               "tie the LM head to the embedding (one V x H matrix, as Llama 3.2 1B/3B, whose "
               "presets are tied); --tie-embeddings=false unties a tied preset");
  app.add_flag("--document-mask", o.document_mask,
               "packed documents: each token attends only within its document and RoPE counts "
               "positions from the document's start (the separator ends its document)");
  app.add_option("--document-separator", o.document_separator,
                 "the token id that ends each document (--document-mask; default: the byte "
                 "tokenizer's end-of-text, 3, for byte-level data)")
      ->check(R(std::int64_t{0}, std::int64_t{2147483647}));
  app.add_option("--data-format", o.data_format,
                 "auto (text for .txt, .text and .md files, a token file otherwise: tessera's, "
                 "llm.c's .bin, NumPy's .npy), text, or tokens")
      ->capture_default_str();
  app.add_option("--vocab", o.vocab, "the model's vocabulary V (default: the data's)")
      ->check(R(std::int64_t{1}, std::int64_t{4294967296}));
  app.add_option("--tokenizer", o.tokenizer,
                 "a Hugging Face tokenizer.json that decodes the data (default: the token file's, "
                 "<name>.tokenizer.json or tokenizer.json beside it): samples print through it, "
                 "losses convert to nats per byte");
  app.add_option(
         "--data", o.data,
         "token file, or UTF-8 text to byte-tokenize (default: the bundled data/fortunes.txt)")
      ->capture_default_str();
  app.add_option("--steps", o.cfg.steps, "optimizer steps")
      ->capture_default_str()
      ->check(R(std::int64_t{1}, big));
  app.add_option("--seed", o.cfg.seed, "seed of weights and data order (an integer in [0, 2^64-1])")
      ->capture_default_str()
      ->check(u64_digits);
  app.add_option("--precision", o.precision,
                 "fp32, bf16 (bf16_mixed), bf16_mixed_bf16_grads, fp16 (fp16_mixed: under a "
                 "loss scale), fp8 (fp8_mixed: FP8 GEMMs in the blocks' linear layers; host "
                 "only) or fp64; default fp32 on the host, bf16_mixed_bf16_grads on cuda");
  app.add_option("--loss-scale", o.static_loss_scale,
                 "fp16: a static loss scale for the whole run (default: dynamic, from "
                 "--initial-loss-scale)")
      ->check(R(1e-30, 1e30));
  app.add_option("--initial-loss-scale", o.cfg.loss_scale.initial,
                 "fp16: the dynamic loss scale's first value")
      ->capture_default_str()
      ->check(R(1e-30, 1e30));
  app.add_option("--min-loss-scale", o.cfg.loss_scale.min_scale,
                 "fp16: the dynamic loss scale never backs off below this")
      ->capture_default_str()
      ->check(R(1e-30, 1e30));
  app.add_option("--loss-scale-window", o.cfg.loss_scale.growth_interval,
                 "fp16: steps without an overflow before the loss scale doubles")
      ->capture_default_str()
      ->check(R(std::int64_t{1}, big));
  app.add_option("--hysteresis", o.cfg.loss_scale.hysteresis,
                 "fp16: the loss scale halves on the H-th overflow since it last grew (H - 1 "
                 "overflows only skip their steps; after that each halves it, until it grows)")
      ->capture_default_str()
      ->check(R(std::int64_t{1}, std::int64_t{1000000}));
  app.add_option("--fp8-scaling", o.fp8_scaling,
                 "fp8: delayed (scales from an amax history) or current (from each tensor's "
                 "own amax)")
      ->capture_default_str();
  app.add_option("--fp8-format", o.fp8_format,
                 "fp8: hybrid (E4M3 forward, E5M2 gradients) or e4m3 (E4M3 everywhere)")
      ->capture_default_str();
  app.add_option("--fp8-amax-history", o.cfg.fp8.history,
                 "fp8 delayed: the steps of amaxes a scale is taken from")
      ->capture_default_str()
      ->check(R(std::int64_t{1}, std::int64_t{1} << 20));
  app.add_option("--fp8-margin", o.cfg.fp8.margin,
                 "fp8: the scales are divided by 2^margin (headroom)")
      ->capture_default_str()
      ->check(R(0, 64));
  app.add_option("--optimizer", o.optimizer,
                 "adamw, sgd (with momentum), lion, adafactor or muon (AdamW for the embedding, "
                 "head and norms)")
      ->capture_default_str();
  app.add_option("--momentum", o.cfg.sgd.momentum, "sgd: momentum")
      ->capture_default_str()
      ->check(finite_number);
  app.add_flag("--nesterov", o.cfg.sgd.nesterov, "sgd: Nesterov momentum");
  app.add_option("--lion-beta1", o.cfg.lion.beta1, "lion: the update's beta1")
      ->capture_default_str()
      ->check(finite_number);
  app.add_option("--lion-beta2", o.cfg.lion.beta2, "lion: the momentum's beta2")
      ->capture_default_str()
      ->check(finite_number);
  app.add_option("--adafactor-beta1", o.cfg.adafactor.beta1,
                 "adafactor: the first moment's beta1 (0: none)")
      ->capture_default_str()
      ->check(finite_number);
  app.add_option("--adafactor-clip-threshold", o.cfg.adafactor.clip_threshold,
                 "adafactor: the update's RMS is clipped to this")
      ->capture_default_str()
      ->check(finite_number);
  app.add_option("--adafactor-decay-rate", o.cfg.adafactor.decay_rate,
                 "adafactor: beta2_t = 1 - t^rate")
      ->capture_default_str()
      ->check(finite_number);
  app.add_option("--adafactor-eps1", o.cfg.adafactor.eps1, "adafactor: added to g^2")
      ->capture_default_str()
      ->check(finite_number);
  app.add_option("--adafactor-eps2", o.cfg.adafactor.eps2,
                 "adafactor: floor of the parameter scale")
      ->capture_default_str()
      ->check(finite_number);
  app.add_flag("--adafactor-scale-parameter", o.cfg.adafactor.scale_parameter,
               "adafactor: lr times each tensor's RMS");
  app.add_flag("--adafactor-relative-step", o.cfg.adafactor.relative_step,
               "adafactor: lr = min(1e-2, 1/sqrt(t)), not the schedule's");
  app.add_flag("--adafactor-warmup-init", o.cfg.adafactor.warmup_init,
               "adafactor: the relative step from 1e-6 t");
  app.add_option("--muon-momentum", o.cfg.muon.momentum, "muon: the momentum mu")
      ->capture_default_str()
      ->check(finite_number);
  app.add_option("--muon-nesterov", o.cfg.muon.nesterov, "muon: Nesterov momentum (true or false)")
      ->capture_default_str();
  app.add_option("--muon-ns-steps", o.cfg.muon.ns_steps, "muon: Newton-Schulz iterations")
      ->capture_default_str()
      ->check(R(0, 99));
  app.add_option("--muon-adjust-lr", o.muon_adjust,
                 "muon: the update's shape scale, original (sqrt(max(1, out/in))) or "
                 "match_rms_adamw (0.2 sqrt(max(out, in)))")
      ->capture_default_str();
  app.add_option("--muon-adamw-lr", o.muon_adamw_lr,
                 "muon: peak lr of the embedding, head and norms (AdamW; default --lr)")
      ->check(finite_number);
  app.add_option("--global-batch", o.cfg.global_batch, "G: sequences per optimizer step")
      ->capture_default_str()
      ->check(R(std::int64_t{1}, std::int64_t{1000000000}));
  app.add_option("--micro-batch", o.cfg.micro_batch, "B: sequences per forward")
      ->capture_default_str()
      ->check(R(std::int64_t{1}, std::int64_t{1000000000}));
  app.add_option("--seq", o.cfg.seq, "T: tokens per sequence")
      ->capture_default_str()
      ->check(R(std::int64_t{1}, std::int64_t{16777216}));
  app.add_option("--lr", o.cfg.lr, "peak learning rate")
      ->capture_default_str()
      ->check(finite_number);
  app.add_option("--min-lr-ratio", o.cfg.min_lr_ratio, "final lr / peak lr")
      ->capture_default_str()
      ->check(finite_number);
  app.add_option("--warmup", o.cfg.warmup, "linear warmup steps")
      ->capture_default_str()
      ->check(R(std::int64_t{0}, big));
  app.add_option("--lr-schedule", o.lr_schedule,
                 "the decay after the warmup: cosine, wsd (warmup-stable-decay), linear, "
                 "constant or inverse_sqrt")
      ->capture_default_str();
  app.add_option("--wsd-decay-fraction", o.cfg.wsd.decay_fraction,
                 "wsd: the last fraction of the steps decays to lr x --min-lr-ratio")
      ->capture_default_str()
      ->check(finite_number);
  app.add_option("--wsd-cooldown", o.wsd_cooldown,
                 "wsd: the decay's shape, linear or sqrt (1-sqrt)")
      ->capture_default_str();
  app.add_option("--weight-decay", o.cfg.adamw.weight_decay,
                 "weight decay (AdamW, lion, adafactor, muon: decoupled; sgd: L2 added to the "
                 "gradient; all but AdamW and muon: 0 unless given)")
      ->capture_default_str()
      ->check(finite_number);
  app.add_option("--grad-clip", o.cfg.grad_clip, "max global gradient norm (0: off)")
      ->capture_default_str()
      ->check(finite_number);
  app.add_option("--eval-every", o.cfg.eval_every, "evaluate every N steps (0: only at the end)")
      ->capture_default_str()
      ->check(R(std::int64_t{0}, big));
  app.add_option("--eval-windows", o.cfg.eval_windows, "validation windows per evaluation (0: all)")
      ->capture_default_str()
      ->check(R(std::int64_t{0}, big));
  app.add_option("--checkpoint-every", o.checkpoint_every,
                 "save a checkpoint every N steps (and at the end)")
      ->capture_default_str()
      ->check(R(std::int64_t{0}, big));
  app.add_option("--keep", o.keep, "keep the newest N checkpoint folders (0: all)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("--out", o.out,
                 "output folder: checkpoint folders step-NNNNNN (any layout loads them), "
                 "metrics.jsonl, run.toml")
      ->capture_default_str();
  app.add_option(
      "--resume", o.resume,
      "continue the run in DIR from its newest checkpoint folder (written at any dp, tp, pp, "
      "zero; or its checkpoint.bin), with the settings of DIR/run.toml (options given here "
      "override them; a larger --steps extends the schedule)");
  app.add_flag("--async-save", o.async_save,
               "write checkpoints in the background: the step copies its shares to host memory "
               "and training goes on (one save in flight; a failed write ends the run at the "
               "next step)");
  app.add_flag("--overwrite", o.overwrite,
               "a fresh run into an --out that holds a checkpoint replaces it (without it, or "
               "--resume or --auto-resume, such a run is refused)");
  app.add_flag("--auto-resume", o.auto_resume,
               "resume --out when it holds a checkpoint (with its run.toml, as --resume does), "
               "else start a fresh run there: one command line for every start of a job");
  app.add_flag("--sample-only", o.sample_only,
               "with --resume: sample --sample-bytes from the checkpoint without training");
  app.add_option("--dp", o.dp,
                 "data-parallel ranks (threads with --comm local, processes under mpirun)")
      ->capture_default_str();
  app.add_option("--zero", o.zero, "ZeRO stage of data parallelism: 0, 1, 2 or 3")
      ->capture_default_str();
  app.add_option("--tp", o.tp,
                 "tensor-parallel ranks (Megatron-Core layout; world = dp x cp x tp x pp)")
      ->capture_default_str();
  app.add_option("--cp", o.cfg.cp,
                 "context-parallel ranks: each sequence split over them, head-tail (2 cp "
                 "divides --seq; world = dp x cp x tp x pp, Megatron-Core order)")
      ->capture_default_str();
  app.add_option("--cp-kind", o.cp_kind,
                 "how attention runs over the cp group (--cp > 1): ring (any head counts) or "
                 "ulysses (all-to-all to a head split; cp divides the heads)")
      ->capture_default_str();
  app.add_flag(
      "--sequence-parallel", o.cfg.sequence_parallel,
      "with --tp > 1: shard the norm and residual regions along the tokens (T divisible by tp)");
  app.add_option("--pp", o.cfg.pp,
                 "pipeline-parallel stages (world = dp x cp x tp x pp, Megatron-Core order)")
      ->capture_default_str();
  app.add_option(
         "--schedule", o.schedule,
         "pipeline schedule (--pp > 1): gpipe, 1f1b, interleaved or zb1 (zero-bubble ZB-H1)")
      ->capture_default_str();
  app.add_option("--virtual-stages", o.cfg.virtual_stages,
                 "model chunks per pipeline rank (--schedule interleaved)")
      ->capture_default_str();
  app.add_option("--stage-blocks", o.cfg.stage_blocks,
                 "blocks of each of the pp x V stages, comma-separated, in order (default: "
                 "balanced by FLOPs)")
      ->delimiter(',');
  app.add_option("--trace", o.trace,
                 "write one step's timeline as Chrome trace JSON (Perfetto) to FILE");
  app.add_option("--trace-step", o.trace_step, "the step --trace records (0: the last)")
      ->capture_default_str()
      ->check(R(std::int64_t{0}, big));
  app.add_option("--grad-reduce", o.grad_reduce,
                 "when gradient buckets reduce over dp: step (once per step, the micro-batches "
                 "accumulated first: fewer bytes) or micro-batch (--zero 2, 3: every micro-batch "
                 "into the float32 shard, two bucket buffers at most: less memory)")
      ->capture_default_str();
  app.add_option("--bucket-mb", o.bucket_mb,
                 "gradient bucket size in MB (data parallel; zero 3 uses one per block)")
      ->capture_default_str()
      ->check(finite_number);
  app.add_option("--comm-timeout", o.comm_timeout,
                 "seconds a collective or message may wait for the other ranks before the run "
                 "fails naming it")
      ->capture_default_str()
      ->check(finite_number)
      ->check(R(1.0, 86400.0));
  app.add_option("--comm", o.comm,
                 "communicator: local (threads), mpi, nccl (--backend cuda), or auto (mpi or nccl "
                 "under mpirun)")
      ->capture_default_str();
  app.add_option("--sample-bytes", o.sample_bytes,
                 "tokens to generate at the end: bytes under the byte tokenizer (0: none)")
      ->capture_default_str()
      ->check(R(std::int64_t{0}, std::int64_t{100000}));
  app.add_option("--prompt", o.prompt, "prompt of the sample")->capture_default_str();
  app.add_option("--baseline", o.baseline, "4-gram baseline in nats/byte to print beside val loss")
      ->check(finite_number);
  app.add_flag("--no-baseline", o.no_baseline, "do not run scripts/ngram_baseline.py");
  app.add_option("--ce-chunk", o.cfg.ce_chunk, "token rows per LM-head/cross-entropy chunk")
      ->capture_default_str()
      ->check(R(std::int64_t{1}, std::int64_t{1000000000}));
  app.add_option("--backend", o.backend, "host, or cuda (GPUs; a build with the cuda preset)")
      ->capture_default_str();
  app.add_option("--checkpointing", o.checkpointing,
                 "activation checkpointing: none (the host's default) or full (cuda's default)");
  app.add_option("--checkpoint-layers", o.checkpoint_layers,
                 "with --checkpointing full: every k-th block recomputes (1: all)")
      ->capture_default_str();
  app.add_option("--init-from-hf", o.init_from_hf,
                 "start from a Hugging Face Llama folder (config.json and safetensors; the model "
                 "sizes are its)");
  app.add_option("--export-hf", o.export_hf,
                 "at the end, write the model as a Hugging Face Llama folder (config.json, "
                 "safetensors) to DIR");
  app.add_option("--hf-dtype", o.hf_dtype,
                 "dtype of --export-hf: float32, bfloat16, float16 or float64 (default: bfloat16 "
                 "for bf16 weights, float64 for fp64, else float32)");
  app.add_option("--peak-tflops", o.peak_tflops,
                 "the peak TFLOP/s of one rank, for MFU (0, the default: the host's theoretical "
                 "fp32 peak, threads x clock x FLOPs per cycle; a GPU's datasheet dense bf16 rate)")
      ->check(R(0.0, 1e9));
  // Actions of one invocation, not settings of the run: neither written to
  // run.toml nor read from a --config file.
  for (const char* a :
       {"--resume", "--overwrite", "--auto-resume", "--sample-only", "--export-hf", "--hf-dtype",
        "--trace", "--trace-step"})
    app.get_option(a)->configurable(false);
  // An option given twice takes its last value (a command line that
  // appends an override to a script's flags, as getopt tools do).
  for (CLI::Option* opt : app.get_options())
    if (opt->get_type_size_max() == 1 && opt->get_expected_max() == 1)
      opt->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  try {
    const std::string config = config_given ? argv_value(argc, argv, "--config") : config_default;
    if (!config.empty() && std::filesystem::is_regular_file(config)) refuse_duplicate_keys(config);
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    train::report_line(o, "error", e.what(), true);
    return 2;
  } catch (...) {
    return train::report_failure(o);
  }
  // A resume onto another layout: what run.toml restored that only a degree
  // above 1 allows (a pipeline's schedule, virtual stages and stage list;
  // sequence parallelism) goes back to its default when the command line
  // sets that degree to 1 without naming it again.
  if (!config_default.empty()) {
    const auto on_command_line = [&](const char* name) {
      bool given = false;
      (void)argv_value(argc, argv, name, &given);
      return given;
    };
    const auto drop = [&](const char* name, auto reset) {
      if (app.count(name) == 0 || on_command_line(name)) return;
      app.get_option(name)->clear();
      reset();
      if (comm::launched_world().rank == 0)
        std::printf("train_llama: %s from run.toml dropped: this run's layout has no use for it\n",
                    name);
    };
    if (on_command_line("--pp") && o.cfg.pp == 1) {
      drop("--schedule", [&] { o.schedule = app.get_option("--schedule")->get_default_str(); });
      drop("--virtual-stages", [&] { o.cfg.virtual_stages = 1; });
      drop("--stage-blocks", [&] { o.cfg.stage_blocks.clear(); });
    }
    if (on_command_line("--tp") && o.tp == 1)
      drop("--sequence-parallel", [&] { o.cfg.sequence_parallel = false; });
    if (on_command_line("--cp") && o.cfg.cp == 1)
      drop("--cp-kind", [&] { o.cp_kind = app.get_option("--cp-kind")->get_default_str(); });
  }
  // The default warmup (50) suits the main job; a short run that did not ask
  // for a warmup gets a tenth of its steps instead of an error.
  if (app.count("--warmup") == 0 && o.cfg.warmup >= o.cfg.steps) {
    o.cfg.warmup = o.cfg.steps / 10;
    set_effective(app, "--warmup", std::to_string(o.cfg.warmup));
  }
  // Under an MPI launcher the data-parallel degree is what the world
  // leaves after cp, tp and pp, unless --dp says otherwise.
  const comm::launch_world world = comm::launched_world();
  if (comm::launched_by_mpi() && app.count("--dp") == 0 && o.tp > 0 && o.cfg.pp > 0 &&
      o.cfg.cp > 0 && world.size % (o.cfg.cp * o.tp * o.cfg.pp) == 0)
    o.dp = static_cast<int>(world.size / (o.cfg.cp * o.tp * o.cfg.pp));
  // (--out from a --config file is known only now: its settings are that
  // file's, as with --resume DIR --config FILE.)
  if (o.auto_resume && o.resume.empty() && resume_dir.empty() && train::holds_checkpoint(o.out))
    resume_dir = o.out;
  if (o.auto_resume && o.resume.empty() && !resume_dir.empty()) {
    o.resume = resume_dir;
    if (world.rank == 0)
      std::printf("train_llama: --auto-resume: '%s' holds a checkpoint: resuming it\n",
                  resume_dir.c_str());
  }
  // A resumed run writes where it resumes from, wherever that folder is
  // now, unless --out is on the command line (run.toml's is where it was).
  bool out_given = false;
  (void)argv_value(argc, argv, "--out", &out_given);
  if (!o.resume.empty() && !out_given) o.out = o.resume;
  // Under mpirun the session holds MPI: a refusal is reported and the
  // created paths removed (in that order) before MPI_Finalize, so no rank
  // exits, and mpirun ends the job, while rank 0 is still reporting.
  train::job_session session;  // under mpirun rank 0 alone writes the folders and tokens
  created_paths created;
  try {
    refuse_control_characters(app);
    for (const CLI::Option* opt : app.get_options())
      if (opt->count() > 0) o.given.insert("--" + opt->get_single_name());
    train::check_job(o);
    if (!config_default.empty()) {  // the steps the resumed run planned, for the log
      std::ifstream in(config_default);
      for (const auto& item : CLI::ConfigTOML().from_config(in))
        if (item.name == "steps" && item.inputs.size() == 1)
          o.planned_steps = std::stoll(item.inputs[0]);
    }
    if (app.count("--data") > 0)
      set_effective(app, "--data", std::filesystem::absolute(o.data).string());
    set_effective(app, "--out", o.out);
    o.config_toml = app.config_to_str(false, false);
    o.config_json = all_settings(app);
    if (!train::prepare_job(o, created, session)) return 2;  // rank 0 reports why
    const auto& tok = session.tokens;
    return o.backend == "cuda"
               ? train_llama::run_cuda(o, tok, created)
               : pick<precision::fp32, precision::bf16_mixed, precision::bf16_mixed,
                      precision::bf16_mixed_bf16_grads, precision::fp16_mixed,
                      precision::fp16_mixed, precision::fp8_mixed, precision::fp8_mixed,
                      precision::fp64>(
                     "precision", o.precision,
                     {"fp32", "bf16", "bf16_mixed", "bf16_mixed_bf16_grads", "fp16", "fp16_mixed",
                      "fp8", "fp8_mixed", "fp64"},
                     [&](auto p) {
                       using P = typename decltype(p)::type;
                       return train::dispatch_job<host, P>(o, tok, created);
                     });
  } catch (...) {
    return train::report_failure(o);
  }
}
