#pragma once
/// \file nn/hf_llama.hpp
/// Hugging Face's Llama checkpoints (transformers' LlamaForCausalLM): the
/// tensor names, config.json, and a folder of safetensors read
/// memory-mapped. tessera's Llama follows the same conventions (nn.Linear's
/// (out, in) weight orientation, rotate-half RoPE, grouped key/value heads
/// in order, the epsilon inside the RMSNorm square root), so the tensors
/// map one to one with no permutation.
///
/// A folder holds config.json and either model.safetensors or the shards
/// a model.safetensors.index.json lists ({"weight_map": {tensor: file}}).

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/data/safetensors.hpp"
#include "tessera/nn/llama_config.hpp"
#include "tessera/nn/llama_layout.hpp"
#include "tessera/nn/llama_record.hpp"

namespace tessera::nn {

/// The Hugging Face name of a tessera parameter (make_llama_layout's
/// names): embedding -> model.embed_tokens.weight, blocks.N.attn.wq ->
/// model.layers.N.self_attn.q_proj.weight (wk, wv, wo: k_proj, v_proj,
/// o_proj), blocks.N.attn_norm -> model.layers.N.input_layernorm.weight,
/// blocks.N.mlp_norm -> model.layers.N.post_attention_layernorm.weight,
/// blocks.N.mlp.w_gate / w_up / w_down -> model.layers.N.mlp.gate_proj /
/// up_proj / down_proj.weight, final_norm -> model.norm.weight, lm_head ->
/// lm_head.weight. Throws config_error for another name.
inline std::string hf_tensor_name(const std::string& name) {
  if (name == "embedding") return "model.embed_tokens.weight";
  if (name == "final_norm") return "model.norm.weight";
  if (name == "lm_head") return "lm_head.weight";
  if (name.starts_with("blocks.")) {
    const std::size_t dot = name.find('.', 7);
    if (dot != std::string::npos) {
      const std::string l = name.substr(7, dot - 7), rest = name.substr(dot + 1);
      static const std::map<std::string, std::string> m = {
          {"attn_norm", "input_layernorm"}, {"attn.wq", "self_attn.q_proj"},
          {"attn.wk", "self_attn.k_proj"},  {"attn.wv", "self_attn.v_proj"},
          {"attn.wo", "self_attn.o_proj"},  {"mlp_norm", "post_attention_layernorm"},
          {"mlp.w_gate", "mlp.gate_proj"},  {"mlp.w_up", "mlp.up_proj"},
          {"mlp.w_down", "mlp.down_proj"}};
      if (auto it = m.find(rest); it != m.end())
        return "model.layers." + l + "." + it->second + ".weight";
    }
  }
  throw config_error("no Hugging Face name for the parameter '" + name + "'");
}

/// safetensors dtype name ("F32", "BF16", "F16", "F64") of a transformers
/// torch_dtype ("float32", "bfloat16", "float16", "float64"). Throws
/// config_error naming the value for another.
inline std::string hf_safetensors_dtype(const std::string& torch_dtype) {
  if (torch_dtype == "float32") return "F32";
  if (torch_dtype == "bfloat16") return "BF16";
  if (torch_dtype == "float16") return "F16";
  if (torch_dtype == "float64") return "F64";
  throw config_error("Hugging Face dtype '" + torch_dtype +
                     "' is not one of float32, bfloat16, float16, float64");
}

/// config.json's rope_scaling for `s`: null without scaling, else
/// {"factor", "high_freq_factor", "low_freq_factor",
/// "original_max_position_embeddings", "rope_type": "llama3"}, as Meta's
/// Llama 3.1 and 3.2 folders hold it (transformers 4.43 on reads it, and 5
/// moves it into rope_parameters beside the top-level rope_theta).
inline nlohmann::json hf_rope_scaling_json(const std::optional<llama3_rope_scaling>& s) {
  if (!s) return nullptr;
  return {{"factor", s->factor},
          {"high_freq_factor", s->high_freq_factor},
          {"low_freq_factor", s->low_freq_factor},
          {"original_max_position_embeddings", s->original_max_position_embeddings},
          {"rope_type", "llama3"}};
}

/// The RoPE scaling of config.json's object `o` (its key `key`:
/// "rope_scaling" or "rope_parameters"), read from `where`: none for
/// rope_type "default" (or, in rope_parameters, no rope_type), the
/// parameters for "llama3" (rope_type may be spelled "type", as
/// transformers before 4.43 wrote it and still reads it). Throws
/// config_error naming `key`, its value and why for another rope_type (named),
/// a rope_scaling without one, a missing or non-numeric parameter, an
/// original_max_position_embeddings that is not a positive integer, a
/// partial_rotary_factor other than 1, and as llama3_rope_scaling::validate.
inline std::optional<llama3_rope_scaling> hf_rope_scaling(const nlohmann::json& o,
                                                          const std::string& key,
                                                          const std::string& where) {
  auto fail = [&](const std::string& why) {
    throw config_error(where + ": " + key + "=" + o.dump() + ": " + why);
  };
  if (!o.is_object()) fail("needs an object");
  const char* tk = o.contains("rope_type") ? "rope_type" : o.contains("type") ? "type" : nullptr;
  if (tk == nullptr) {
    if (key == "rope_parameters") return std::nullopt;  // transformers' default type
    fail("needs a rope_type (\"default\" or \"llama3\")");
  }
  if (!o[tk].is_string()) fail(std::string(tk) + " is not a string");
  const std::string type = o[tk].get<std::string>();
  if (type == "default") return std::nullopt;
  if (type != "llama3")
    fail("rope_type \"" + type +
         "\" is not implemented: tessera's RoPE has \"default\" and \"llama3\" (Llama 3.1's "
         "frequency scaling)");
  auto number = [&](const char* k) {
    if (!o.contains(k) || !o[k].is_number())
      fail(std::string("rope_type \"llama3\" needs a number ") + k);
    return o[k].get<double>();
  };
  llama3_rope_scaling r;
  r.factor = number("factor");
  r.low_freq_factor = number("low_freq_factor");
  r.high_freq_factor = number("high_freq_factor");
  const char* ok = "original_max_position_embeddings";
  if (!o.contains(ok) || !o[ok].is_number_integer() || o[ok].get<std::int64_t>() < 1)
    fail("rope_type \"llama3\" needs a positive integer original_max_position_embeddings");
  r.original_max_position_embeddings = o[ok].get<std::int64_t>();
  if (o.contains("partial_rotary_factor") &&
      !(o["partial_rotary_factor"].is_number() && o["partial_rotary_factor"].get<double>() == 1.0))
    fail("partial_rotary_factor must be 1: tessera's RoPE rotates every dimension of a head");
  try {
    r.validate();
  } catch (const config_error& e) {
    fail(e.what());
  }
  return r;
}

/// config.json of LlamaForCausalLM for a model of config `c` whose tensors
/// are stored as `torch_dtype` (float32, bfloat16, float16 or float64):
/// tie_word_embeddings as c's (tied: the folder holds no lm_head.weight),
/// no biases, SiLU, rope_theta and rope_scaling (hf_rope_scaling_json:
/// null, or the llama3 parameters). The dtype is written as both
/// torch_dtype (transformers < 5) and dtype (5 on).
inline nlohmann::json hf_config_json(const llama_config& c, const std::string& torch_dtype) {
  (void)hf_safetensors_dtype(torch_dtype);
  return {{"architectures", {"LlamaForCausalLM"}},
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
          {"rope_scaling", hf_rope_scaling_json(c.rope_scaling)},
          {"hidden_act", "silu"},
          {"attention_bias", false},
          {"attention_dropout", 0.0},
          {"mlp_bias", false},
          {"pretraining_tp", 1},
          {"tie_word_embeddings", c.tie_word_embeddings},
          {"initializer_range", 0.02},
          {"use_cache", true},
          {"bos_token_id", nullptr},  // a byte or subword model of tessera's has no special ids
          {"eos_token_id", nullptr},
          {"torch_dtype", torch_dtype},
          {"dtype", torch_dtype}};
}

/// The most parameters a config.json may describe: 2^48 (281 trillion), so
/// that every element and byte count of the model (x 16 bytes of optimizer
/// state) fits int64 with room to spare.
inline constexpr double hf_max_params = 281474976710656.0;

/// The llama_config of a LlamaForCausalLM config.json (`j`, read from
/// `where`, named in errors), named `name`. Reads hidden_size,
/// intermediate_size, num_hidden_layers, num_attention_heads,
/// num_key_value_heads (default: the attention heads), vocab_size,
/// max_position_embeddings, tie_word_embeddings (default false, as
/// transformers' LlamaConfig), rms_norm_eps (default 1e-6), rope_theta
/// (default 10000, transformers' defaults; top-level as transformers < 5
/// writes it, or inside rope_parameters as 5 does) and the RoPE scaling
/// (hf_rope_scaling: rope_type "default" or "llama3", from rope_scaling as
/// transformers < 5 writes it or rope_parameters as 5 does). Throws
/// config_error naming the key and the value for what tessera's Llama
/// cannot express: another model_type, attention or MLP biases, a rope_type
/// other than "default" and "llama3" (named), rope_scaling and
/// rope_parameters that give different scalings, an activation
/// other than silu, pretraining_tp > 1, attention dropout, a head_dim
/// other than hidden_size / heads, a missing size, sizes of more than
/// hf_max_params parameters; and as llama_config::validate.
inline llama_config llama_config_from_hf(const nlohmann::json& j, const std::string& where,
                                         std::string name = "hf") {
  auto fail = [&](const std::string& key, const std::string& why) {
    throw config_error(where + ": " + key + "=" + (j.contains(key) ? j[key].dump() : "(missing)") +
                       ": " + why);
  };
  TESSERA_THROW_IF(!j.is_object(), config_error, where, ": not a JSON object");
  if (!j.contains("model_type") || j["model_type"] != "llama")
    fail("model_type", "tessera reads Llama checkpoints (model_type \"llama\")");
  auto size = [&](const char* key) -> std::int64_t {
    if (!j.contains(key) || !j[key].is_number_integer() || j[key].get<std::int64_t>() < 1)
      fail(key, "needs a positive integer");
    return j[key].get<std::int64_t>();
  };
  auto flag_off = [&](const char* key, const char* what) {
    if (j.contains(key) && !j[key].is_null() && j[key] != false)
      fail(key, std::string("tessera's Llama has no ") + what);
  };
  llama_config c;
  c.name = std::move(name);
  c.dim = size("hidden_size");
  c.ffn_dim = size("intermediate_size");
  c.n_layers = size("num_hidden_layers");
  c.n_heads = size("num_attention_heads");
  c.n_kv_heads = j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null()
                     ? size("num_key_value_heads")
                     : c.n_heads;
  c.vocab = size("vocab_size");
  c.max_seq = size("max_position_embeddings");
  if (j.contains("tie_word_embeddings") && !j["tie_word_embeddings"].is_null()) {
    if (!j["tie_word_embeddings"].is_boolean()) fail("tie_word_embeddings", "needs true or false");
    c.tie_word_embeddings = j["tie_word_embeddings"].get<bool>();
  }
  if (j.contains("rms_norm_eps")) {
    if (!j["rms_norm_eps"].is_number()) fail("rms_norm_eps", "needs a number");
    c.norm_eps = j["rms_norm_eps"].get<double>();
  } else {
    c.norm_eps = 1e-6;
  }
  // RoPE: transformers < 5 writes rope_theta and rope_scaling ({"rope_type":
  // "llama3", "factor", ...} or null), 5 and later rope_parameters
  // {"rope_type", "rope_theta", ...}. The default (unscaled) type and
  // "llama3" are tessera's.
  const nlohmann::json* rope = &j;
  std::optional<llama3_rope_scaling> scaling;
  const bool has_parameters = j.contains("rope_parameters") && !j["rope_parameters"].is_null();
  if (has_parameters) {
    rope = &j["rope_parameters"];
    if (!rope->is_object()) fail("rope_parameters", "needs an object");
    scaling = hf_rope_scaling(*rope, "rope_parameters", where);
  }
  if (!rope->contains("rope_theta")) rope = &j;  // rope_parameters without it: the top level's
  if (rope->contains("rope_theta")) {
    if (!(*rope)["rope_theta"].is_number() || !((*rope)["rope_theta"].get<double>() > 0))
      fail(rope == &j ? "rope_theta" : "rope_parameters", "needs a positive rope_theta");
    c.rope_theta = (*rope)["rope_theta"].get<double>();
  }
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
    // Given both, transformers 5 takes rope_scaling's: tessera refuses two
    // that differ rather than pick one.
    const auto s = hf_rope_scaling(j["rope_scaling"], "rope_scaling", where);
    if (has_parameters && s != scaling)
      fail("rope_scaling", "gives the scaling " + to_string(s) + " but rope_parameters gives " +
                               to_string(scaling));
    scaling = s;
  }
  c.rope_scaling = scaling;
  flag_off("attention_bias", "attention biases");
  flag_off("mlp_bias", "MLP biases");
  if (j.contains("hidden_act") && j["hidden_act"] != "silu")
    fail("hidden_act", "tessera's SwiGLU uses silu");
  if (j.contains("pretraining_tp") && j["pretraining_tp"] != 1)
    fail("pretraining_tp", "only 1 (the sliced-matmul emulation is not reproduced)");
  if (j.contains("attention_dropout") && j["attention_dropout"] != 0 &&
      j["attention_dropout"] != 0.0)
    fail("attention_dropout", "tessera trains without dropout");
  if (j.contains("head_dim") && !j["head_dim"].is_null() && c.n_heads > 0 &&
      j["head_dim"] != c.dim / c.n_heads)
    fail("head_dim",
         "must be hidden_size / num_attention_heads = " + std::to_string(c.dim / c.n_heads));
  // The parameter count, in double (it cannot overflow there): sizes whose
  // products pass int64 overflowed the layout's element counts. Before
  // validate(), whose 64-bit check would name the model's fields rather
  // than config.json's keys.
  const double H = static_cast<double>(c.dim), F = static_cast<double>(c.ffn_dim),
               KV = static_cast<double>(c.kv_dim());
  const double params =
      (c.tie_word_embeddings ? 1 : 2) * static_cast<double>(c.vocab) * H + H +
      static_cast<double>(c.n_layers) * (2 * H + 2 * H * H + 2 * KV * H + 3 * H * F);
  TESSERA_THROW_IF(params > hf_max_params, config_error, where, ": hidden_size=", c.dim,
                   ", intermediate_size=", c.ffn_dim, ", num_hidden_layers=", c.n_layers,
                   ", vocab_size=", c.vocab, " describe ", params, " parameters, more than the ",
                   hf_max_params, " (2^48) tessera's int64 element and byte counts hold");
  c.validate();
  return c;
}

/// The llama_config of the Hugging Face folder `dir` (its config.json,
/// llama_config_from_hf), named after the folder. Throws io_error naming
/// config.json when it cannot be read or is not JSON, and config_error as
/// llama_config_from_hf.
inline llama_config llama_config_from_hf_folder(const std::filesystem::path& dir);

/// The name of a folder for a model's name: its last component ("a/b/" is
/// "b"), "hf" for "." or "/".
inline std::string folder_name(const std::filesystem::path& dir) {
  std::filesystem::path p = dir.lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  const std::string n = p.filename().string();
  return n.empty() || n == "." || n == ".." ? std::string("hf") : n;
}

inline llama_config llama_config_from_hf_folder(const std::filesystem::path& dir) {
  const std::filesystem::path cj = dir / "config.json";
  std::ifstream in(cj);
  TESSERA_THROW_IF(!in, io_error, "--init-from-hf: cannot read '", cj.string(), "'");
  const auto j = nlohmann::json::parse(in, nullptr, false);
  TESSERA_THROW_IF(j.is_discarded(), io_error, "--init-from-hf: '", cj.string(), "' is not JSON");
  return llama_config_from_hf(j, cj.string(), folder_name(dir));
}

/// A Hugging Face Llama folder opened for reading: config.json parsed,
/// the safetensors mapped, every tensor checked against the config.
class hf_checkpoint {
 public:
  /// Opens `dir`. Throws io_error for a missing or unreadable file (naming
  /// it; a folder with only pytorch_model.bin is named as such: convert it
  /// with save_pretrained(..., safe_serialization=True)), config_error as
  /// llama_config_from_hf, and config_error naming the tensor for a
  /// missing tensor, an unexpected one (rotary_emb.inv_freq buffers are
  /// ignored: tessera derives them from rope_theta and the rope scaling), a
  /// shape that disagrees with config.json, or a dtype that is not F32, F16,
  /// BF16 or F64. With
  /// tie_word_embeddings true the model is tied (config().tie_word_embeddings):
  /// its one (V, H) tensor is model.embed_tokens.weight, which the LM head
  /// reads, as transformers ties them; a stored lm_head.weight must then
  /// equal it bit for bit (dtype, shape and bytes: what save_pretrained
  /// writes of tied weights), else it is refused, naming it (transformers
  /// would silently use the embedding instead). model.safetensors is read when present,
  /// else the shards of model.safetensors.index.json (transformers' order).
  explicit hf_checkpoint(const std::filesystem::path& dir) : dir_(dir) {
    const std::filesystem::path cj = dir / "config.json";
    std::ifstream in(cj);
    TESSERA_THROW_IF(!in, io_error, "cannot read '", cj.string(),
                     "': a Hugging Face model folder holds config.json and model.safetensors");
    try {
      json_ = tessera::parse_json_bounded("'" + cj.string() + "'", in);
    } catch (const nlohmann::json::exception& e) {
      throw io_error("'" + cj.string() + "' is not JSON: " + e.what());
    }
    cfg_ = llama_config_from_hf(json_, cj.string(), folder_name(dir));
    tied_ = cfg_.tie_word_embeddings;
    for (const char* k : {"torch_dtype", "dtype"})  // transformers < 5, and 5 on
      if (json_.contains(k) && json_[k].is_string()) torch_dtype_ = json_[k].get<std::string>();
    open_files();
    check_tensors();
  }

  // reader() and tensor() point into this object's mappings.
  hf_checkpoint(const hf_checkpoint&) = delete;
  hf_checkpoint& operator=(const hf_checkpoint&) = delete;

  /// The model's sizes from config.json.
  const llama_config& config() const { return cfg_; }
  /// config.json as read.
  const nlohmann::json& config_json() const { return json_; }
  /// config.json's torch_dtype ("" when absent).
  const std::string& torch_dtype() const { return torch_dtype_; }
  /// Whether the embeddings are tied (config().tie_word_embeddings).
  bool tied() const { return tied_; }

  /// The checkpoint as a tensor_reader of tessera names (for
  /// llama_options::weights). The checkpoint must outlive it; reads are
  /// thread-safe (the files are mapped read-only).
  tensor_reader reader() const {
    return [this](const std::string& name, std::int64_t first, std::int64_t n, double* out) {
      tensor(name).read(first, n, out);
    };
  }
  /// The safetensors tensor holding tessera parameter `name` (of a tied
  /// folder, "lm_head" names the embedding's, which the head reads). Throws
  /// config_error for a name the checkpoint does not hold.
  const data::safetensors_tensor& tensor(const std::string& name) const {
    auto it = by_name_.find(name);
    TESSERA_THROW_IF(it == by_name_.end(), config_error, "Hugging Face checkpoint '", dir_.string(),
                     "' holds no tensor for '", name, "'");
    return *it->second;
  }

 private:
  void open_files() {
    const std::filesystem::path single = dir_ / "model.safetensors";
    const std::filesystem::path index = dir_ / "model.safetensors.index.json";
    if (std::filesystem::exists(single)) {  // transformers' order: the one file first
      files_.push_back(std::make_unique<data::safetensors_file>(single));
      for (const auto& [tensor, t] : files_.back()->tensors()) hf_[tensor] = &t;
    } else if (std::filesystem::exists(index)) {
      std::ifstream in(index);
      TESSERA_THROW_IF(!in, io_error, "cannot read '", index.string(), "'");
      nlohmann::json ix;
      try {
        ix = tessera::parse_json_bounded("'" + index.string() + "'", in);
      } catch (const nlohmann::json::exception& e) {
        throw io_error("'" + index.string() + "' is not JSON: " + e.what());
      }
      TESSERA_THROW_IF(
          !ix.is_object() || !ix.contains("weight_map") || !ix["weight_map"].is_object(), io_error,
          "'", index.string(), "' has no weight_map object");
      std::map<std::string, const data::safetensors_file*> opened;
      for (const auto& [tensor, file] : ix["weight_map"].items()) {
        TESSERA_THROW_IF(!file.is_string(), io_error, "'", index.string(), "': weight_map[\"",
                         tensor, "\"] is not a file name");
        const std::string f = file.get<std::string>();
        TESSERA_THROW_IF(f.empty() || f.find('/') != std::string::npos || f == "." || f == "..",
                         io_error, "'", index.string(), "': weight_map[\"", tensor, "\"] = \"", f,
                         "\" is not a file name in the folder");
        if (!opened.contains(f)) {
          files_.push_back(std::make_unique<data::safetensors_file>(dir_ / f));
          opened[f] = files_.back().get();
        }
        const data::safetensors_tensor* t = opened[f]->find(tensor);
        TESSERA_THROW_IF(t == nullptr, io_error, "'", index.string(), "' places '", tensor,
                         "' in '", f, "', which does not hold it");
        hf_[tensor] = t;
      }
      // A shard's tensors the index does not list are still unexpected.
      for (const auto& f : files_)
        for (const auto& [tensor, t] : f->tensors())
          if (!hf_.contains(tensor)) hf_[tensor] = &t;
    } else {
      const bool pickle = std::filesystem::exists(dir_ / "pytorch_model.bin") ||
                          std::filesystem::exists(dir_ / "pytorch_model.bin.index.json");
      throw io_error("'" + dir_.string() + "' has no model.safetensors or " +
                     "model.safetensors.index.json" +
                     (pickle ? std::string(" (only PyTorch pickles, which tessera does not read: "
                                           "save the model with save_pretrained(dir, "
                                           "safe_serialization=True))")
                             : std::string()));
    }
  }

  void check_tensors() {
    const std::string where = "Hugging Face checkpoint '" + dir_.string() + "'";
    auto missing = [&](const std::string& hn, bool head) {
      return config_error(where + " has no tensor '" + hn + "'" +
                          (head ? " (and config.json does not tie the embeddings)" : ""));
    };
    // Files with fewer tensors than config.json's layers need (9 a layer,
    // the embedding, the final norm and an untied head) are refused before
    // the layout is built, naming the first missing one, which lies within
    // the first hf_.size() + 1 names: a num_hidden_layers of 10^8 beside a
    // small file would otherwise build a layout of 10^9 entries.
    const auto need = 9 * static_cast<std::uint64_t>(cfg_.n_layers) + (tied_ ? 2 : 3);
    if (hf_.size() < need) {
      static constexpr const char* block[] = {"attn_norm",  "attn.wq",  "attn.wk",
                                              "attn.wv",    "attn.wo",  "mlp_norm",
                                              "mlp.w_gate", "mlp.w_up", "mlp.w_down"};
      auto check = [&](const std::string& name) {
        const std::string hn = hf_tensor_name(name);
        if (!hf_.contains(hn)) throw missing(hn, false);
      };
      check("embedding");
      for (std::int64_t l = 0; l < cfg_.n_layers; ++l)
        for (const char* b : block) check("blocks." + std::to_string(l) + "." + b);
      check("final_norm");
      if (!tied_ && !hf_.contains("lm_head.weight")) throw missing("lm_head.weight", true);
    }
    const param_layout layout = make_llama_layout(cfg_);  // tied: no lm_head
    std::set<std::string> used;
    for (const auto& e : layout.entries()) {
      const std::string hn = hf_tensor_name(e.name);
      auto it = hf_.find(hn);
      if (it == hf_.end()) throw missing(hn, e.name == "lm_head");
      const data::safetensors_tensor& t = *it->second;
      std::vector<std::int64_t> want;
      for (int d = 0; d < e.full.rank; ++d) want.push_back(e.full[d]);
      TESSERA_THROW_IF(t.shape != want, config_error, where, ": tensor '", hn, "' has shape ",
                       nlohmann::json(t.shape).dump(), " but config.json implies ",
                       nlohmann::json(want).dump());
      TESSERA_THROW_IF(
          t.dtype != "F32" && t.dtype != "BF16" && t.dtype != "F16" && t.dtype != "F64",
          config_error, where, ": tensor '", hn, "' has dtype ", t.dtype,
          ", not F32, BF16, F16 or F64");
      by_name_[e.name] = &t;
      used.insert(hn);
    }
    if (tied_) {
      const data::safetensors_tensor& emb = *by_name_.at("embedding");
      by_name_["lm_head"] = &emb;  // the head reads the embedding
      // A stored head of a tied model is the embedding's copy, as
      // save_pretrained writes tied weights, or it is another model.
      if (auto it = hf_.find("lm_head.weight"); it != hf_.end()) {
        const data::safetensors_tensor& h = *it->second;
        const bool same = h.dtype == emb.dtype && h.shape == emb.shape && h.bytes == emb.bytes &&
                          std::memcmp(h.data, emb.data, h.bytes) == 0;
        TESSERA_THROW_IF(!same, config_error, where,
                         ": config.json ties the embeddings (tie_word_embeddings: true) but the "
                         "tensor 'lm_head.weight' differs from 'model.embed_tokens.weight' (",
                         h.dtype, " ", nlohmann::json(h.shape).dump(), " vs ", emb.dtype, " ",
                         nlohmann::json(emb.shape).dump(),
                         h.dtype == emb.dtype && h.shape == emb.shape ? ", other values" : "",
                         "): a tied model has one such matrix; set tie_word_embeddings to false "
                         "to load the two apart, or drop lm_head.weight");
        used.insert("lm_head.weight");
      }
    }
    for (const auto& [hn, t] : hf_) {
      (void)t;
      if (used.contains(hn) || hn.ends_with(".rotary_emb.inv_freq")) continue;
      throw config_error(where + " has a tensor tessera's Llama cannot hold: '" + hn + "'" +
                         (hn.ends_with(".bias") ? " (biases)" : ""));
    }
  }

  std::filesystem::path dir_;
  nlohmann::json json_;
  llama_config cfg_;
  bool tied_ = false;
  std::string torch_dtype_;
  std::vector<std::unique_ptr<data::safetensors_file>> files_;
  std::map<std::string, const data::safetensors_tensor*> hf_;       // HF name -> tensor
  std::map<std::string, const data::safetensors_tensor*> by_name_;  // tessera name -> tensor
};

/// The Hugging Face folder `dir` opened for a model of config `c` (the
/// weights it starts from): its config.json held against `c`, every
/// differing size named at once. Throws config_error listing them
/// ("dim=64 vs hidden_size=128, ..."), and what hf_checkpoint throws.
inline std::shared_ptr<const hf_checkpoint> open_hf_for(const llama_config& c,
                                                        const std::string& dir) {
  auto hf = std::make_shared<const hf_checkpoint>(dir);
  const llama_config& h = hf->config();
  std::string diff;
  auto cmp = [&](const char* ours, auto a, const char* theirs, auto b) {
    if (a != b)
      diff += tessera::detail::str(diff.empty() ? "" : ", ", ours, "=", a, " vs ", theirs, "=", b);
  };
  cmp("dim", c.dim, "hidden_size", h.dim);
  cmp("ffn_dim", c.ffn_dim, "intermediate_size", h.ffn_dim);
  cmp("n_layers", c.n_layers, "num_hidden_layers", h.n_layers);
  cmp("n_heads", c.n_heads, "num_attention_heads", h.n_heads);
  cmp("n_kv_heads", c.n_kv_heads, "num_key_value_heads", h.n_kv_heads);
  cmp("vocab", c.vocab, "vocab_size", h.vocab);
  cmp("max_seq", c.max_seq, "max_position_embeddings", h.max_seq);
  cmp("norm_eps", c.norm_eps, "rms_norm_eps", h.norm_eps);
  cmp("rope_theta", c.rope_theta, "rope_theta", h.rope_theta);
  cmp("rope_scaling", to_string(c.rope_scaling), "rope_scaling", to_string(h.rope_scaling));
  auto tf = [](bool b) { return std::string(b ? "true" : "false"); };
  cmp("tie_word_embeddings", tf(c.tie_word_embeddings), "tie_word_embeddings",
      tf(h.tie_word_embeddings));
  TESSERA_THROW_IF(!diff.empty(), config_error, "model '", c.name,
                   "' differs from the Hugging Face checkpoint '", dir, "': ", diff,
                   " (take the model config from its config.json: nn::llama_config_from_hf)");
  return hf;
}

/// Encodes the `n` values at `w` (float64) as safetensors element type
/// `dtype` ("F32", "BF16", "F16", else "F64": hf_safetensors_dtype's names)
/// into `out`, which holds n times the type's bytes (to<D>'s rounding: to
/// nearest even). The one encoder of the exports (the trainer's and a
/// checkpoint's).
inline void encode_hf_tensor(const std::string& dtype, const double* w, std::int64_t n,
                             void* out) {
  auto put = [&](auto tag) {
    using D = decltype(tag);
    for (std::int64_t i = 0; i < n; ++i) {
      const D x = to<D>(w[i]);
      std::memcpy(static_cast<char*>(out) + static_cast<std::size_t>(i) * sizeof(D), &x,
                  sizeof(D));
    }
  };
  if (dtype == "F32")
    put(float{});
  else if (dtype == "BF16")
    put(bf16{});
  else if (dtype == "F16")
    put(fp16{});
  else
    put(double{});
}

/// The largest shard of an export unless the caller sets one: 5 GB (10^9
/// bytes each), transformers' save_pretrained default.
inline constexpr std::uint64_t hf_default_shard_bytes = 5'000'000'000ull;

/// Whether the parameter `e` of make_llama_layout belongs to the modules
/// of pipeline stage `s` of a model of `n_layers` blocks.
inline bool stage_holds(const stage_range& s, const param_entry& e, std::int64_t n_layers) {
  if (e.block < 0) return e.name == "embedding" ? s.embedding : s.head;
  const std::int64_t last = s.last_block < 0 ? n_layers : s.last_block;
  return e.block >= s.first_block && e.block < last;
}

/// One file of a Hugging Face export: its name, the tessera tensors it
/// holds in order, its tensor bytes, and the virtual stage whose rank
/// writes it.
struct hf_file {
  std::string name;
  std::vector<std::string> tensors;
  std::uint64_t bytes = 0;
  int virtual_stage = 0;
};

/// The files of an export of model `c` held as `stages` (the virtual
/// stages in order, parallel::partition_stages; one whole-model stage
/// without a pipeline), `elem_bytes` bytes per element: consecutive
/// tensors of one stage packed greedily into files of at most `max_bytes`
/// (a larger tensor alone in its file), a file never spanning two stages
/// (each stage's rank writes its own). One file is "model.safetensors";
/// N > 1 are "model-0000i-of-0000N.safetensors" (transformers' names)
/// listed by model.safetensors.index.json. Throws config_error for
/// max_bytes 0.
inline std::vector<hf_file> plan_hf_files(const llama_config& c,
                                          const std::vector<stage_range>& stages,
                                          std::size_t elem_bytes, std::uint64_t max_bytes) {
  TESSERA_THROW_IF(max_bytes == 0, config_error, "Hugging Face export: a shard size of 0 bytes");
  const param_layout layout = make_llama_layout(c);
  std::vector<hf_file> files;
  for (std::size_t v = 0; v < stages.size(); ++v) {
    bool open = false;
    for (const auto& e : layout.entries()) {
      if (!stage_holds(stages[v], e, c.n_layers)) continue;
      const std::uint64_t b = static_cast<std::uint64_t>(e.full.numel()) * elem_bytes;
      if (!open || (files.back().bytes > 0 && files.back().bytes + b > max_bytes)) {
        files.push_back({});
        files.back().virtual_stage = static_cast<int>(v);
        open = true;
      }
      files.back().tensors.push_back(e.name);
      files.back().bytes += b;
    }
  }
  const std::size_t n = files.size();
  for (std::size_t i = 0; i < n; ++i) {
    if (n == 1) {
      files[i].name = "model.safetensors";
    } else {
      char buf[64];
      std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
      files[i].name = buf;
    }
  }
  return files;
}

/// model.safetensors.index.json of a sharded export: {"metadata":
/// {"total_size": bytes}, "weight_map": {Hugging Face name: file}}.
inline nlohmann::json hf_index_json(const std::vector<hf_file>& files) {
  nlohmann::json map = nlohmann::json::object();
  std::uint64_t total = 0;
  for (const auto& f : files) {
    total += f.bytes;
    for (const auto& t : f.tensors) map[hf_tensor_name(t)] = f.name;
  }
  return {{"metadata", {{"total_size", total}}}, {"weight_map", map}};
}

/// Writes the files of `files` that virtual stage `v` writes into `dir`
/// (each atomically; data::write_safetensors), from `h`: the flat
/// parameters of that stage's chunk on every rank of a tp group of `tp`,
/// rank r's at h[r * stride] (its chunk's elements [flat_begin, flat_begin
/// + n) of make_llama_layout(c, {tp, r})). Each tensor is reassembled whole
/// from its shards (param_entry::full_index; padding rows dropped) in
/// float64, then rounded to `dtype` ("F32", "BF16", "F16" or "F64").
/// Memory: one tensor in float64 and one in `dtype` at a time per file.
/// Throws io_error naming a file that cannot be written.
template <class Param>
void write_hf_stage_files(const std::filesystem::path& dir, const std::vector<hf_file>& files,
                          int v, const llama_config& c, int tp, std::int64_t flat_begin,
                          [[maybe_unused]] std::int64_t n, const std::vector<Param>& h,
                          std::int64_t stride, const std::string& dtype) {
  std::vector<param_layout> layouts;
  for (int r = 0; r < tp; ++r) layouts.push_back(make_llama_layout(c, {tp, r}));
  const std::size_t eb = data::safetensors_dtype_bytes(dtype);
  for (const auto& f : files) {
    if (f.virtual_stage != v) continue;
    std::vector<std::vector<unsigned char>> bytes;
    std::vector<data::safetensors_entry> entries;
    for (const auto& name : f.tensors) {
      const param_entry& e0 = layouts[0].at(name);
      TESSERA_EXPECTS(e0.offset >= flat_begin && e0.offset + e0.numel <= flat_begin + n,
                      "an exported tensor outside its stage's chunk");
      const std::int64_t whole = e0.full.numel();
      std::vector<double> w(static_cast<std::size_t>(whole));
      for (int r = 0; r < (e0.shard_dim < 0 ? 1 : tp); ++r) {
        const param_entry& e = layouts[static_cast<std::size_t>(r)].at(name);
        const Param* src = h.data() + static_cast<std::size_t>(r * stride + e.offset - flat_begin);
        for (std::int64_t j = 0; j < e.numel; ++j) {
          const std::int64_t at = e.full_index(j);
          if (at < whole) w[static_cast<std::size_t>(at)] = to<double>(src[j]);
        }
      }
      auto& b = bytes.emplace_back(static_cast<std::size_t>(whole) * eb);
      encode_hf_tensor(dtype, w.data(), whole, b.data());
      std::vector<std::int64_t> shape;
      for (int d = 0; d < e0.full.rank; ++d) shape.push_back(e0.full[d]);
      entries.push_back({hf_tensor_name(name), dtype, shape, b.data(), b.size()});
    }
    data::write_safetensors(dir / f.name, entries, {{"format", "pt"}});
  }
}

}  // namespace tessera::nn
