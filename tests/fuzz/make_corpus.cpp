/// \file tests/fuzz/make_corpus.cpp
/// Writes the fuzz targets' seed corpora with tessera's own writers, small
/// valid inputs and near-valid ones (truncated, a byte changed, a gap):
///   fuzz_make_corpus tests/fuzz/corpus [tests/python/fixtures]
/// into <out>/{token_file,checkpoint,checkpoint_index,safetensors,hf_config}/. The committed
/// corpora were written by it; rerun it after a format change.

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/core/file.hpp"
#include "tessera/data/safetensors.hpp"
#include "tessera/data/token_file.hpp"
#include "tessera/nn/llama_config.hpp"
#include "tessera/train/checkpoint_file.hpp"

namespace fs = std::filesystem;
using bytes = std::vector<unsigned char>;

namespace {

bytes slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return bytes(std::istreambuf_iterator<char>(in), {});
}
void put(const fs::path& p, const bytes& b) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}
void put(const fs::path& p, const std::string& s) {
  put(p, bytes(s.begin(), s.end()));
}
// A copy of `b` with its last `n` bytes dropped, or byte `at` xor'ed with `x`.
bytes cut(bytes b, std::size_t n) {
  b.resize(b.size() > n ? b.size() - n : 0);
  return b;
}
bytes flip(bytes b, std::size_t at, unsigned char x = 0x01) {
  if (at < b.size()) b[at] ^= x;
  return b;
}
void store32(bytes& b, std::size_t at, std::uint32_t v) {
  std::memcpy(b.data() + at, &v, 4);
}

void token_files(const fs::path& d) {
  using tessera::data::token_dtype;
  const std::vector<std::uint32_t> few = {0, 5, 3, 65, 66, 67, 10, 255};
  tessera::data::write_token_file(d / "u16.tok", few, 256, token_dtype::u16);
  tessera::data::write_token_file(d / "u32.tok", {{7, 70000, 1}}, 128256, token_dtype::u32);
  tessera::data::write_token_file(d / "empty.tok", {}, 1, token_dtype::u16);
  const bytes u16 = slurp(d / "u16.tok");
  put(d / "truncated.tok", cut(u16, 1));
  put(d / "bad_id.tok", flip(u16, 64 + 2 * 7 + 1));  // the last id 255 -> 511, above V = 256
  put(d / "bad_version.tok", flip(u16, 8, 0x02));
  // llm.c shard: 256 int32 (magic 20240520, version, count), then the tokens.
  bytes shard(1024 + 2 * few.size(), 0);
  store32(shard, 0, 20240520);
  store32(shard, 4, 1);
  store32(shard, 8, static_cast<std::uint32_t>(few.size()));
  for (std::size_t i = 0; i < few.size(); ++i) {
    const auto v = static_cast<std::uint16_t>(few[i]);
    std::memcpy(shard.data() + 1024 + 2 * i, &v, 2);
  }
  put(d / "llmc.bin", shard);
  put(d / "llmc_v3.bin", flip(shard, 4, 0x02));
  // NumPy .npy version 1.0, '<u2' and '<u4', padded to a multiple of 64 bytes as NumPy pads it.
  auto npy = [&](const std::string& descr, std::size_t width, const std::string& shape) {
    std::string dict =
        "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
    dict.append(128 - 10 - dict.size() - 1, ' ');
    dict += '\n';
    bytes b = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, static_cast<unsigned char>(dict.size()), 0};
    b.insert(b.end(), dict.begin(), dict.end());
    for (std::uint32_t v : few)
      for (std::size_t k = 0; k < width; ++k) b.push_back(static_cast<unsigned char>(v >> (8 * k)));
    return b;
  };
  put(d / "u2.npy", npy("<u2", 2, "(8,)"));
  put(d / "u4.npy", npy("<u4", 4, "(8,)"));
  put(d / "shape2d.npy", npy("<u2", 2, "(2, 4)"));
  put(d / "float.npy", npy("<f4", 4, "(8,)"));
}

void checkpoints(const fs::path& d) {
  const nlohmann::json meta = {{"step", 12},
                               {"seed", 7},
                               {"model", {{"dim", 16}, {"layers", 2}}},
                               {"lr", 3e-4},
                               {"data", "corpus.tok"}};
  const std::vector<float> state = {1.0f, -2.5f, 0.125f, 3.0f};
  auto write = [&](const fs::path& p, const nlohmann::json& m, const void* b, std::size_t n) {
    tessera::train::write_checkpoint(p, m, n, [&](tessera::train::checkpoint_writer& w) {
      if (n > 0) w.write(b, n);
    });
  };
  write(d / "small.ckpt", meta, state.data(), sizeof(float) * state.size());
  write(d / "empty_payload.ckpt", nlohmann::json::object(), nullptr, 0);
  const bytes ok = slurp(d / "small.ckpt");
  put(d / "truncated.ckpt", cut(ok, 3));
  put(d / "bad_checksum.ckpt", flip(ok, ok.size() - 1));
  put(d / "bad_meta.ckpt", flip(ok, 24 + 2, 0x20));
  put(d / "bad_magic.ckpt", flip(ok, 0));
}

// Layout-free checkpoint metadata: two ranks' pieces of a row-split
// tensor and a vector, and near-valid variants.
void checkpoint_indexes(const fs::path& d) {
  const nlohmann::json ok = {
      {"format", "tessera-checkpoint"},
      {"version", 1},
      {"tensors",
       {{"w", {{"shape", {4, 3}}, {"roles", {{"param", "bf16"}, {"master", "float32"}}}}},
        {"g", {{"shape", {3}}, {"roles", {{"param", "float32"}}}}}}},
      {"files",
       {{{"name", "rank-00000.bin"}, {"bytes", 48}, {"sha256", std::string(64, 'a')}},
        {{"name", "rank-00001.bin"}, {"bytes", 36}, {"sha256", std::string(64, 'b')}}}},
      {"pieces",
       {{{"tensor", "w"},
         {"role", "param"},
         {"start", {0, 0}},
         {"shape", {2, 3}},
         {"flat", {0, 6}},
         {"file", 0},
         {"offset", 0}},
        {{"tensor", "w"},
         {"role", "master"},
         {"start", {0, 0}},
         {"shape", {2, 3}},
         {"flat", {0, 6}},
         {"file", 0},
         {"offset", 12}},
        {{"tensor", "g"},
         {"role", "param"},
         {"start", {0}},
         {"shape", {3}},
         {"flat", {0, 3}},
         {"file", 0},
         {"offset", 36}},
        {{"tensor", "w"},
         {"role", "param"},
         {"start", {2, 0}},
         {"shape", {2, 3}},
         {"flat", {0, 6}},
         {"file", 1},
         {"offset", 0}},
        {{"tensor", "w"},
         {"role", "master"},
         {"start", {2, 0}},
         {"shape", {2, 3}},
         {"flat", {1, 6}},
         {"file", 1},
         {"offset", 12}}}},
      {"run", {{"step", 4}, {"optimizer_steps", 4}}}};
  put(d / "metadata.json", ok.dump(1));
  nlohmann::json past_end = ok;
  past_end["pieces"][4]["offset"] = 30;
  put(d / "past_end.json", past_end.dump());
  nlohmann::json outside = ok;
  outside["pieces"][3]["start"] = {3, 0};
  put(d / "outside.json", outside.dump());
  const std::string text = ok.dump();
  put(d / "truncated.json", text.substr(0, text.size() / 2));
}

void safetensors(const fs::path& d) {
  using tessera::data::safetensors_entry;
  const std::vector<float> f = {1.0f, 2.0f, -3.0f, 0.5f, 0.25f, 8.0f};
  const std::vector<std::uint16_t> bf = {0x3f80, 0xc000, 0x7f80, 0x7fc1};  // 1, -2, inf, nan
  const std::vector<std::int64_t> i64 = {1, -1};
  tessera::data::write_safetensors(d / "f32.safetensors",
                                   {{"w", "F32", {2, 3}, f.data(), f.size() * 4}});
  tessera::data::write_safetensors(d / "mixed.safetensors",
                                   {{"a.weight", "BF16", {2, 2}, bf.data(), bf.size() * 2},
                                    {"b.bias", "I64", {2}, i64.data(), i64.size() * 8},
                                    {"empty", "F16", {0, 4}, nullptr, 0},
                                    {"scalar", "F32", {}, f.data(), 4}},
                                   {{"format", "pt"}});
  tessera::data::write_safetensors(d / "none.safetensors", {});
  const bytes ok = slurp(d / "f32.safetensors");
  put(d / "truncated.safetensors", cut(ok, 4));
  put(d / "trailing.safetensors", [&] {
    bytes b = ok;
    b.push_back(0);
    return b;
  }());
  put(d / "long_header.safetensors", flip(ok, 0, 0x40));
  // A hand-written header: a gap between two tensors, and a zero-sized dimension.
  auto raw = [&](std::string h, std::size_t data_bytes) {
    h.append((8 - h.size() % 8) % 8, ' ');
    bytes b(8, 0);
    const std::uint64_t n = h.size();
    std::memcpy(b.data(), &n, 8);
    b.insert(b.end(), h.begin(), h.end());
    b.resize(b.size() + data_bytes, 0x3c);
    return b;
  };
  put(d / "gap.safetensors", raw(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                                 R"("b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}})",
                                 6));
  put(d / "zero_dim.safetensors",
      raw(R"({"z":{"dtype":"F32","shape":[3,0,5],"data_offsets":[0,0]}})", 0));
}

void hf_configs(const fs::path& d, const fs::path& fixtures) {
  // transformers 4's keys (nn::hf_config_json writes these) for the tiny preset.
  const auto c = tessera::nn::llama_config::tiny();
  const nlohmann::json v4 = {{"architectures", {"LlamaForCausalLM"}},
                             {"model_type", "llama"},
                             {"hidden_size", c.dim},
                             {"intermediate_size", c.ffn_dim},
                             {"num_hidden_layers", c.n_layers},
                             {"num_attention_heads", c.n_heads},
                             {"num_key_value_heads", c.n_kv_heads},
                             {"head_dim", c.head_dim()},
                             {"vocab_size", c.vocab},
                             {"max_position_embeddings", c.max_seq},
                             {"rms_norm_eps", c.norm_eps},
                             {"rope_theta", c.rope_theta},
                             {"rope_scaling", nullptr},
                             {"hidden_act", "silu"},
                             {"attention_bias", false},
                             {"mlp_bias", false},
                             {"pretraining_tp", 1},
                             {"tie_word_embeddings", true},
                             {"torch_dtype", "bfloat16"}};
  put(d / "tiny_v4.json", v4.dump(2));
  for (const char* f : {"fp32", "bf16_tied_sharded", "llama3_rope_fp64"}) {
    const fs::path p = fixtures / f / "config.json";
    if (fs::exists(p))
      fs::copy_file(p, d / (std::string(f) + ".json"), fs::copy_options::overwrite_existing);
  }
  put(d / "odd_head_dim.json",
      R"({"model_type":"llama","hidden_size":12,"intermediate_size":8,"num_hidden_layers":1,)"
      R"("num_attention_heads":4,"vocab_size":16,"max_position_embeddings":8})");
  put(d / "rope_scaling.json",
      R"({"model_type":"llama","hidden_size":16,"intermediate_size":8,"num_hidden_layers":1,)"
      R"("num_attention_heads":2,"vocab_size":16,"max_position_embeddings":8,)"
      R"("rope_scaling":{"rope_type":"llama3","factor":8.0}})");
  nlohmann::json v4_llama3 = v4;  // Llama 3.1's rope_scaling, as nn::hf_config_json writes it
  v4_llama3["rope_scaling"] = {{"factor", 8.0},
                               {"high_freq_factor", 4.0},
                               {"low_freq_factor", 1.0},
                               {"original_max_position_embeddings", 16},
                               {"rope_type", "llama3"}};
  put(d / "tiny_v4_llama3.json", v4_llama3.dump(2));
  put(d / "deep.json", std::string(20, '[') + std::string(20, ']'));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR [HF_FIXTURES_DIR]\n", argv[0]);
    return 2;
  }
  const fs::path out = argv[1];
  const fs::path fixtures = argc > 2 ? fs::path(argv[2]) : fs::path("tests/python/fixtures");
  for (const char* t : {"token_file", "checkpoint", "checkpoint_index", "safetensors", "hf_config"})
    fs::create_directories(out / t);
  token_files(out / "token_file");
  checkpoints(out / "checkpoint");
  checkpoint_indexes(out / "checkpoint_index");
  safetensors(out / "safetensors");
  hf_configs(out / "hf_config", fixtures);
  return 0;
}
