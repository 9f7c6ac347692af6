// train_llama: the main job. Trains a Llama on a token file (or UTF-8 text,
// byte-tokenized on the fly) with train::trainer on the host backend (or,
// with --backend cuda in a cuda-preset build, on GPUs), evaluates on the
// held-out split, writes step logs, a JSONL metrics file and checkpoints,
// and prints a sample at the end. With no arguments it trains the `small`
// preset on the bundled corpus (data/fortunes.txt).
//
//   build/host/examples/train_llama                       # the main job
//   build/host/examples/train_llama --preset tiny --steps 50 --out runs/tiny
//   build/host/examples/train_llama --resume runs/tiny    # continue exactly
//   build/host/examples/train_llama --optimizer sgd --lr 0.05 --out runs/sgd
//   build/host/examples/train_llama --checkpointing full --out runs/ckpt   # recompute blocks
//   build/cuda/examples/train_llama --backend cuda --out runs/gpu          # one GPU
//
// Data parallel (docs/parallel.md): --dp N ranks, --zero {0,1,2,3} the ZeRO
// stage, --comm local (ranks are threads of this process), mpi (ranks are
// the processes of mpirun; the default when launched by mpirun) or nccl
// (--backend cuda: one process per GPU). The global batch --global-batch
// stays the sequences per optimizer step whatever dp is.
//
//   build/host/examples/train_llama --steps 50 --dp 4 --micro-batch 4 --zero 2   # threads
//   OMP_NUM_THREADS=1 mpirun -np 4 build/host/examples/train_llama --steps 50 --dp 4 --micro-batch 4 --zero 3
//   mpirun -np 8 build/cuda/examples/train_llama --backend cuda --comm nccl --dp 8 --zero 1
//
// Tensor parallel (docs/tensor_parallel.md): --tp T ranks per dp rank, the
// world dp x T in Megatron order (tp fastest):
//
//   build/host/examples/train_llama --steps 50 --dp 2 --tp 2 --zero 1 --micro-batch 8
//   build/host/examples/train_llama --steps 50 --tp 2 --sequence-parallel
//
// Pipeline parallel (docs/pipeline.md): --pp K stages, --schedule gpipe,
// 1f1b, interleaved (--virtual-stages V) or zb1; the world dp x tp x pp;
// --trace FILE writes one step's timeline for Perfetto:
//
//   build/host/examples/train_llama --steps 50 --pp 2 --schedule zb1 --micro-batch 2 --trace runs/zb1.json
//
// Hugging Face checkpoints (docs/huggingface.md): --init-from-hf DIR starts
// from a Llama folder (its config.json gives the sizes), --export-hf DIR
// writes the trained model as one (LlamaForCausalLM reads it):
//
//   build/host/examples/train_llama --preset tiny --steps 50 --out runs/t --export-hf runs/t/hf
//   build/host/examples/train_llama --init-from-hf runs/t/hf --steps 20 --lr 3e-4 --out runs/ft
//
// The trainers are instantiated in run_host*.cpp and run_cuda.cpp; this
// file reads and checks the command line and dispatches once, at the top.
//
// Exit status: 0 on success, 2 on bad input (one-line error naming the value
// and the limit; nothing partial left behind), 1 on any other failure.

#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "run.hpp"
#include "tessera/core/config.hpp"
#include "tessera/data/hf_tokenizer.hpp"
#include "tessera/data/token_file.hpp"
#include "tessera/data/tokenizer.hpp"
#include "tessera/kernels/blas.hpp"
#include "tessera/nn/checkpointing.hpp"
#include "tessera/nn/llama_layout.hpp"

namespace fs = std::filesystem;
using namespace tessera;
using train_llama::created_paths;
using train_llama::find_resource;
using train_llama::options;

namespace {

// Returns a token file path for `data`: the file itself (tessera's token
// file, an llm.c .bin shard or a NumPy .npy array, told apart by their first
// bytes), or, for UTF-8 text, a byte-tokenized copy in the output folder.
// Text is text by --data-format text or by its extension (.txt, .text, .md
// under --data-format auto): a token file whose header is damaged is refused
// by the reader, never trained on as text. Only regular files are read (not
// a device or a FIFO, which would never end).
fs::path prepare_tokens(const fs::path& data, const fs::path& out, const std::string& format,
                        created_paths& created) {
  std::error_code ec;
  TESSERA_THROW_IF(format != "auto" && format != "text" && format != "tokens", config_error,
                   "--data-format '", format, "' is not one of auto, text, tokens");
  TESSERA_THROW_IF(!fs::exists(data, ec), io_error, "data file '", data.string(), "' does not exist");
  TESSERA_THROW_IF(fs::is_directory(data, ec), io_error, "data path '", data.string(),
                   "' is a directory, not a file");
  TESSERA_THROW_IF(!fs::is_regular_file(data, ec), io_error, "data path '", data.string(),
                   "' is not a regular file (a device, a FIFO or a socket would not end)");
  std::ifstream probe(data, std::ios::binary);
  TESSERA_THROW_IF(!probe, io_error, "data file '", data.string(), "' is not readable");
  const std::string ext = data.extension().string();
  const bool text = format == "text" || (format == "auto" && (ext == ".txt" || ext == ".text" || ext == ".md"));
  if (!text) {
    (void)data::token_file(data);  // every header field and id checked, the file named
    return data;
  }
  // Text: byte-tokenized into the output folder on every run (2.5 MB takes
  // milliseconds), so a cached file can never stand in for different text.
  constexpr std::uintmax_t max_text = std::uintmax_t{1} << 32;
  const std::uintmax_t size = fs::file_size(data, ec);
  TESSERA_THROW_IF(size > max_text, io_error, "text file '", data.string(), "' holds ", size,
                   " bytes, more than the ", max_text,
                   " train_llama byte-tokenizes in memory: write a token file with "
                   "examples/tokenize or scripts/tokenizer.py");
  const fs::path tok = out / (data.stem().string() + ".tok");
  std::string text_bytes((std::istreambuf_iterator<char>(probe)), std::istreambuf_iterator<char>());
  TESSERA_THROW_IF(text_bytes.empty(), io_error, "data file '", data.string(), "' is empty");
  const std::size_t bad = data::first_invalid_utf8(text_bytes);
  TESSERA_THROW_IF(bad != std::string::npos, io_error, "data file '", data.string(),
                   "' is not UTF-8 text (invalid UTF-8 at byte ", bad, " of ", text_bytes.size(),
                   "); a token file is read by its header: give it another extension than .txt, "
                   ".text or .md, or --data-format tokens");
  const bool existed = fs::exists(tok);
  auto tokens = data::byte_tokenizer::encode(text_bytes);
  data::write_token_file(tok, tokens, data::byte_tokenizer::vocab_size, data::token_dtype::u16);
  if (existed) return tok;
  created.paths.push_back(tok);
  return tok;
}

// Removes the temporaries (NAME.tmp.<pid>...) a killed run left in `out`:
// those of processes that no longer run. The live ones are another run's.
void remove_stale_temporaries(const fs::path& out) {
  std::error_code ec;
  std::vector<fs::path> stale;
  for (const auto& e : fs::directory_iterator(out, ec)) {
    const std::string n = e.path().filename().string();
    const std::size_t at = n.find(".tmp.");
    if (at == std::string::npos) continue;
    const std::string rest = n.substr(at + 5);
    const std::size_t digits = rest.find_first_not_of("0123456789");
    const std::string pid = rest.substr(0, digits);
    if (pid.empty() || pid.size() > 9) continue;
    if (!fs::exists(fs::path("/proc") / pid, ec)) stale.push_back(e.path());
  }
  for (const auto& p : stale) fs::remove(p, ec);
}

// The vocabulary and the tokenizer of the data: the model's vocabulary
// follows the token file unless --vocab sets it; a tokenizer.json beside a
// token file (or --tokenizer) decodes the samples, measures the validation
// split's bytes per token and, through scripts/tokenizer.py (Hugging Face
// tokenizers), encodes the prompt; the sequence length defaults to at most
// the model's max_seq.
void prepare_vocabulary(const CLI::App& app, options& o, const fs::path& tok) {
  const data::token_file f(tok);
  o.data_vocab = f.vocab();
  if (o.tokenizer.empty() && tok == fs::path(o.data)) {  // a token file, not text
    const fs::path beside = fs::path(o.data).parent_path() / "tokenizer.json";
    if (fs::exists(beside)) o.tokenizer = beside.string();
  }
  const nn::llama_config mc = train_llama::model_config(o);
  TESSERA_THROW_IF(f.vocab() > static_cast<std::uint64_t>(mc.vocab), config_error,
                   "token file vocabulary ", f.vocab(), " of '", o.data, "' exceeds the model's vocab=",
                   mc.vocab, o.init_from_hf.empty() ? " (--vocab)" : " (config.json of --init-from-hf)");
  if (app.count("--seq") == 0 && o.cfg.seq > mc.max_seq) o.cfg.seq = mc.max_seq;
  if (o.tokenizer.empty()) {
    for (unsigned char c : o.prompt)  // the byte tokenizer's ids are the bytes
      TESSERA_THROW_IF(o.sample_bytes > 0 && c >= mc.vocab, config_error, "--prompt byte ",
                       static_cast<int>(c), " is outside the model's vocabulary of ", mc.vocab);
    TESSERA_THROW_IF(o.sample_bytes > 0 && f.vocab() > 256, config_error, "--data '", o.data,
                     "' has a vocabulary of ", f.vocab(),
                     " ids but no tokenizer.json beside it to decode samples with: give "
                     "--tokenizer FILE, or --sample-bytes 0");
    return;
  }
  const data::hf_tokenizer t(o.tokenizer);
  TESSERA_THROW_IF(t.vocab_size() < f.vocab(), config_error, "tokenizer '", o.tokenizer,
                   "' knows ", t.vocab_size(), " ids but the data uses ids up to ", f.vocab() - 1);
  std::uint64_t bytes = 0;
  const auto val = f.split().val;
  for (std::uint64_t i = val.begin; i < val.end; ++i) bytes += t.token_bytes(f[i]).size();
  // An empty split is refused later with the window it lacks (check_run).
  o.val_bytes_per_token = val.size() > 0 && bytes > 0
                              ? static_cast<double>(bytes) / static_cast<double>(val.size())
                              : 1.0;
  if (o.sample_bytes == 0) return;
  // The prompt through the tokenizers library, as the data was encoded.
  std::string tried;
  const fs::path script = find_resource("scripts/tokenizer.py", &tried);
  TESSERA_THROW_IF(script.empty(), config_error, "encoding --prompt needs scripts/tokenizer.py "
                   "(looked in ", tried, "); or give --sample-bytes 0");
  const std::string cmd = "python3 " + train_llama::shell_quote(script.string()) +
                          " ids --tokenizer " + train_llama::shell_quote(o.tokenizer) + " " +
                          train_llama::shell_quote(o.prompt) + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  TESSERA_THROW_IF(p == nullptr, config_error, "cannot run python3 to encode --prompt");
  std::string outp;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p)) outp += buf;
  const int rc = ::pclose(p);
  TESSERA_THROW_IF(rc != 0, config_error, "encoding --prompt with '", o.tokenizer,
                   "' failed (python3 scripts/tokenizer.py ids; Hugging Face tokenizers: pip "
                   "install tokenizers; or --sample-bytes 0): ", outp);
  std::istringstream is(outp);
  for (long long id; is >> id;) {
    TESSERA_THROW_IF(id < 0 || id >= mc.vocab, config_error, "--prompt encodes to id ", id,
                     ", outside the model's vocabulary of ", mc.vocab);
    o.prompt_ids.push_back(static_cast<std::int32_t>(id));
  }
  TESSERA_THROW_IF(o.prompt_ids.empty(), config_error, "--prompt '", o.prompt,
                   "' encodes to no tokens through '", o.tokenizer, "'");
}

// The value of option `name` on the command line ("--name V" or
// "--name=V"), or "" when it is not there.
std::string argv_value(int argc, char** argv, const std::string& name) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == name && i + 1 < argc) return argv[i + 1];
    if (a.rfind(name + "=", 0) == 0) return a.substr(name.size() + 1);
  }
  return {};
}
bool argv_has(int argc, char** argv, const std::string& name) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == name || a.rfind(name + "=", 0) == 0) return true;
  }
  return false;
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

// CLI11 validators: a finite real number; an unsigned 64-bit integer
// written in digits (CLI11 would wrap "-1" and round "1e23").
const CLI::Validator finite_number(
    [](std::string& v) -> std::string {
      char* end = nullptr;
      const double x = std::strtod(v.c_str(), &end);
      if (end == v.c_str() || *end != '\0' || !std::isfinite(x))
        return "'" + v + "' is not a finite number";
      return {};
    },
    "FINITE");
const CLI::Validator u64_digits(
    [](std::string& v) -> std::string {
      const bool digits = !v.empty() && v.size() <= 20 &&
                          v.find_first_not_of("0123456789") == std::string::npos;
      errno = 0;
      if (digits) (void)std::strtoull(v.c_str(), nullptr, 10);
      if (!digits || errno == ERANGE)
        return "'" + v + "' is not an integer in [0, 18446744073709551615]";
      return {};
    },
    "UINT64");

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

  CLI::App app{"train_llama: train a Llama on a token file or UTF-8 text (on the host, or on GPUs with --backend cuda)"};
  app.set_version_flag("--version", tessera::detail::str("train_llama (tessera) ", TESSERA_VERSION_MAJOR,
                                                         ".", TESSERA_VERSION_MINOR, ".",
                                                         TESSERA_VERSION_PATCH));
  // --resume DIR reads the settings of the run from DIR/run.toml (what it
  // was given), unless --config names another file; options on the command
  // line override either.
  const std::string resume_dir = argv_value(argc, argv, "--resume");
  std::string config_default;
  if (!resume_dir.empty() && !argv_has(argc, argv, "--config")) {
    if (fs::exists(fs::path(resume_dir) / "run.toml"))
      config_default = (fs::path(resume_dir) / "run.toml").string();
    else if (train_llama::launched_world().rank == 0)
      std::printf("train_llama: '%s' holds no run.toml (a run of an older train_llama?): the "
                  "settings are the command line's\n",
                  (fs::path(resume_dir) / "run.toml").c_str());
  }
  app.allow_config_extras(CLI::config_extras_mode::error);  // an unknown key is refused
  app.set_config("--config", config_default,
                 "read options from a TOML file (CLI11's format, as OUT/run.toml); options on the "
                 "command line override it");
  {
    std::string tried;
    const fs::path d = find_resource("data/fortunes.txt", &tried);
    o.data = d.empty() ? "data/fortunes.txt" : d.string();
  }
  app.add_option("--preset", o.preset, "model preset: tiny, small, llama2_7b, llama3_8b")->capture_default_str();
  app.add_option("--dim", o.dim, "override the preset's model dimension H")->check(CLI::Range(std::int64_t{1}, std::int64_t{1048576}));
  app.add_option("--layers", o.layers, "override the preset's number of blocks L")->check(CLI::Range(std::int64_t{1}, std::int64_t{65536}));
  app.add_option("--heads", o.heads, "override the preset's query heads nh")->check(CLI::Range(std::int64_t{1}, std::int64_t{65536}));
  app.add_option("--kv-heads", o.kv_heads, "override the preset's key/value heads nkv")->check(CLI::Range(std::int64_t{1}, std::int64_t{65536}));
  app.add_option("--ffn", o.ffn, "override the preset's SwiGLU dimension F")->check(CLI::Range(std::int64_t{1}, std::int64_t{16777216}));
  app.add_option("--data-format", o.data_format, "auto (text for .txt, .text and .md files, a token file otherwise: tessera's, llm.c's .bin, NumPy's .npy), text, or tokens")->capture_default_str();
  app.add_option("--vocab", o.vocab, "the model's vocabulary V (default: the data's)")->check(CLI::Range(std::int64_t{1}, std::int64_t{4294967296}));
  app.add_option("--tokenizer", o.tokenizer, "a Hugging Face tokenizer.json that decodes the data (default: tokenizer.json beside --data, if there): samples print through it, losses convert to nats per byte");
  app.add_option("--data", o.data, "token file, or UTF-8 text to byte-tokenize (default: the bundled data/fortunes.txt)")->capture_default_str();
  app.add_option("--steps", o.cfg.steps, "optimizer steps")->capture_default_str()->check(CLI::Range(std::int64_t{1}, std::int64_t{1000000000000}));
  app.add_option("--seed", o.cfg.seed, "seed of weights and data order (an integer in [0, 2^64-1])")->capture_default_str()->check(u64_digits);
  app.add_option("--precision", o.precision, "fp32, bf16 (bf16_mixed), bf16_mixed_bf16_grads or fp64; default fp32 on the host, bf16_mixed_bf16_grads on cuda");
  app.add_option("--optimizer", o.optimizer, "adamw or sgd (with momentum)")->capture_default_str();
  app.add_option("--momentum", o.cfg.sgd.momentum, "sgd: momentum")->capture_default_str()->check(finite_number);
  app.add_flag("--nesterov", o.cfg.sgd.nesterov, "sgd: Nesterov momentum");
  app.add_option("--global-batch", o.cfg.global_batch, "G: sequences per optimizer step")->capture_default_str()->check(CLI::Range(std::int64_t{1}, std::int64_t{1000000000}));
  app.add_option("--micro-batch", o.cfg.micro_batch, "B: sequences per forward")->capture_default_str()->check(CLI::Range(std::int64_t{1}, std::int64_t{1000000000}));
  app.add_option("--seq", o.cfg.seq, "T: tokens per sequence")->capture_default_str()->check(CLI::Range(std::int64_t{1}, std::int64_t{16777216}));
  app.add_option("--lr", o.cfg.lr, "peak learning rate")->capture_default_str()->check(finite_number);
  app.add_option("--min-lr-ratio", o.cfg.min_lr_ratio, "final lr / peak lr")->capture_default_str()->check(finite_number);
  app.add_option("--warmup", o.cfg.warmup, "linear warmup steps")->capture_default_str()->check(CLI::Range(std::int64_t{0}, std::int64_t{1000000000000}));
  app.add_option("--weight-decay", o.cfg.adamw.weight_decay, "weight decay (AdamW: decoupled; sgd: L2 added to the gradient)")->capture_default_str()->check(finite_number);
  app.add_option("--grad-clip", o.cfg.grad_clip, "max global gradient norm (0: off)")->capture_default_str()->check(finite_number);
  app.add_option("--eval-every", o.cfg.eval_every, "evaluate every N steps (0: only at the end)")->capture_default_str()->check(CLI::Range(std::int64_t{0}, std::int64_t{1000000000000}));
  app.add_option("--eval-windows", o.cfg.eval_windows, "validation windows per evaluation (0: all)")->capture_default_str()->check(CLI::Range(std::int64_t{0}, std::int64_t{1000000000000}));
  app.add_option("--checkpoint-every", o.checkpoint_every, "save a checkpoint every N steps (and at the end)")->capture_default_str()->check(CLI::Range(std::int64_t{0}, std::int64_t{1000000000000}));
  app.add_option("--out", o.out, "output folder: checkpoint.bin, metrics.jsonl")->capture_default_str();
  app.add_option("--resume", o.resume, "continue the run in DIR from its checkpoint.bin, with the settings of DIR/run.toml (options given here override them; a larger --steps extends the schedule)");
  app.add_flag("--sample-only", o.sample_only, "with --resume: sample --sample-bytes from the checkpoint without training");
  app.add_option("--dp", o.dp, "data-parallel ranks (threads with --comm local, processes under mpirun)")->capture_default_str();
  app.add_option("--zero", o.zero, "ZeRO stage of data parallelism: 0, 1, 2 or 3")->capture_default_str();
  app.add_option("--tp", o.tp, "tensor-parallel ranks per dp rank (Megatron layout; world = dp x tp)")->capture_default_str();
  app.add_flag("--sequence-parallel", o.cfg.sequence_parallel, "with --tp > 1: shard the norm and residual regions along the tokens (T divisible by tp)");
  app.add_option("--pp", o.cfg.pp, "pipeline-parallel stages (world = dp x tp x pp, Megatron order)")->capture_default_str();
  app.add_option("--schedule", o.schedule, "pipeline schedule: gpipe, 1f1b, interleaved or zb1 (zero-bubble ZB-H1)")->capture_default_str();
  app.add_option("--virtual-stages", o.cfg.virtual_stages, "model chunks per pipeline rank (--schedule interleaved)")->capture_default_str();
  app.add_option("--stage-blocks", o.cfg.stage_blocks, "blocks of each of the pp x V stages, comma-separated, in order (default: balanced by FLOPs)")->delimiter(',');
  app.add_option("--trace", o.trace, "write one step's timeline as Chrome trace JSON (Perfetto) to FILE");
  app.add_option("--trace-step", o.trace_step, "the step --trace records (0: the last)")->capture_default_str();
  app.add_option("--bucket-mb", o.bucket_mb, "gradient bucket size in MB (data parallel; zero 3 uses one per block)")->capture_default_str()->check(finite_number);
  app.add_option("--comm-timeout", o.comm_timeout, "seconds a collective or message may wait for the other ranks before the run fails naming it")->capture_default_str()->check(finite_number)->check(CLI::Range(1.0, 86400.0));
  app.add_option("--comm", o.comm, "communicator: local (threads), mpi, nccl (--backend cuda), or auto (mpi or nccl under mpirun)")->capture_default_str();
  app.add_option("--sample-bytes", o.sample_bytes, "tokens to generate at the end: bytes under the byte tokenizer (0: none)")->capture_default_str()->check(CLI::Range(std::int64_t{0}, std::int64_t{100000}));
  app.add_option("--prompt", o.prompt, "prompt of the sample")->capture_default_str();
  app.add_option("--baseline", o.baseline, "4-gram baseline in nats/byte to print beside val loss")->check(finite_number);
  app.add_flag("--no-baseline", o.no_baseline, "do not run scripts/ngram_baseline.py");
  app.add_option("--ce-chunk", o.cfg.ce_chunk, "token rows per LM-head/cross-entropy chunk")->capture_default_str()->check(CLI::Range(std::int64_t{1}, std::int64_t{1000000000}));
  app.add_option("--backend", o.backend, "host, or cuda (GPUs; a build with the cuda preset)")->capture_default_str();
  app.add_option("--checkpointing", o.checkpointing, "activation checkpointing: none (the host's default) or full (cuda's default)");
  app.add_option("--checkpoint-layers", o.checkpoint_layers, "with --checkpointing full: every k-th block recomputes (1: all)")->capture_default_str();
  app.add_option("--init-from-hf", o.init_from_hf, "start from a Hugging Face Llama folder (config.json and safetensors; the model sizes are its)");
  app.add_option("--export-hf", o.export_hf, "at the end, write the model as a Hugging Face Llama folder (config.json, safetensors) to DIR");
  app.add_option("--hf-dtype", o.hf_dtype, "dtype of --export-hf: float32, bfloat16, float16 or float64 (default: bfloat16 for bf16 weights, float64 for fp64, else float32)");
  app.add_option("--peak-tflops", o.peak_tflops, "the peak TFLOP/s of one rank, for MFU (0, the default: the host's theoretical fp32 peak, threads x clock x FLOPs per cycle; a GPU's datasheet dense bf16 rate)")->check(CLI::Range(0.0, 1e9));
  // Actions of one invocation, not settings of the run: neither written to
  // run.toml nor read from a --config file.
  for (const char* a : {"--resume", "--sample-only", "--export-hf", "--hf-dtype", "--trace",
                        "--trace-step"})
    app.get_option(a)->configurable(false);
  // An option given twice takes its last value (a command line that
  // appends an override to a script's flags, as getopt tools do).
  for (CLI::Option* opt : app.get_options())
    if (opt->get_type_size_max() == 1 && opt->get_expected_max() == 1)
      opt->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    train_llama::report("error", e.what(), true);
    return 2;
  }
  // The default warmup (50) suits the main job; a short run that did not ask
  // for a warmup gets a tenth of its steps instead of an error.
  if (app.count("--warmup") == 0 && o.cfg.warmup >= o.cfg.steps) {
    o.cfg.warmup = o.cfg.steps / 10;
    set_effective(app, "--warmup", std::to_string(o.cfg.warmup));
  }
  // Under an MPI launcher the data-parallel degree is what the world
  // leaves after tp and pp, unless --dp says otherwise.
  const train_llama::launch_world world = train_llama::launched_world();
  if (train_llama::launched_by_mpi() && app.count("--dp") == 0 && o.tp > 0 && o.cfg.pp > 0 &&
      world.size % (o.tp * o.cfg.pp) == 0)
    o.dp = static_cast<int>(world.size / (o.tp * o.cfg.pp));
  created_paths created;
  // Under an MPI launch every rank prepares the same files; only rank 0
  // removes them after bad input, so no rank deletes what another reads.
  if (train_llama::launched_world().rank != 0) created.keep = true;
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
    if (o.precision.empty()) o.precision = gpu ? "bf16_mixed_bf16_grads" : "fp32";
    if (o.checkpointing.empty()) o.checkpointing = gpu ? "full" : "none";
    TESSERA_THROW_IF(o.precision != "fp32" && o.precision != "bf16" && o.precision != "bf16_mixed" &&
                         o.precision != "bf16_mixed_bf16_grads" && o.precision != "fp64",
                     config_error, "unknown precision '", o.precision,
                     "' (valid: fp32, bf16, bf16_mixed_bf16_grads, fp64)");
    TESSERA_THROW_IF(o.optimizer != "adamw" && o.optimizer != "sgd", config_error,
                     "unknown optimizer '", o.optimizer, "' (valid: adamw, sgd)");
    if (o.optimizer == "sgd") o.cfg.sgd.weight_decay = app.count("--weight-decay") ? o.cfg.adamw.weight_decay : 0.0;
    (void)nn::parse_checkpointing(o.checkpointing);
    TESSERA_THROW_IF(o.checkpoint_layers < 1 || o.checkpoint_layers > 1000000, config_error,
                     "--checkpoint-layers ", o.checkpoint_layers, " must be in [1, 1000000]");
    TESSERA_THROW_IF(!std::isfinite(o.bucket_mb) || !(o.bucket_mb > 0) || o.bucket_mb > 1e6,
                     config_error, "--bucket-mb ", o.bucket_mb, " must be in (0, 1e6]");
    TESSERA_THROW_IF(o.dp > 1024, config_error, "dp=", o.dp, " exceeds the limit of 1024 ranks");
    TESSERA_THROW_IF(o.tp < 1 || o.tp > 64, config_error, "tp=", o.tp,
                     " must be in [1, 64] (one node's ranks)");
    TESSERA_THROW_IF(o.cfg.pp < 1 || o.cfg.pp > 256, config_error, "pp=", o.cfg.pp,
                     " must be in [1, 256]");
    TESSERA_THROW_IF(o.cfg.virtual_stages < 1 || o.cfg.virtual_stages > 64, config_error,
                     "--virtual-stages ", o.cfg.virtual_stages, " must be in [1, 64]");
    (void)parallel::parse_schedule_kind(o.schedule);
    TESSERA_THROW_IF(o.dp * o.tp * o.cfg.pp > 1024, config_error, "dp=", o.dp, " x tp=", o.tp,
                     " x pp=", o.cfg.pp, " = ", o.dp * o.tp * o.cfg.pp,
                     " ranks exceeds the limit of 1024");
    if (o.cfg.sequence_parallel) nn::check_sequence_parallel(o.cfg.seq, o.tp);
    if (!o.init_from_hf.empty())
      for (const char* f : {"--preset", "--dim", "--layers", "--heads", "--kv-heads", "--ffn", "--vocab"})
        TESSERA_THROW_IF(app.count(f) > 0, config_error, f,
                         " cannot be given with --init-from-hf: the model's sizes are its "
                         "config.json's");
    TESSERA_THROW_IF(!o.hf_dtype.empty() && o.export_hf.empty(), config_error, "--hf-dtype ",
                     o.hf_dtype, " needs --export-hf DIR");
    TESSERA_THROW_IF(!o.export_hf.empty() && fs::exists(o.export_hf) && !fs::is_directory(o.export_hf),
                     io_error, "--export-hf '", o.export_hf, "' exists and is not a folder");
    if (!o.export_hf.empty()) {  // checked now, not after the run: created (and probed) here
      fs::path p = fs::absolute(o.export_hf);
      std::vector<fs::path> missing;
      for (; !fs::exists(p) && p.has_parent_path() && p != p.parent_path(); p = p.parent_path())
        missing.push_back(p);
      TESSERA_THROW_IF(!fs::is_directory(p), io_error, "--export-hf '", o.export_hf, "': '",
                       p.string(), "' is not a folder");
      std::error_code mk;
      fs::create_directories(o.export_hf, mk);
      TESSERA_THROW_IF(mk || ::access(o.export_hf.c_str(), W_OK) != 0, io_error, "--export-hf '",
                       o.export_hf, "' cannot be created or written",
                       mk ? ": " + mk.message() : std::string());
      for (auto it = missing.rbegin(); it != missing.rend(); ++it) created.paths.push_back(*it);
    }
    if (!o.hf_dtype.empty()) (void)nn::hf_safetensors_dtype(o.hf_dtype);
    if (!o.init_from_hf.empty()) {
      (void)train_llama::model_config(o);   // config.json: what the model cannot express
      (void)nn::hf_checkpoint(o.init_from_hf);  // every tensor against it
    }
    if (o.comm == "auto")
      o.comm = train_llama::launched_by_mpi() ? (gpu ? "nccl" : "mpi") : "local";
    TESSERA_THROW_IF(o.comm != "local" && o.comm != "mpi" && o.comm != "nccl", config_error,
                     "--comm '", o.comm, "' is not one of local, mpi, nccl");
    TESSERA_THROW_IF(o.comm == "nccl" && !gpu, config_error,
                     "--comm nccl reduces GPU memory: it needs --backend cuda");
    TESSERA_THROW_IF(gpu && o.comm != "nccl" &&
                         (o.dp > 1 || o.tp > 1 || o.cfg.pp > 1 || app.count("--comm") > 0),
                     config_error, "--backend cuda --comm ", o.comm,
                     ": GPUs reduce over --comm nccl (one MPI process per GPU)");
    // The data-parallel path: any of --dp > 1, --zero, --comm, or mpirun.
    o.parallel = o.dp > 1 || o.tp > 1 || o.cfg.pp > 1 || app.count("--zero") > 0 ||
                 app.count("--comm") > 0 ||
                 o.comm == "mpi" || o.comm == "nccl";
    TESSERA_THROW_IF(o.trace_step > 0 && o.trace.empty(), config_error, "--trace-step ",
                     o.trace_step, " needs --trace FILE");
    if (!o.trace.empty()) {
      // Checked now: a trace that cannot be written is bad input, not a
      // failure after training (and under MPI only rank 0 writes it).
      const fs::path t = fs::absolute(o.trace);
      TESSERA_THROW_IF(fs::is_directory(t), io_error, "--trace '", o.trace, "' is a directory");
      TESSERA_THROW_IF(!fs::is_directory(t.parent_path()) || ::access(t.parent_path().c_str(), W_OK) != 0,
                       io_error, "--trace '", o.trace, "': folder '", t.parent_path().string(),
                       "' does not exist or is not writable");
    }
    // A resumed run writes where it resumes from, wherever that folder is
    // now, unless --out is on the command line.
    // The model's sizes are refused before any file is touched (the
    // vocabulary, which follows the data, is checked once it is known).
    {
      const nn::llama_config mc = train_llama::model_config(o);
      mc.validate();
      nn::check_tensor_parallel(mc, o.tp);
    }
    if (!o.resume.empty() && !argv_has(argc, argv, "--out")) o.out = o.resume;
    TESSERA_THROW_IF(o.sample_only && o.resume.empty(), config_error,
                     "--sample-only samples from a checkpoint: it needs --resume DIR");
    TESSERA_THROW_IF(o.sample_only && o.sample_bytes == 0, config_error,
                     "--sample-only with --sample-bytes 0 has nothing to do");
    if (!config_default.empty()) {
      // The steps the checkpoint's run planned, for the log of an extension.
      std::ifstream in(config_default);
      for (const auto& item : CLI::ConfigTOML().from_config(in))
        if (item.name == "steps" && item.inputs.size() == 1)
          o.planned_steps = std::stoll(item.inputs[0]);
    }
    if (app.count("--data") > 0) set_effective(app, "--data", fs::absolute(o.data).string());
    set_effective(app, "--out", o.out);
    o.config_toml = app.config_to_str(false, false);
    o.config_json = all_settings(app);
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
    remove_stale_temporaries(out);
    const fs::path tok = prepare_tokens(o.data, out, o.data_format, created);
    prepare_vocabulary(app, o, tok);
    return gpu ? train_llama::run_cuda(o, tok, created) : train_llama::run_host(o, tok, created);
  } catch (...) {
    return train_llama::report_failure(o);
  }
}
