// hf_interop: tessera's side of the checks against Hugging Face
// (tests/python/check_hf.py, driven by tests/python/hf_interop.sh).
//
//   hf_interop export DIR     trains a small grouped-query Llama for a few
//                             steps (its norm gains move off 1), exports it to
//                             DIR with trainer::export_hf and writes
//                             DIR/tessera_expect.json: a fixed sequence, the
//                             float32 logits tessera computes at each of its
//                             positions, and its mean next-token loss
//   hf_interop export-llama3 DIR
//                             the same with Llama 3.1's RoPE scaling (factor
//                             8, original context 16) and 48 positions
//   hf_interop train-export SRC DIR
//                             the same from the weights of the Hugging Face
//                             folder SRC (its config.json's model: tied
//                             embeddings for llama3_2_tied_fp64), 96
//                             positions; the export of a tied model holds
//                             no lm_head.weight
//   hf_interop import DIR     reads the Hugging Face folder DIR (saved by
//                             transformers) into tessera's Llama
//                             (llama_options::weights) and holds the logits
//                             at every position and the loss against
//                             DIR/expect.json (transformers' float32 values)
//                             at 1e-5 of the largest logit. A float64
//                             folder (llama3_rope_fp64) is held in float64:
//                             its inverse frequencies to 1e-15, its logits
//                             (precision::fp64) and loss to 1e-12, and its
//                             "float32" logits and loss (transformers as
//                             it stands) at 1e-6; the logits with the RoPE
//                             scaling dropped must miss by more than 1e-3
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
#include <tessera/kernels/rmsnorm.hpp>
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

// Logits (T, V) at every position of `ids` in float64 from the model
// `c` of `reader`: the hidden states of a precision::fp64 model of the
// embedding and every block (llama_options::stage without the head:
// next_token_logits rounds to float32), then the final RMSNorm and the LM
// head in double, as the head computes them.
std::vector<std::vector<double>> logits_fp64(const nn::llama_config& c,
                                             const nn::tensor_reader& reader,
                                             const std::vector<std::int32_t>& ids) {
  nn::llama_options o;
  o.weights = &reader;
  o.stage.head = false;
  nn::llama<precision::fp64> m(c, o);
  m.init_weights(0);
  const std::int64_t T = static_cast<std::int64_t>(ids.size()), H = c.dim, V = c.vocab;
  const auto x = m.forward_hidden({ids.data(), nullptr, nullptr, 1, T});  // (T, H)
  std::vector<double> norm(static_cast<std::size_t>(H)), head(static_cast<std::size_t>(V * H));
  reader("final_norm", 0, H, norm.data());
  reader("lm_head", 0, V * H, head.data());
  std::vector<double> xn(static_cast<std::size_t>(T * H)), rstd(static_cast<std::size_t>(T));
  kernels::rmsnorm_forward(kernels::default_host_context(), xn.data(), rstd.data(), x.data(),
                           norm.data(), T, H, c.norm_eps);
  std::vector<std::vector<double>> z(static_cast<std::size_t>(T),
                                     std::vector<double>(static_cast<std::size_t>(V)));
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t v = 0; v < V; ++v) {
      double acc = 0;
      for (std::int64_t h = 0; h < H; ++h) acc += xn[t * H + h] * head[v * H + h];
      z[static_cast<std::size_t>(t)][static_cast<std::size_t>(v)] = acc;
    }
  return z;
}

// The largest |got - want| over all logits, over the positions from
// `from` on, and the largest |want|.
struct logit_error {
  double worst = 0, worst_from = 0, scale = 0;
};
template <class Row>
logit_error compare_logits(const std::vector<Row>& got, const nlohmann::json& want,
                           std::size_t from) {
  logit_error e;
  for (std::size_t t = 0; t < got.size(); ++t)
    for (std::size_t v = 0; v < got[t].size(); ++v) {
      const double w = want[t][v].get<double>();
      const double d = std::fabs(static_cast<double>(got[t][v]) - w);
      e.worst = std::max(e.worst, d);
      if (t >= from) e.worst_from = std::max(e.worst_from, d);
      e.scale = std::max(e.scale, std::fabs(w));
    }
  return e;
}

// Trains model `c` (from the Hugging Face folder `init_from_hf` unless
// empty) for a few steps of AdamW on random tokens, so the norm gains move
// off 1, exports it to `dir` and writes dir/tessera_expect.json: `positions`
// fixed tokens, tessera's float32 logits at each and the mean loss.
int export_trained(const nn::llama_config& c, const std::string& init_from_hf, const fs::path& dir,
                   std::int64_t positions) {
  const fs::path tok = fs::temp_directory_path() /
                       ("tessera_hf_interop_" + std::to_string(::getpid()) + ".tok");
  std::vector<std::uint32_t> text;
  std::uint64_t s = 7;
  for (int i = 0; i < 20000; ++i) {
    s = mix64(s);
    text.push_back(c.vocab >= 123
                       ? static_cast<std::uint32_t>(97 + s % 26)
                       : static_cast<std::uint32_t>(s % static_cast<std::uint64_t>(c.vocab)));
  }
  data::write_token_file(tok, text, static_cast<std::uint64_t>(c.vocab));
  train::train_config cfg;
  cfg.steps = 5;
  cfg.global_batch = 4;
  cfg.micro_batch = 4;
  cfg.seq = 32;
  cfg.lr = 1e-2;
  cfg.warmup = 1;
  cfg.eval_windows = 4;
  cfg.init_from_hf = init_from_hf;
  double loss = 0;
  std::vector<std::vector<float>> logits;
  const std::vector<std::int32_t> ids = fixed_sequence(positions, c.vocab);
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
  std::printf(
      "hf_interop: exported a %lld-layer GQA Llama (%lld/%lld heads, RoPE scaling %s%s%s%s) "
      "to %s\n",
      (long long)c.n_layers, (long long)c.n_heads, (long long)c.n_kv_heads,
      nn::to_string(c.rope_scaling).c_str(), c.tie_word_embeddings ? ", tied embeddings" : "",
      init_from_hf.empty() ? "" : ", trained from ", init_from_hf.c_str(), dir.c_str());
  return 0;
}

int do_export(const fs::path& dir, bool llama3) {
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
  // Llama 3.1's scaling with an original context of 16: head dim 16 puts
  // one frequency in each of the kept and blended bands, six divided.
  if (llama3) c.rope_scaling = nn::llama3_rope_scaling{8.0, 1.0, 4.0, 16};
  return export_trained(c, "", dir, llama3 ? 48 : 24);
}

// Holds the float32 model of `ck` against transformers' float32 `want`
// ({"tokens", "logits", "loss"}) at `tol` of the largest logit and
// relative on the loss.
bool check_fp32(const nn::hf_checkpoint& ck, const fs::path& dir, const nlohmann::json& want,
                const std::vector<std::int32_t>& ids, double tol) {
  const nn::tensor_reader reader = ck.reader();
  nn::llama_options o;
  o.weights = &reader;
  nn::llama<precision::fp32> m(ck.config(), o);
  m.init_weights(0);
  double loss = 0;
  std::vector<std::vector<float>> logits;
  evaluate(m, ids, logits, loss);
  const logit_error e = compare_logits(logits, want["logits"], 0);
  const double want_loss = want["loss"].get<double>();
  const double loss_rel = std::fabs(loss - want_loss) / want_loss;
  std::printf(
      "hf_interop: %s (%s, %s%s%s): float32 logits max error %.3g of the largest %.3g "
      "(%.2e), loss %.9f vs transformers' %.9f (%.2e), tolerance %.0e\n",
      dir.c_str(), ck.torch_dtype().c_str(),
      fs::exists(dir / "model.safetensors.index.json") ? "sharded" : "one file",
      ck.tied() ? ", tied embeddings" : "", ck.config().rope_scaling ? ", llama3 RoPE scaling" : "",
      e.worst, e.scale, e.worst / e.scale, loss, want_loss, loss_rel, tol);
  return e.worst <= tol * e.scale && loss_rel <= tol;
}

// A float64 folder: tessera's inverse frequencies against transformers'
// (its _compute_llama3_parameters run in float64: check_hf.py), the
// float64 logits at every position and the loss against transformers'
// float64 ones (1e-12: float64 sums in another order, over a model of
// 2 layers), and the same logits with the RoPE scaling dropped, which
// must miss (the check has teeth).
bool check_fp64(const nn::hf_checkpoint& ck, const fs::path& dir, const nlohmann::json& want,
                const std::vector<std::int32_t>& ids) {
  const nn::llama_config& c = ck.config();
  const nn::tensor_reader reader = ck.reader();
  bool ok = true;
  const std::size_t past =
      c.rope_scaling ? static_cast<std::size_t>(c.rope_scaling->original_max_position_embeddings)
                     : 0;
  if (want.contains("inv_freq")) {
    const std::vector<double> f = c.rope_inv_freqs();
    const auto hf = want["inv_freq"].get<std::vector<double>>();
    double rel = hf.size() == f.size() ? 0 : 1;
    for (std::size_t i = 0; i < std::min(f.size(), hf.size()); ++i)
      rel = std::max(rel, std::fabs(f[i] - hf[i]) / hf[i]);
    // Both in double; theta^(-2i/hd) against 1 / theta^(2i/hd): an ulp or two.
    std::printf(
        "hf_interop: %s: %zu inverse frequencies, largest relative difference to "
        "transformers' (float64) %.2e\n",
        dir.c_str(), f.size(), rel);
    ok = rel <= 1e-15 && ok;
  }
  const auto z = logits_fp64(c, reader, ids);
  const logit_error e = compare_logits(z, want["logits"], past);
  nn::llama_options o;
  o.weights = &reader;
  nn::llama<precision::fp64> m(c, o);
  m.init_weights(0);
  const nn::loss_sum r = m.forward_loss(ids.data(), 1, static_cast<std::int64_t>(ids.size()) - 1);
  const double loss = r.sum / static_cast<double>(r.scored), want_loss = want["loss"].get<double>();
  const double loss_rel = std::fabs(loss - want_loss) / want_loss;
  std::printf(
      "hf_interop: %s (float64, RoPE scaling %s): float64 logits at %zu positions max "
      "error %.3g of the largest %.3g (%.2e; %.2e from position %zu on), loss %.15f vs "
      "transformers' %.15f (%.2e), tolerance 1e-12\n",
      dir.c_str(), nn::to_string(c.rope_scaling).c_str(), z.size(), e.worst, e.scale,
      e.worst / e.scale, e.worst_from / e.scale, past, loss, want_loss, loss_rel);
  ok = e.worst <= 1e-12 * e.scale && loss_rel <= 1e-12 && ok;
  if (c.rope_scaling) {
    nn::llama_config plain = c;
    plain.rope_scaling.reset();
    const logit_error p = compare_logits(logits_fp64(plain, reader, ids), want["logits"], past);
    std::printf(
        "hf_interop: %s: with the RoPE scaling dropped the logits miss by %.2e of the "
        "largest (%.2e from position %zu on): %s\n",
        dir.c_str(), p.worst / p.scale, p.worst_from / p.scale, past,
        p.worst_from > 1e-3 * p.scale ? "the check would catch it" : "NOT CAUGHT");
    ok = p.worst_from > 1e-3 * p.scale && ok;
  }
  return ok;
}

int do_import(const fs::path& dir) {
  nn::hf_checkpoint ck(dir);
  std::ifstream in(dir / "expect.json");
  TESSERA_THROW_IF(!in, io_error, "cannot read '", (dir / "expect.json").string(), "'");
  const auto want = nlohmann::json::parse(in);
  const auto ids = want["tokens"].get<std::vector<std::int32_t>>();
  bool ok = true;
  if (ck.torch_dtype() == "float64")
    ok = check_fp64(ck, dir, want, ids);
  else
    ok = check_fp32(ck, dir, want, ids, 1e-5);
  // transformers in float32 as it stands (float32 RoPE angles and RMSNorm).
  if (want.contains("float32")) ok = check_fp32(ck, dir, want["float32"], ids, 1e-6) && ok;
  return ok ? 0 : 1;
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
    if (mode == "export" && argc == 3) return do_export(argv[2], false);
    if (mode == "export-llama3" && argc == 3) return do_export(argv[2], true);
    if (mode == "train-export" && argc == 4)
      return export_trained(nn::llama_config_from_hf_folder(argv[2]), argv[2], argv[3], 96);
    if (mode == "import" && argc == 3) return do_import(argv[2]);
    if (mode == "decode" && argc == 5) return do_decode(argv[2], argv[3], argv[4]);
    if (mode == "ids" && argc == 3) return do_ids(argv[2]);
    std::fprintf(stderr,
                 "usage: hf_interop export DIR | export-llama3 DIR | train-export SRC DIR | "
                 "import DIR | decode TOK TOKENIZER OUT | ids FILE\n");
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
