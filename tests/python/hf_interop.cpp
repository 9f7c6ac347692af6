// hf_interop: tessera's side of the checks against Hugging Face
// (tests/python/check_hf.py, driven by tests/python/hf_interop.sh).
//
//   hf_interop export DIR     trains a small grouped-query Llama for a few
//                             steps (its norm gains move off 1), exports it to
//                             DIR with trainer::export_hf and writes
//                             DIR/tessera_expect.json: a fixed sequence, the
//                             float32 logits tessera computes at each of its
//                             positions, and its mean next-token loss
//   hf_interop import DIR     reads the Hugging Face folder DIR (saved by
//                             transformers) into tessera's Llama
//                             (llama_options::weights) and holds the logits
//                             at every position and the loss against
//                             DIR/expect.json (transformers' float32 values)
//                             at 1e-5 of the largest logit
//   hf_interop decode TOK TOKENIZER OUT
//                             writes the token file TOK (any format the
//                             reader takes) decoded through TOKENIZER
//                             (data::hf_tokenizer) to OUT
//   hf_interop ids FILE       prints the vocabulary and the ids of a token
//                             file (tessera's, llm.c's .bin or NumPy's .npy)
//
// Exit status 0 when the values agree, 1 when they do not, 2 on bad input.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <tessera/core/random.hpp>
#include <tessera/data/hf_tokenizer.hpp>
#include <tessera/data/token_file.hpp>
#include <tessera/nn/hf_llama.hpp>
#include <tessera/nn/llama.hpp>
#include <tessera/train/trainer.hpp>

namespace fs = std::filesystem;
using namespace tessera;

namespace {

// Logits (T, V) at every position of `ids` and the mean next-token loss
// (targets ids[1..T)), in float32 as the model computes them.
template <class Model>
void evaluate(Model& m, const std::vector<std::int32_t>& ids, std::vector<std::vector<float>>& logits,
              double& loss) {
  const std::int64_t T = static_cast<std::int64_t>(ids.size()), V = m.config().vocab;
  logits.assign(static_cast<std::size_t>(T), std::vector<float>(static_cast<std::size_t>(V)));
  for (std::int64_t t = 1; t <= T; ++t)
    m.next_token_logits(ids.data(), t, logits[static_cast<std::size_t>(t - 1)].data());
  // forward_loss takes (B, T + 1) windows: inputs [0, T), targets [1, T].
  const nn::loss_sum r = m.forward_loss(ids.data(), 1, T - 1);
  loss = r.sum / static_cast<double>(r.scored);
}

std::vector<std::int32_t> fixed_sequence(std::int64_t n, std::int64_t vocab) {
  std::vector<std::int32_t> ids;
  std::uint64_t s = 20261203;
  for (std::int64_t i = 0; i < n; ++i) {
    s = mix64(s);
    ids.push_back(static_cast<std::int32_t>(s % static_cast<std::uint64_t>(vocab)));
  }
  return ids;
}

int do_export(const fs::path& dir) {
  nn::llama_config c;
  c.name = "interop";
  c.dim = 64;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;  // grouped-query attention: two query heads per key/value head
  c.ffn_dim = 160;
  c.vocab = 256;
  c.max_seq = 64;
  c.rope_theta = 500000.0;
  c.norm_eps = 1e-5;
  // A few steps of AdamW on random bytes, so the norm gains are not 1.
  const fs::path tok = fs::temp_directory_path() /
                       ("tessera_hf_interop_" + std::to_string(::getpid()) + ".tok");
  std::vector<std::uint32_t> text;
  std::uint64_t s = 7;
  for (int i = 0; i < 20000; ++i) {
    s = mix64(s);
    text.push_back(static_cast<std::uint32_t>(97 + s % 26));
  }
  data::write_token_file(tok, text, 256);
  train::train_config cfg;
  cfg.steps = 5;
  cfg.global_batch = 4;
  cfg.micro_batch = 4;
  cfg.seq = 32;
  cfg.lr = 1e-2;
  cfg.warmup = 1;
  cfg.eval_windows = 4;
  double loss = 0;
  std::vector<std::vector<float>> logits;
  const std::vector<std::int32_t> ids = fixed_sequence(24, c.vocab);
  {
    data::token_file f(tok);
    train::trainer<precision::fp32> tr(c, cfg, f);
    for (int i = 0; i < cfg.steps; ++i) tr.train_step();
    tr.export_hf(dir);
    evaluate(tr.model(), ids, logits, loss);
  }
  fs::remove(tok);
  tessera::write_json_file(dir / "tessera_expect.json",
                      {{"tokens", ids}, {"logits", logits}, {"loss", loss}});
  std::printf("hf_interop: exported a %lld-layer GQA Llama (%lld/%lld heads) to %s\n",
              (long long)c.n_layers, (long long)c.n_heads, (long long)c.n_kv_heads,
              dir.c_str());
  return 0;
}

int do_import(const fs::path& dir) {
  nn::hf_checkpoint ck(dir);
  std::ifstream in(dir / "expect.json");
  TESSERA_THROW_IF(!in, io_error, "cannot read '", (dir / "expect.json").string(), "'");
  const auto want = nlohmann::json::parse(in);
  const auto ids = want["tokens"].get<std::vector<std::int32_t>>();
  const nn::tensor_reader reader = ck.reader();
  nn::llama_options o;
  o.weights = &reader;
  nn::llama<precision::fp32> m(ck.config(), o);
  m.init_weights(0);
  double loss = 0;
  std::vector<std::vector<float>> logits;
  evaluate(m, ids, logits, loss);
  double worst = 0, scale = 0;
  for (std::size_t t = 0; t < logits.size(); ++t)
    for (std::size_t v = 0; v < logits[t].size(); ++v) {
      const double w = want["logits"][t][v].get<double>();
      worst = std::max(worst, std::fabs(logits[t][v] - w));
      scale = std::max(scale, std::fabs(w));
    }
  const double want_loss = want["loss"].get<double>();
  const double loss_rel = std::fabs(loss - want_loss) / want_loss;
  std::printf("hf_interop: %s (%s, %s%s): logits max error %.3g of the largest %.3g (%.2e), "
              "loss %.9f vs transformers' %.9f (%.2e)\n",
              dir.c_str(), ck.torch_dtype().c_str(),
              fs::exists(dir / "model.safetensors.index.json") ? "sharded" : "one file",
              ck.tied() ? ", tied embeddings" : "", worst, scale, worst / scale, loss, want_loss,
              loss_rel);
  return worst <= 1e-5 * scale && loss_rel <= 1e-5 ? 0 : 1;
}

int do_decode(const fs::path& tok, const fs::path& tokenizer, const fs::path& out) {
  const data::token_file f(tok);
  const data::hf_tokenizer t(tokenizer);
  std::vector<std::uint32_t> ids(f.size());
  for (std::uint64_t i = 0; i < f.size(); ++i) ids[i] = f[i];
  const std::string text = t.decode(ids);
  std::ofstream(out, std::ios::binary) << text;
  std::printf("hf_interop: %llu tokens decoded to %zu bytes through %s\n",
              (unsigned long long)f.size(), text.size(), tokenizer.c_str());
  return 0;
}

int do_ids(const fs::path& file) {
  const data::token_file f(file);
  std::printf("%llu", (unsigned long long)f.vocab());
  for (std::uint64_t i = 0; i < f.size(); ++i) std::printf(" %u", f[i]);
  std::printf("\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string mode = argc >= 2 ? argv[1] : "";
    if (mode == "export" && argc == 3) return do_export(argv[2]);
    if (mode == "import" && argc == 3) return do_import(argv[2]);
    if (mode == "decode" && argc == 5) return do_decode(argv[2], argv[3], argv[4]);
    if (mode == "ids" && argc == 3) return do_ids(argv[2]);
    std::fprintf(stderr, "usage: hf_interop export DIR | import DIR | decode TOK TOKENIZER OUT | ids FILE\n");
    return 2;
  } catch (const config_error& e) {
    std::fprintf(stderr, "hf_interop: error: %s\n", e.what());
    return 2;
  } catch (const io_error& e) {
    std::fprintf(stderr, "hf_interop: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hf_interop: failed: %s\n", e.what());
    return 1;
  }
}
