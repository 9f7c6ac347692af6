// Hugging Face checkpoints in and out of train::trainer (nn/hf_llama.hpp):
// an export reads back bit for bit (float64) with transformers' names and a
// LlamaForCausalLM config.json; exports of dp x tp x pp meshes (ZeRO 1 and
// 3, sharded files) equal one rank's export; a trainer started from an
// export (one rank and a tp x pp mesh) holds its weights and computes one
// rank's loss; the bf16 export rounds each parameter once; every
// checkpoint tessera's Llama cannot express is refused naming the key and
// the value; a tied model exports tie_word_embeddings and no lm_head.weight,
// and a tied folder's lm_head.weight loads only as the embedding's bytes. (The files against transformers and an independent NumPy
// forward pass: tests/python/check_hf.py.)
#include <catch2/catch.hpp>

#include <omp.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <tessera/comm/device_mesh.hpp>
#include <tessera/comm/local.hpp>
#include <tessera/data/safetensors.hpp>
#include <tessera/nn/hf_llama.hpp>
#include <tessera/nn/tensor_parallel.hpp>

#include "pp_suite.hpp"
#include "trainer_suite.hpp"

namespace test_train_hf_checkpoint {

namespace fs = std::filesystem;
using namespace tessera;
using Catch::Contains;
using comm::local_communicator;
using comm::local_world;

namespace {

struct temp_dir {
  fs::path dir;
  temp_dir() {
    static int counter = 0;
    dir = fs::temp_directory_path() /
          ("tessera_hf_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~temp_dir() { fs::remove_all(dir); }
  fs::path operator/(const std::string& name) const { return dir / name; }
};

comm::comm_options test_options() {
  comm::comm_options o;
  o.timeout = std::chrono::seconds(60);
  return o;
}

// Every tensor of the checkpoint in `dir`, by tessera name, as doubles.
std::map<std::string, std::vector<double>> read_all(const fs::path& dir) {
  nn::hf_checkpoint ck(dir);
  std::map<std::string, std::vector<double>> out;
  const nn::param_layout layout = nn::make_llama_layout(ck.config());
  for (const auto& e : layout.entries()) {
    auto& v = out[e.name];
    v.resize(static_cast<std::size_t>(e.full.numel()));
    ck.tensor(e.name).read(0, e.full.numel(), v.data());
  }
  return out;
}

// The single rank's parameters by tessera name.
template <class Tr>
std::map<std::string, std::vector<double>> params_of(const Tr& tr) {
  std::map<std::string, std::vector<double>> out;
  for (const auto& e : tr.model().layout().entries()) {
    auto& v = out[e.name];
    for (std::int64_t j = 0; j < e.numel; ++j)
      v.push_back(to<double>(tr.model().params()[e.offset + j]));
  }
  return out;
}

// Largest |a - b| over the largest |b| of any tensor.
double max_rel_diff(const std::map<std::string, std::vector<double>>& a,
                    const std::map<std::string, std::vector<double>>& b) {
  double worst = 0;
  REQUIRE(a.size() == b.size());
  for (const auto& [name, want] : b) {
    const auto& got = a.at(name);
    REQUIRE(got.size() == want.size());
    double d = 0, s = 0;
    for (std::size_t i = 0; i < want.size(); ++i) {
      d = std::max(d, std::fabs(got[i] - want[i]));
      s = std::max(s, std::fabs(want[i]));
    }
    worst = std::max(worst, s > 0 ? d / s : d);
  }
  return worst;
}

// A safetensors file rewritten with `drop` removed and `add` (name -> F32
// values of shape {n}) added.
void rewrite(const fs::path& file, const std::vector<std::string>& drop,
             const std::map<std::string, std::vector<float>>& add = {}) {
  std::vector<std::vector<unsigned char>> keep;
  std::vector<data::safetensors_entry> entries;
  {
    data::safetensors_file f(file);
    for (const auto& [name, t] : f.tensors()) {
      if (std::find(drop.begin(), drop.end(), name) != drop.end()) continue;
      keep.emplace_back(t.data, t.data + t.bytes);
      entries.push_back({name, t.dtype, t.shape, nullptr, t.bytes});
    }
  }
  for (std::size_t i = 0; i < entries.size(); ++i) entries[i].data = keep[i].data();
  for (const auto& [name, v] : add)
    entries.push_back({name, "F32", {static_cast<std::int64_t>(v.size())}, v.data(), v.size() * 4});
  data::write_safetensors(file, entries);
}

// Rewrites `file` with tensor `to` (replaced if present) a copy of tensor
// `from`: its dtype, shape and bytes, the last byte's lowest bit flipped
// when `flip`.
void copy_tensor(const fs::path& file, const std::string& from, const std::string& to, bool flip) {
  std::vector<unsigned char> bytes;
  data::safetensors_entry e;
  {
    data::safetensors_file f(file);
    const data::safetensors_tensor* t = f.find(from);
    REQUIRE(t != nullptr);
    bytes.assign(t->data, t->data + t->bytes);
    e = {to, t->dtype, t->shape, nullptr, t->bytes};
  }
  if (flip) bytes.back() ^= 1;
  std::vector<std::vector<unsigned char>> keep;
  std::vector<data::safetensors_entry> entries;
  {
    data::safetensors_file f(file);
    for (const auto& [name, t] : f.tensors()) {
      if (name == to) continue;
      keep.emplace_back(t.data, t.data + t.bytes);
      entries.push_back({name, t.dtype, t.shape, nullptr, t.bytes});
    }
  }
  for (std::size_t i = 0; i < entries.size(); ++i) entries[i].data = keep[i].data();
  e.data = bytes.data();
  entries.push_back(e);
  data::write_safetensors(file, entries);
}

void edit_config(const fs::path& dir, const std::function<void(nlohmann::json&)>& f) {
  nlohmann::json j;
  {
    std::ifstream in(dir / "config.json");
    j = nlohmann::json::parse(in);
  }
  f(j);
  std::ofstream(dir / "config.json") << j.dump(2);
}

nn::llama_config model4() {
  return pp_suite::model(4);
}

train::train_config config(std::int64_t steps, int dp = 1, int tp = 1, int pp = 1) {
  pp_suite::layout l;
  l.dp = dp;
  l.tp = tp;
  l.pp = pp;
  l.micro_batches = 4 / dp;  // G = 4 sequences per step on every mesh
  return pp_suite::config(l, steps);
}

// Trains `steps` on the (dp, tp, pp) mesh under zero stage S and exports
// to `dir` (shards of at most `shard` bytes); or, with init set, starts
// from it and returns the first step's loss.
template <class S, class P = precision::fp64>
double run_mesh(const data::token_file& f, int dp, int tp, int pp, std::int64_t steps,
                const fs::path& dir, std::uint64_t shard, const std::string& init = "",
                const nn::llama_config& mc = model4()) {
  using Comm = local_communicator;
  using tp_layers = nn::tensor_parallel_layers<Comm>;
  double loss = 0;
  local_world::run(
      dp * tp * pp,
      [&](Comm& world) {
        omp_set_num_threads(1);
        const comm::device_mesh mesh(dp, tp, pp);
        auto g = comm::make_groups(world, mesh);
        train::train_config cfg = config(std::max<std::int64_t>(steps, 1), dp, tp, pp);
        cfg.init_from_hf = init;
        auto body = [&](auto& tr) {
          for (std::int64_t s = 0; s < steps; ++s) {
            const auto m = tr.train_step();
            if (s == 0 && world.rank() == 0) loss = m.loss;
          }
          if (init.empty()) tr.export_hf(dir, "", shard);
        };
        if (tp > 1) {
          train::trainer<P, host, optim::adamw, S, Comm, tp_layers> tr(
              mc, cfg, f, parallel::layout{g.dp, tp_layers{&g.tp}, g.pp});
          body(tr);
        } else {
          train::trainer<P, host, optim::adamw, S, Comm> tr(
              mc, cfg, f, parallel::layout{g.dp, nn::dense_layers{}, g.pp});
          body(tr);
        }
      },
      test_options());
  return loss;
}

}  // namespace

TEST_CASE("hf export: transformers' names and config.json, read back bit for bit (float64)",
          "[train][hf]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("hf", 0)};
  data::token_file f(corpus.path);
  temp_dir tmp;
  train::trainer<precision::fp64> tr(model4(), config(2), f);
  tr.train_step();
  tr.train_step();
  tr.export_hf(tmp.dir);
  CHECK(fs::exists(tmp / "model.safetensors"));
  CHECK(!fs::exists(tmp / "model.safetensors.index.json"));

  std::ifstream in(tmp / "config.json");
  const auto j = nlohmann::json::parse(in);
  const auto& c = tr.model().config();
  CHECK(j["architectures"][0] == "LlamaForCausalLM");
  CHECK(j["model_type"] == "llama");
  CHECK(j["hidden_size"] == c.dim);
  CHECK(j["intermediate_size"] == c.ffn_dim);
  CHECK(j["num_hidden_layers"] == 4);
  CHECK(j["num_attention_heads"] == c.n_heads);
  CHECK(j["num_key_value_heads"] == c.n_kv_heads);
  CHECK(j["vocab_size"] == 256);
  CHECK(j["max_position_embeddings"] == c.max_seq);
  CHECK(j["rms_norm_eps"] == c.norm_eps);
  CHECK(j["rope_theta"] == c.rope_theta);
  CHECK(j["tie_word_embeddings"] == false);
  CHECK(j["torch_dtype"] == "float64");

  data::safetensors_file st(tmp / "model.safetensors");
  CHECK(st.tensors().size() == 2 + 9 * 4 + 1);
  for (const char* n :
       {"model.embed_tokens.weight", "model.layers.3.self_attn.q_proj.weight",
        "model.layers.0.self_attn.k_proj.weight", "model.layers.1.self_attn.v_proj.weight",
        "model.layers.2.self_attn.o_proj.weight", "model.layers.0.input_layernorm.weight",
        "model.layers.0.post_attention_layernorm.weight", "model.layers.1.mlp.gate_proj.weight",
        "model.layers.1.mlp.up_proj.weight", "model.layers.1.mlp.down_proj.weight",
        "model.norm.weight", "lm_head.weight"})
    CHECK(st.find(n) != nullptr);
  // nn.Linear's (out, in): k_proj is (kv_dim, dim), down_proj (dim, ffn).
  CHECK(st.find("model.layers.0.self_attn.k_proj.weight")->shape ==
        std::vector<std::int64_t>{c.kv_dim(), c.dim});
  CHECK(st.find("model.layers.0.mlp.down_proj.weight")->shape ==
        std::vector<std::int64_t>{c.dim, c.ffn_dim});

  const auto want = params_of(tr);
  CHECK(max_rel_diff(read_all(tmp.dir), want) == 0);

  // A trainer started from the export holds the same bits and evaluates alike.
  train::train_config cfg = config(2);
  cfg.init_from_hf = tmp.dir.string();
  train::trainer<precision::fp64> again(model4(), cfg, f);
  CHECK(max_rel_diff(params_of(again), want) == 0);
  CHECK(again.evaluate() == tr.evaluate());
  // zero<3> reads its shards from the checkpoint too.
  local_world::run(
      2,
      [&](local_communicator& world) {
        omp_set_num_threads(1);
        train::train_config c2 = config(2, 2);
        c2.init_from_hf = tmp.dir.string();
        train::trainer<precision::fp64, host, optim::adamw, parallel::zero<3>, local_communicator>
            z3(model4(), c2, f, parallel::layout{world});
        std::vector<double> full(static_cast<std::size_t>(z3.model().flat_size()));
        z3.engine().full_params(full.data());
        for (std::size_t i = 0; i < full.size(); ++i)
          if (full[i] != to<double>(tr.model().params()[i]))
            throw std::runtime_error("zero<3> element " + std::to_string(i) + " differs");
      },
      test_options());
}

TEST_CASE("hf export and import of tied embeddings: tie_word_embeddings, no lm_head.weight",
          "[train][hf][tied]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("hftied", 0)};
  data::token_file f(corpus.path);
  temp_dir tmp;
  auto tied = model4();
  tied.tie_word_embeddings = true;
  train::trainer<precision::fp64> tr(tied, config(2), f);
  tr.train_step();
  tr.train_step();
  tr.export_hf(tmp.dir);
  std::ifstream in(tmp / "config.json");
  const auto j = nlohmann::json::parse(in);
  CHECK(j["tie_word_embeddings"] == true);
  data::safetensors_file st(tmp / "model.safetensors");
  CHECK(st.tensors().size() == 1 + 9 * 4 + 1);
  CHECK(st.find("lm_head.weight") == nullptr);
  CHECK(st.find("model.embed_tokens.weight") != nullptr);
  const auto want = params_of(tr);
  CHECK(max_rel_diff(read_all(tmp.dir), want) == 0);
  CHECK(nn::llama_config_from_hf_folder(tmp.dir).tie_word_embeddings);
  // Started from the export: the same bits, the same evaluation and steps.
  train::train_config cfg = config(2);
  cfg.init_from_hf = tmp.dir.string();
  train::trainer<precision::fp64> again(tied, cfg, f);
  CHECK(max_rel_diff(params_of(again), want) == 0);
  CHECK(again.evaluate() == tr.evaluate());
  // An untied model from a tied folder (or back) is refused, naming the key.
  REQUIRE_THROWS_WITH((train::trainer<precision::fp64>(model4(), cfg, f)),
                      Contains("tie_word_embeddings=false vs tie_word_embeddings=true"));
  // Meshes: pipelines whose last stage holds the copy export the tensor
  // once, as one rank does; started from the folder, a (1, 2, 2) mesh
  // computes one rank's first loss.
  train::trainer<precision::fp64> one(tied, config(3), f);
  for (int s = 0; s < 3; ++s) one.train_step();
  one.export_hf(tmp / "one");
  const auto want1 = read_all(tmp / "one");
  run_mesh<parallel::zero<1>>(f, 1, 2, 2, 3, tmp / "m122", nn::hf_default_shard_bytes, "", tied);
  run_mesh<parallel::zero<3>>(f, 2, 1, 2, 3, tmp / "m212", 1, "", tied);
  for (const char* m : {"m122", "m212"}) {
    INFO(m);
    CHECK(max_rel_diff(read_all(tmp / m), want1) <= 1e-10);
    std::ifstream ix_in(tmp / m / "model.safetensors.index.json");
    REQUIRE(ix_in);
    const auto ix = nlohmann::json::parse(ix_in);
    CHECK(ix["weight_map"].size() == 38);
    CHECK(!ix["weight_map"].contains("lm_head.weight"));
  }
  train::train_config c1 = config(1);
  c1.init_from_hf = (tmp / "one").string();
  train::trainer<precision::fp64> from(tied, c1, f);
  const double l1 = from.train_step().loss;
  const double lm = run_mesh<parallel::zero<1>>(
      f, 1, 2, 2, 1, tmp / "unused", nn::hf_default_shard_bytes, (tmp / "one").string(), tied);
  CHECK(std::fabs(lm - l1) <= 1e-10 * l1);
}

TEST_CASE("hf export and import of Llama 3.1's RoPE scaling, in both transformers spellings",
          "[train][hf][rope]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("hfrope", 0)};
  data::token_file f(corpus.path);
  temp_dir tmp;
  // hd 4: f_0 = 1 (wavelength 6.3, blended between 8/4 and 8/1) and f_1 =
  // 0.01 (wavelength 628: divided); the 16-token windows pass position 8.
  nn::llama_config c = model4();
  c.rope_scaling = nn::llama3_rope_scaling{8.0, 1.0, 4.0, 8};
  train::trainer<precision::fp64> tr(c, config(2), f);
  tr.train_step();
  tr.export_hf(tmp / "scaled");
  nlohmann::json j;
  {
    std::ifstream in(tmp / "scaled" / "config.json");
    j = nlohmann::json::parse(in);
  }
  // As Meta's Llama 3.1 folders hold it (transformers 4.43 on, and 5).
  CHECK(j["rope_theta"] == c.rope_theta);
  CHECK(j["rope_scaling"] == nlohmann::json{{"factor", 8.0},
                                            {"high_freq_factor", 4.0},
                                            {"low_freq_factor", 1.0},
                                            {"original_max_position_embeddings", 8},
                                            {"rope_type", "llama3"}});
  CHECK(!j.contains("rope_parameters"));
  CHECK(nn::llama_config_from_hf_folder(tmp / "scaled").rope_scaling == c.rope_scaling);

  // Started from the export: the same bits and the same loss.
  train::train_config cfg = config(2);
  cfg.init_from_hf = (tmp / "scaled").string();
  {
    train::trainer<precision::fp64> again(c, cfg, f);
    CHECK(max_rel_diff(params_of(again), params_of(tr)) == 0);
    CHECK(again.evaluate() == tr.evaluate());
  }
  // A model without the scaling (or with another) is refused, naming it.
  REQUIRE_THROWS_WITH(train::trainer<precision::fp64>(model4(), cfg, f),
                      Contains("rope_scaling=none vs rope_scaling=llama3(factor=8,"));
  // transformers 5's spelling, rope_parameters with rope_theta inside, and
  // the "type" key of transformers before 4.43: the same config.
  int spelling = 0;
  auto same_config = [&](const std::function<void(nlohmann::json&)>& e) {
    const fs::path d = tmp / ("spelling" + std::to_string(spelling++));
    fs::copy(tmp / "scaled", d);
    edit_config(d, e);
    const nn::llama_config h = nn::llama_config_from_hf_folder(d);
    CHECK(h.rope_scaling == c.rope_scaling);
    CHECK(h.rope_theta == c.rope_theta);
    CHECK(nn::hf_checkpoint(d).config().rope_inv_freqs() == c.rope_inv_freqs());
  };
  same_config([&](auto& k) {
    k["rope_parameters"] = k["rope_scaling"];
    k["rope_parameters"]["rope_theta"] = k["rope_theta"];
    k.erase("rope_scaling");
    k.erase("rope_theta");
  });
  same_config([&](auto& k) {  // both, agreeing
    k["rope_parameters"] = k["rope_scaling"];
    k["rope_parameters"]["rope_theta"] = k["rope_theta"];
  });
  same_config([&](auto& k) {
    k["rope_scaling"]["type"] = "llama3";
    k["rope_scaling"].erase("rope_type");
  });
  // An unscaled config.json still says null, and reads as none.
  train::trainer<precision::fp64> plain(model4(), config(2), f);
  plain.export_hf(tmp / "plain");
  {
    std::ifstream in(tmp / "plain" / "config.json");
    CHECK(nlohmann::json::parse(in)["rope_scaling"].is_null());
  }
  CHECK(!nn::llama_config_from_hf_folder(tmp / "plain").rope_scaling);
}

TEST_CASE("hf export: dp x tp x pp meshes write one rank's tensors; sharded files",
          "[train][hf][tp][pp]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("hfmesh", 0)};
  data::token_file f(corpus.path);
  temp_dir tmp;
  {
    train::trainer<precision::fp64> one(model4(), config(3), f);
    for (int s = 0; s < 3; ++s) one.train_step();
    one.export_hf(tmp / "one");
  }
  const auto want = read_all(tmp / "one");
  struct mesh {
    int dp, tp, pp;
    bool zero3;
    std::uint64_t shard;
  };
  for (const mesh m : {mesh{1, 2, 2, false, nn::hf_default_shard_bytes},
                       mesh{2, 2, 1, true, 40'000}, mesh{2, 1, 2, false, 1}}) {
    const std::string name = tessera::detail::str("mesh_", m.dp, m.tp, m.pp);
    INFO(name << (m.zero3 ? " zero3" : " zero1") << " shard " << m.shard);
    if (m.zero3)
      run_mesh<parallel::zero<3>>(f, m.dp, m.tp, m.pp, 3, tmp / name, m.shard);
    else
      run_mesh<parallel::zero<1>>(f, m.dp, m.tp, m.pp, 3, tmp / name, m.shard);
    CHECK(max_rel_diff(read_all(tmp / name), want) <= 1e-10);
    // Several files: transformers' names and the index over every tensor.
    std::ifstream in(tmp / name / "model.safetensors.index.json");
    REQUIRE(in);
    const auto ix = nlohmann::json::parse(in);
    CHECK(ix["weight_map"].size() == 39);
    std::set<std::string> files;
    for (const auto& [t, file] : ix["weight_map"].items()) files.insert(file.get<std::string>());
    const std::size_t n = files.size();
    CHECK(n >= 2);
    if (m.shard == 1) CHECK(n == 39);  // every tensor alone
    char first[64];
    std::snprintf(first, sizeof first, "model-00001-of-%05zu.safetensors", n);
    CHECK(*files.begin() == first);
    std::uint64_t total = 0;
    for (const auto& file : files) {
      data::safetensors_file sf(tmp / name / file);
      for (const auto& [t, x] : sf.tensors()) total += x.bytes;
    }
    CHECK(ix["metadata"]["total_size"] == total);
  }
}

TEST_CASE("hf export and import at tp 4: replicated key/value heads, vocabulary padding",
          "[train][hf][tp]") {
  // nkv 2 at tp 4: each key/value head on two ranks; V 257 at tp 4: 3
  // padding rows. The export drops them and writes each head once; the
  // import fills every replica and leaves the padding 0.
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("hftp4", 0)};
  data::token_file f(corpus.path);
  temp_dir tmp;
  auto mc = model4();
  mc.vocab = 257;
  double want = 0;
  {
    train::trainer<precision::fp64> one(mc, config(3), f);
    for (int s = 0; s < 2; ++s) one.train_step();
    one.export_hf(tmp / "one");
    train::train_config cfg = config(1);
    cfg.init_from_hf = (tmp / "one").string();
    train::trainer<precision::fp64> again(mc, cfg, f);
    want = again.train_step().loss;
  }
  run_mesh<parallel::zero<1>>(f, 1, 4, 1, 2, tmp / "tp4", nn::hf_default_shard_bytes, "", mc);
  CHECK(max_rel_diff(read_all(tmp / "tp4"), read_all(tmp / "one")) <= 1e-10);
  const double got =
      run_mesh<parallel::zero<1>>(f, 1, 4, 1, 1, tmp / "unused", 0, (tmp / "one").string(), mc);
  CHECK(std::fabs(got - want) <= 1e-10 * want);
}

TEST_CASE("hf re-export into the same folder leaves only its own files", "[train][hf][pp]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("hfre", 0)};
  data::token_file f(corpus.path);
  temp_dir tmp;
  auto names = [&] {
    std::set<std::string> n;
    for (const auto& e : fs::directory_iterator(tmp / "out"))
      n.insert(e.path().filename().string());
    return n;
  };
  {
    train::trainer<precision::fp64> one(model4(), config(1), f);
    one.export_hf(tmp / "out");
  }
  CHECK(names() == std::set<std::string>{"config.json", "model.safetensors"});
  run_mesh<parallel::zero<0>>(f, 1, 1, 2, 1, tmp / "out", nn::hf_default_shard_bytes);
  CHECK(names() == std::set<std::string>{"config.json", "model-00001-of-00002.safetensors",
                                         "model-00002-of-00002.safetensors",
                                         "model.safetensors.index.json"});
  {
    train::trainer<precision::fp64> one(model4(), config(1), f);
    one.export_hf(tmp / "out");
  }
  CHECK(names() == std::set<std::string>{"config.json", "model.safetensors"});
  // Exporting into a path that is a file fails on every rank, naming it.
  { std::ofstream(tmp / "file") << "x"; }
  train::trainer<precision::fp64> one(model4(), config(1), f);
  CHECK_THROWS_AS(one.export_hf(tmp / "file"), std::exception);
}

TEST_CASE("hf export of bf16 weights under tp x pp: one rank's bits", "[train][hf][tp][pp]") {
  // The initial weights do not depend on the layout: a bf16 export of a
  // (1, 2, 2) mesh before any step is one rank's, bit for bit (the 16-bit
  // shards travel in pairs through 32-bit words; the chunks hold odd
  // element counts).
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("hfbf16", 0)};
  data::token_file f(corpus.path);
  temp_dir tmp;
  {
    train::trainer<precision::bf16_mixed> one(model4(), config(1), f);
    one.export_hf(tmp / "one");
  }
  run_mesh<parallel::zero<1>, precision::bf16_mixed>(f, 1, 2, 2, 0, tmp / "mesh",
                                                     nn::hf_default_shard_bytes);
  CHECK(nn::hf_checkpoint(tmp / "mesh").torch_dtype() == "bfloat16");
  CHECK(max_rel_diff(read_all(tmp / "mesh"), read_all(tmp / "one")) == 0);
}

TEST_CASE("hf import into a tp x pp mesh computes one rank's loss", "[train][hf][tp][pp]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("hfin", 0)};
  data::token_file f(corpus.path);
  temp_dir tmp;
  {
    train::trainer<precision::fp64> one(model4(), config(2), f);
    one.train_step();
    one.train_step();
    one.export_hf(tmp / "src");
  }
  train::train_config cfg = config(1);
  cfg.init_from_hf = (tmp / "src").string();
  train::trainer<precision::fp64> one(model4(), cfg, f);
  const double want = one.train_step().loss;
  const double got =
      run_mesh<parallel::zero<1>>(f, 1, 2, 2, 1, tmp / "unused", 0, (tmp / "src").string());
  CHECK(std::fabs(got - want) <= 1e-10 * want);
  // And it differs from the seeded start: the weights came from the folder.
  train::trainer<precision::fp64> seeded(model4(), config(1), f);
  CHECK(std::fabs(seeded.train_step().loss - want) > 1e-6);
}

TEST_CASE("hf export in bf16 and float16 rounds each parameter once", "[train][hf]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("hfbf", 0)};
  data::token_file f(corpus.path);
  temp_dir tmp;
  train::trainer<precision::fp32> tr(model4(), config(1), f);
  tr.train_step();
  tr.export_hf(tmp / "bf", "bfloat16");
  tr.export_hf(tmp / "h", "float16");
  tr.export_hf(tmp / "f");
  const auto p = params_of(tr);
  auto rounded = [&](auto tag) {
    auto r = p;
    for (auto& [n, v] : r)
      for (double& x : v) x = to<double>(to<decltype(tag)>(static_cast<float>(x)));
    return r;
  };
  CHECK(max_rel_diff(read_all(tmp / "bf"), rounded(bf16{})) == 0);
  CHECK(max_rel_diff(read_all(tmp / "h"), rounded(fp16{})) == 0);
  CHECK(max_rel_diff(read_all(tmp / "f"), p) == 0);
  CHECK(nn::hf_checkpoint(tmp / "bf").torch_dtype() == "bfloat16");
  CHECK(data::safetensors_file(tmp / "h" / "model.safetensors").find("lm_head.weight")->dtype ==
        "F16");
  REQUIRE_THROWS_WITH(tr.export_hf(tmp / "x", "int8"),
                      Contains("'int8' is not one of float32, bfloat16, float16, float64"));
  CHECK(!fs::exists(tmp / "x"));
}

TEST_CASE("hf import refuses what tessera's Llama cannot express, naming key and value",
          "[train][hf]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("hfbad", 0)};
  data::token_file f(corpus.path);
  temp_dir tmp;
  {
    train::trainer<precision::fp32> tr(model4(), config(1), f);
    tr.export_hf(tmp / "good");
  }
  int n = 0;
  auto copy = [&] {
    const fs::path d = tmp / ("bad" + std::to_string(n++));
    fs::copy(tmp / "good", d);
    return d;
  };
  auto refused = [](const fs::path& d, const std::string& what) {
    INFO(what);
    REQUIRE_THROWS_AS(nn::hf_checkpoint(d), config_error);
    REQUIRE_THROWS_WITH(nn::hf_checkpoint(d), Contains(what));
  };
  auto cfg_edit = [&](const std::function<void(nlohmann::json&)>& e, const std::string& what) {
    const fs::path d = copy();
    edit_config(d, e);
    refused(d, what);
  };
  cfg_edit(
      [](auto& j) {
        j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
      },
      "rope_scaling={\"factor\":2.0,\"rope_type\":\"linear\"}: rope_type \"linear\" is not "
      "implemented: tessera's RoPE has \"default\" and \"llama3\"");
  cfg_edit(
      [](auto& j) {
        j["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 1e4}};
      },
      "rope_parameters={\"rope_theta\":10000.0,\"rope_type\":\"yarn\"}: rope_type \"yarn\" is "
      "not implemented");
  cfg_edit(
      [](auto& j) {
        j["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}};
      },
      "rope_type \"dynamic\" is not implemented");
  cfg_edit(
      [](auto& j) {
        j["rope_scaling"] = {{"factor", 2.0}};
      },
      "rope_scaling={\"factor\":2.0}: needs a rope_type");
  nlohmann::json llama3 = {{"rope_type", "llama3"},
                           {"factor", 8.0},
                           {"low_freq_factor", 1.0},
                           {"high_freq_factor", 4.0},
                           {"original_max_position_embeddings", 8}};
  // config.json's rope_scaling as llama3 with one key changed (null: removed).
  auto llama3_with = [&](const char* key, const nlohmann::json& v) {
    return [=](nlohmann::json& j) {
      j["rope_scaling"] = llama3;
      if (v.is_null())
        j["rope_scaling"].erase(key);
      else
        j["rope_scaling"][key] = v;
    };
  };
  cfg_edit(llama3_with("factor", 0.5),
           "\"rope_type\":\"llama3\"}: rope scaling factor=0.5 must be finite and >= 1");
  cfg_edit(llama3_with("high_freq_factor", 1),
           "high_freq_factor=1 must be finite and > low_freq_factor=1");
  cfg_edit(llama3_with("low_freq_factor", nullptr),
           "rope_type \"llama3\" needs a number low_freq_factor");
  cfg_edit(llama3_with("factor", "8"), "rope_type \"llama3\" needs a number factor");
  cfg_edit(llama3_with("original_max_position_embeddings", 8.5),
           "needs a positive integer original_max_position_embeddings");
  cfg_edit(llama3_with("partial_rotary_factor", 0.5), "partial_rotary_factor must be 1");
  cfg_edit(
      [&](auto& j) {
        j["rope_scaling"] = llama3;
        j["rope_parameters"] = llama3;
        j["rope_parameters"]["factor"] = 32.0;
      },
      "gives the scaling llama3(factor=8, low_freq_factor=1, high_freq_factor=4, "
      "original_max_position_embeddings=8) but rope_parameters gives llama3(factor=32,");
  cfg_edit(
      [&](auto& j) {
        j["rope_scaling"] = {{"rope_type", "default"}};
        j["rope_parameters"] = llama3;
      },
      "gives the scaling none but rope_parameters gives llama3(factor=8,");
  cfg_edit([](auto& j) { j["rope_theta"] = -1.0; }, "rope_theta=-1.0: needs a positive rope_theta");
  cfg_edit([](auto& j) { j["attention_bias"] = true; }, "attention_bias=true");
  cfg_edit([](auto& j) { j["mlp_bias"] = true; }, "mlp_bias=true");
  cfg_edit([](auto& j) { j["model_type"] = "mistral"; }, "model_type=\"mistral\"");
  cfg_edit([](auto& j) { j["hidden_act"] = "gelu"; }, "hidden_act=\"gelu\"");
  cfg_edit([](auto& j) { j["pretraining_tp"] = 2; }, "pretraining_tp=2");
  cfg_edit([](auto& j) { j["head_dim"] = 8; }, "head_dim=8");
  cfg_edit([](auto& j) { j.erase("hidden_size"); }, "hidden_size=(missing)");
  cfg_edit([](auto& j) { j["intermediate_size"] = 96; },
           "tensor 'model.layers.0.mlp.gate_proj.weight' has shape [24,16] but config.json "
           "implies [96,16]");
  {
    const fs::path d = copy();
    rewrite(d / "model.safetensors", {"model.layers.2.mlp.up_proj.weight"});
    refused(d, "has no tensor 'model.layers.2.mlp.up_proj.weight'");
  }
  {
    const fs::path d = copy();
    rewrite(d / "model.safetensors", {},
            {{"model.layers.0.self_attn.q_proj.bias", std::vector<float>(16)}});
    refused(
        d, "a tensor tessera's Llama cannot hold: 'model.layers.0.self_attn.q_proj.bias' (biases)");
  }
  {
    const fs::path d = copy();
    rewrite(d / "model.safetensors", {"lm_head.weight"});
    refused(d, "has no tensor 'lm_head.weight' (and config.json does not tie the embeddings)");
    // Tied: the LM head is read from the embedding; rotary buffers are ignored.
    edit_config(d, [](auto& j) { j["tie_word_embeddings"] = true; });
    rewrite(d / "model.safetensors", {},
            {{"model.layers.0.self_attn.rotary_emb.inv_freq", std::vector<float>(4)}});
    nn::hf_checkpoint ck(d);
    CHECK(ck.tied());
    CHECK(ck.config().tie_word_embeddings);  // a tied model: one (V, H) tensor
    CHECK_THROWS(nn::make_llama_layout(ck.config()).at("lm_head"));
    // A tied folder that also stores lm_head.weight: the embedding's bytes
    // (what save_pretrained writes of tied weights) load, the head reading
    // the embedding; another matrix is refused, naming it (transformers
    // would drop it silently and use the embedding).
    copy_tensor(d / "model.safetensors", "model.embed_tokens.weight", "lm_head.weight", false);
    std::vector<double> a(256 * 16), b(256 * 16);
    nn::hf_checkpoint ck2(d);
    ck2.tensor("lm_head").read(0, 256 * 16, a.data());
    ck.tensor("embedding").read(0, 256 * 16, b.data());
    CHECK(a == b);
    const std::string differs =
        "config.json ties the embeddings (tie_word_embeddings: true) but the tensor "
        "'lm_head.weight' differs from 'model.embed_tokens.weight' (";
    copy_tensor(d / "model.safetensors", "model.embed_tokens.weight", "lm_head.weight", true);
    refused(d, differs + "F32 [256,16] vs F32 [256,16], other values)");
    rewrite(d / "model.safetensors", {"lm_head.weight"},
            {{"lm_head.weight", std::vector<float>(256 * 16, 9.0f)}});
    refused(d, differs + "F32 [4096] vs F32 [256,16])");
  }
  {
    const fs::path d = copy();
    fs::remove(d / "model.safetensors");
    std::ofstream(d / "pytorch_model.bin") << "pickle";
    REQUIRE_THROWS_AS(nn::hf_checkpoint(d), io_error);
    REQUIRE_THROWS_WITH(nn::hf_checkpoint(d), Contains("safe_serialization=True"));
  }
  {
    const fs::path d = copy();
    fs::remove(d / "config.json");
    REQUIRE_THROWS_WITH(nn::hf_checkpoint(d), Contains("config.json"));
  }
  // A trainer whose model differs from the folder's names every size at once.
  train::train_config cfg = config(1);
  cfg.init_from_hf = (tmp / "good").string();
  auto other = model4();
  other.ffn_dim = 96;
  other.n_layers = 2;
  REQUIRE_THROWS_WITH((train::trainer<precision::fp32>(other, cfg, f)),
                      Contains("ffn_dim=96 vs intermediate_size=24") &&
                          Contains("n_layers=2 vs num_hidden_layers=4"));
}

}  // namespace test_train_hf_checkpoint
