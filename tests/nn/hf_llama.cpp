// Tests include/tessera/nn/hf_llama.hpp's config.json reader against what
// fuzzing (tests/fuzz/hf_config.cpp) showed: sizes whose products overflow
// int64 and more layers than the files hold tensors are refused at once,
// naming the numbers. The rest of the import is tested in
// tests/train/hf_checkpoint.cpp.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tessera/data/safetensors.hpp"
#include "tessera/nn/hf_llama.hpp"

namespace test_nn_hf_llama {

namespace fs = std::filesystem;
using namespace tessera;
using Catch::Contains;

namespace {

nlohmann::json small_config() {
  return {{"model_type", "llama"},      {"hidden_size", 16},      {"intermediate_size", 24},
          {"num_hidden_layers", 2},     {"num_attention_heads", 4}, {"vocab_size", 32},
          {"max_position_embeddings", 64}};
}

}  // namespace

TEST_CASE("config.json sizes whose parameter count passes 2^48 are refused", "[nn][hf]") {
  nlohmann::json j = small_config();
  CHECK(nn::llama_config_from_hf(j, "config.json").num_params() > 0);
  // 2^42 x 2^42 overflowed int64 in the layout's element counts (UBSan).
  j["hidden_size"] = 4398046511104;
  j["intermediate_size"] = 4398046511104;
  j["vocab_size"] = 4398046511104;
  CHECK_THROWS_AS(nn::llama_config_from_hf(j, "config.json"), config_error);
  CHECK_THROWS_WITH(nn::llama_config_from_hf(j, "config.json"),
                    Contains("config.json: hidden_size=4398046511104") &&
                        Contains("vocab_size=4398046511104 describe") && Contains("(2^48)"));
}

TEST_CASE("config.json's tie_word_embeddings: true ties, false, null or absent do not",
          "[nn][hf][tied]") {
  nlohmann::json j = small_config();
  CHECK(!nn::llama_config_from_hf(j, "config.json").tie_word_embeddings);  // LlamaConfig's default
  j["tie_word_embeddings"] = nullptr;
  CHECK(!nn::llama_config_from_hf(j, "config.json").tie_word_embeddings);
  j["tie_word_embeddings"] = false;
  CHECK(!nn::llama_config_from_hf(j, "config.json").tie_word_embeddings);
  j["tie_word_embeddings"] = true;
  const nn::llama_config c = nn::llama_config_from_hf(j, "config.json");
  CHECK(c.tie_word_embeddings);
  CHECK(c.num_params() == 32 * 16 + 2 * c.block_params() + 16);  // the (V, H) matrix once
  CHECK(nn::hf_config_json(c, "float32")["tie_word_embeddings"] == true);
  j["tie_word_embeddings"] = "yes";
  CHECK_THROWS_WITH(nn::llama_config_from_hf(j, "config.json"),
                    Contains("tie_word_embeddings=\"yes\": needs true or false"));
}

TEST_CASE("more layers in config.json than the files hold tensors: refused before the layout",
          "[nn][hf]") {
  const fs::path d = fs::temp_directory_path() / ("tessera_hf_llama_" + std::to_string(::getpid()));
  fs::create_directories(d);
  nlohmann::json j = small_config();
  j["num_hidden_layers"] = 100000000;  // built a layout of 9 x 10^8 entries before it was refused
  write_json_file(d / "config.json", j);
  const std::vector<float> emb(32 * 16);
  data::write_safetensors(d / "model.safetensors",
                          {{"model.embed_tokens.weight", "F32", {32, 16}, emb.data(), emb.size() * 4}});
  CHECK_THROWS_AS(nn::hf_checkpoint(d), config_error);
  CHECK_THROWS_WITH(nn::hf_checkpoint(d),
                    Contains("has no tensor 'model.layers.0.input_layernorm.weight'"));
  fs::remove_all(d);
}

}  // namespace test_nn_hf_llama
