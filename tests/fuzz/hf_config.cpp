/// \file tests/fuzz/hf_config.cpp
/// Fuzzes the Hugging Face config.json reader: nn::hf_checkpoint on a
/// folder of the input as config.json beside an empty model.safetensors
/// (the whole open path: parse_json_bounded, llama_config_from_hf, the
/// layout the tensors are checked against), and parse_json_bounded plus
/// llama_config_from_hf on the bytes directly. A refusal must be a
/// tessera::error (parse_json_bounded alone may also throw
/// nlohmann::json::exception, as documented). An accepted config must
/// survive hf_config_json and read back the same.

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "fuzz_common.hpp"
#include "tessera/core/file.hpp"
#include "tessera/data/safetensors.hpp"
#include "tessera/nn/hf_llama.hpp"

namespace {

const std::filesystem::path& model_dir() {
  static const std::filesystem::path d = [] {
    auto p = tessera::fuzz::temp_dir() / "hf";
    std::filesystem::create_directories(p);
    tessera::data::write_safetensors(p / "model.safetensors", {});
    return p;
  }();
  return d;
}

bool same(const tessera::nn::llama_config& a, const tessera::nn::llama_config& b) {
  return a.dim == b.dim && a.n_layers == b.n_layers && a.n_heads == b.n_heads &&
         a.n_kv_heads == b.n_kv_heads && a.ffn_dim == b.ffn_dim && a.vocab == b.vocab &&
         a.max_seq == b.max_seq && a.rope_theta == b.rope_theta && a.norm_eps == b.norm_eps &&
         a.rope_scaling == b.rope_scaling;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tessera;
  const auto& dir = model_dir();
  fuzz::write_bytes(dir / "config.json", data, size);
  fuzz::accepts([&] { const nn::hf_checkpoint ck(dir); });

  nlohmann::json j;
  try {
    j = parse_json_bounded("config.json", data, data + size);
  } catch (const nlohmann::json::exception&) {
    return 0;
  } catch (const tessera::error&) {
    return 0;
  }
  nn::llama_config c;
  if (!fuzz::accepts([&] { c = nn::llama_config_from_hf(j, "config.json"); })) return 0;
  const nlohmann::json back = nn::hf_config_json(c, "float32");
  const nn::llama_config c2 = nn::llama_config_from_hf(back, "hf_config_json");
  TESSERA_FUZZ_REQUIRE(same(c, c2), "an accepted config reads back the same from hf_config_json");
  return 0;
}
