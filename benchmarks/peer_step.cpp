// peer_step: tessera's side of the PyTorch peer benchmark
// (benchmarks/peer_pytorch.py runs it and PyTorch eager interleaved).
//
// Trains train::trainer<P> on one CPU rank for --warmup + --steps optimizer
// steps of one micro-batch (G = B) of seeded random tokens of the preset's
// vocabulary: forward, backward, global-norm clip at 1.0 and AdamW, as the
// PyTorch side does. Prints and writes (--json) the median and the best of
// the timed steps' wall times.
//
// --dump DIR first writes what the PyTorch side needs to compute the same
// loss on the same batch: DIR/weights.bin (every parameter tensor as
// float32, in the order and with the shapes of DIR/peer.json's "tensors";
// bf16 weights are widened exactly), the (B, T+1) token windows of step 0
// and, after step 1, its loss (the mean cross-entropy of the initial
// weights on those windows).
//
//   build/host/benchmarks/peer_step --preset small --precision fp32 --micro-batch 16 --seq 128
//   build/host/benchmarks/peer_step --preset llama2_7b --layers 1 --micro-batch 1 --seq 256 --steps 2
//
// Exit status 2 for bad arguments, naming the value.

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include <unistd.h>

#include "bench_io.hpp"
#include "tessera/core/random.hpp"
#include "tessera/data/sampler.hpp"
#include "tessera/data/token_file.hpp"
#include "tessera/kernels/blas.hpp"
#include "tessera/train/trainer.hpp"

using namespace tessera;
namespace fs = std::filesystem;

namespace {

struct options {
  std::string preset = "small";
  std::string precision = "fp32";
  std::int64_t layers = 0;  // 0: the preset's
  std::int64_t micro_batch = 16;
  std::int64_t seq = 128;
  std::int64_t warmup = 2;
  std::int64_t steps = 10;
  std::uint64_t seed = 1337;
  std::string dump;
  std::string json;
};

struct temp_file {
  fs::path path;
  ~temp_file() {
    std::error_code ec;
    fs::remove(path, ec);
  }
};


// The model's parameters as float32 and their table (DIR/weights.bin).
template <class Model>
nlohmann::json dump_weights(const Model& model, const fs::path& dir) {
  using Param = std::remove_cv_t<std::remove_pointer_t<decltype(model.params())>>;
  const auto& entries = model.layout().entries();
  std::vector<Param> flat(static_cast<std::size_t>(model.flat_size()));
  model.context().to_host(flat.data(), model.params(), flat.size() * sizeof(Param));
  nlohmann::json tensors = nlohmann::json::array();
  const fs::path bin = dir / "weights.bin", tmp = dir / "weights.bin.tmp";
  {
    std::ofstream f(tmp, std::ios::binary);
    std::int64_t offset = 0;
    for (const auto& e : entries) {
      std::vector<float> v(static_cast<std::size_t>(e.numel));
      for (std::int64_t i = 0; i < e.numel; ++i)
        v[static_cast<std::size_t>(i)] = to<float>(flat[static_cast<std::size_t>(e.offset + i)]);
      f.write(reinterpret_cast<const char*>(v.data()),
              static_cast<std::streamsize>(v.size() * sizeof(float)));
      std::vector<std::int64_t> dims(e.shp.dims.begin(), e.shp.dims.begin() + e.shp.rank);
      tensors.push_back({{"name", e.name}, {"shape", dims}, {"offset", offset}});
      offset += e.numel;
    }
    TESSERA_THROW_IF(!f, io_error, "cannot write '", tmp.string(), "'");
  }
  fs::rename(tmp, bin);
  return tensors;
}

template <precision::policy P>
int run(const options& o) {
  auto mc = nn::llama_config::from_name(o.preset);
  if (o.layers > 0) mc.n_layers = o.layers;
  if (o.preset == "small" || o.preset == "tiny") mc.vocab = 256;
  TESSERA_THROW_IF(o.seq > mc.max_seq, config_error, "--seq ", o.seq, " exceeds the preset's max_seq ",
                   mc.max_seq);
  const std::int64_t V = mc.vocab, B = o.micro_batch, T = o.seq;

  temp_file corpus_file{fs::temp_directory_path() /
                        ("tessera_peer_step_" + std::to_string(::getpid()) + ".tok")};
  bench::write_random_tokens(
      corpus_file.path, V,
      std::max<std::uint64_t>(4096, static_cast<std::uint64_t>(20 * (B + 1) * (T + 1))), o.seed);
  data::token_file corpus(corpus_file.path);

  train::train_config cfg;
  cfg.steps = o.warmup + o.steps;
  cfg.global_batch = B;
  cfg.micro_batch = B;
  cfg.seq = T;
  cfg.lr = 3e-4;
  cfg.warmup = 0;
  cfg.grad_clip = 1.0;
  cfg.eval_windows = 1;
  cfg.seed = o.seed;
  train::trainer<P> tr(mc, cfg, corpus);

  nlohmann::json peer;
  if (!o.dump.empty()) {
    const fs::path dir(o.dump);
    fs::create_directories(dir);
    peer["config"] = {{"dim", mc.dim},         {"n_layers", mc.n_layers}, {"n_heads", mc.n_heads},
                      {"n_kv_heads", mc.n_kv_heads}, {"ffn_dim", mc.ffn_dim}, {"vocab", mc.vocab},
                      {"rope_theta", mc.rope_theta}, {"norm_eps", mc.norm_eps}};
    peer["precision"] = P::name;
    peer["tensors"] = dump_weights(tr.model(), dir);
    // The windows of step 0 exactly as the trainer's sampler draws them.
    data::batch_sampler s(corpus, corpus.split().train, B, T, cfg.seed);
    std::vector<std::int32_t> w(static_cast<std::size_t>(B * (T + 1)));
    s.fill(0, 0, w.data());
    peer["tokens"] = w;
    peer["B"] = B;
    peer["T"] = T;
  }

  std::vector<double> secs;
  double first_loss = 0;
  for (std::int64_t s = 0; s < o.warmup + o.steps; ++s) {
    const auto m = tr.train_step();
    if (s == 0) first_loss = m.loss;
    TESSERA_THROW_IF(!std::isfinite(m.loss), error, "step ", s + 1, " loss is ", m.loss);
    if (s >= o.warmup) secs.push_back(m.seconds);
  }
  if (!o.dump.empty()) {
    peer["loss"] = first_loss;
    bench::write_json(fs::path(o.dump) / "peer.json", peer);
  }
  std::vector<double> sorted = secs;
  std::sort(sorted.begin(), sorted.end());
  const std::size_t n = sorted.size();
  const double median = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
  std::printf("peer_step: %s, %lld layers, %s, B %lld, T %lld: first loss %.6f, median step %.4f s, "
              "best %.4f s over %zu steps, %.0f tokens/s\n",
              o.preset.c_str(), (long long)mc.n_layers, P::name, (long long)B, (long long)T,
              first_loss, median, sorted.front(), n, static_cast<double>(B * T) / median);
  if (!o.json.empty())
    bench::write_json(o.json, {{"median_s", median}, {"best_s", sorted.front()}, {"steps", secs},
                        {"first_loss", first_loss}, {"tokens_per_step", B * T}});
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  (void)kernels::check_blas_core(argv);
  options o;
  CLI::App app{"peer_step: tessera's timed steps for the PyTorch peer benchmark"};
  app.add_option("--preset", o.preset, "model preset")
      ->check(CLI::IsMember(nn::llama_config::preset_names()))->capture_default_str();
  app.add_option("--precision", o.precision, "fp32 or bf16_mixed")
      ->check(CLI::IsMember({"fp32", "bf16_mixed"}))->capture_default_str();
  app.add_option("--layers", o.layers, "blocks to build (0: the preset's)")->check(CLI::Range(0, 1024))->capture_default_str();
  app.add_option("--micro-batch", o.micro_batch, "B (the global batch is one micro-batch)")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  app.add_option("--seq", o.seq, "T")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  app.add_option("--warmup", o.warmup, "untimed steps first")->check(CLI::Range(1, 1000))->capture_default_str();
  app.add_option("--steps", o.steps, "timed steps")->check(CLI::Range(1, 100000))->capture_default_str();
  app.add_option("--seed", o.seed, "seed of the tokens, the weights and the windows")->capture_default_str();
  app.add_option("--dump", o.dump, "write the weights, step 0's windows and its loss to this folder");
  app.add_option("--json", o.json, "write the step times here");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  try {
    return o.precision == "fp32" ? run<precision::fp32>(o) : run<precision::bf16_mixed>(o);
  } catch (const config_error& e) {
    std::fprintf(stderr, "peer_step: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "peer_step: error: %s\n", e.what());
    return 1;
  }
}
