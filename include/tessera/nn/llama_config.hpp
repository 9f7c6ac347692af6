#pragma once
/// \file nn/llama_config.hpp
/// Model dimensions of a Llama-family decoder and the presets.
///
/// Letters: H = dim, L = n_layers, nh = n_heads, nkv = n_kv_heads,
/// hd = H / nh, F = ffn_dim, V = vocab.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tessera/core/checked.hpp"
#include "tessera/core/error.hpp"
#include "tessera/nn/rope_scaling.hpp"

namespace tessera::nn {

/// Sizes of a Llama model. Run-time values (DESIGN.md, principle 3).
struct llama_config {
  std::string name = "custom";
  std::int64_t dim = 0;         ///< H, the model (hidden) dimension
  std::int64_t n_layers = 0;    ///< L, transformer blocks
  std::int64_t n_heads = 0;     ///< nh, query heads
  std::int64_t n_kv_heads = 0;  ///< nkv, key/value heads (GQA when < nh)
  std::int64_t ffn_dim = 0;     ///< F, SwiGLU hidden dimension
  std::int64_t vocab = 0;       ///< V
  std::int64_t max_seq = 0;     ///< longest sequence the RoPE tables cover
  double rope_theta = 10000.0;  ///< RoPE base
  double norm_eps = 1e-5;       ///< RMSNorm epsilon
  /// Llama 3.1's frequency scaling (rope_type "llama3", nn/rope_scaling.hpp);
  /// none: the plain theta^(-2i/hd) frequencies.
  std::optional<llama3_rope_scaling> rope_scaling = std::nullopt;
  /// The LM head is the embedding (Hugging Face's tie_word_embeddings; Llama
  /// 3.2 1B and 3B, GPT-2): one (V, H) parameter, read by the embedding's
  /// lookup and by the head's logits = x wte^T, its gradient the sum of both
  /// uses. The layout then has no "lm_head" tensor (nn/llama_layout.hpp;
  /// under a pipeline the last stage holds a copy kept equal to it).
  bool tie_word_embeddings = false;

  std::int64_t head_dim() const { return n_heads > 0 ? dim / n_heads : 0; }
  std::int64_t kv_dim() const { return n_kv_heads * head_dim(); }
  /// The hd/2 inverse frequencies of the RoPE tables, in double
  /// (nn::rope_inv_freqs of hd, rope_theta and rope_scaling).
  std::vector<double> rope_inv_freqs() const {
    return nn::rope_inv_freqs(head_dim(), rope_theta, rope_scaling);
  }

  /// Throws config_error naming the values if a size is not positive, nh does
  /// not divide H, nkv does not divide nh, hd is odd (RoPE pairs dims), or
  /// the rope scaling is not valid (llama3_rope_scaling::validate).
  void validate() const {
    auto pos = [&](std::int64_t v, const char* what) {
      TESSERA_THROW_IF(v <= 0, config_error, what, "=", v, " must be >= 1 (model '", name, "')");
    };
    pos(dim, "dim");
    pos(n_layers, "n_layers");
    pos(n_heads, "n_heads");
    pos(n_kv_heads, "n_kv_heads");
    pos(ffn_dim, "ffn_dim");
    pos(vocab, "vocab");
    pos(max_seq, "max_seq");
    TESSERA_THROW_IF(dim % n_heads != 0, config_error, "n_heads=", n_heads,
                     " does not divide dim=", dim, " (model '", name, "')");
    TESSERA_THROW_IF(n_heads % n_kv_heads != 0, config_error, "n_kv_heads=", n_kv_heads,
                     " does not divide n_heads=", n_heads, " (model '", name, "')");
    TESSERA_THROW_IF(head_dim() % 2 != 0, config_error, "head_dim=", head_dim(),
                     " must be even for RoPE (dim=", dim, ", n_heads=", n_heads, ")");
    TESSERA_THROW_IF(rope_theta <= 1.0, config_error, "rope_theta=", rope_theta, " must be > 1");
    TESSERA_THROW_IF(!(norm_eps > 0), config_error, "norm_eps=", norm_eps, " must be > 0");
    if (rope_scaling) {
      try {
        rope_scaling->validate();
      } catch (const config_error& e) {
        throw config_error(tessera::detail::str(e.what(), " (model '", name, "')"));
      }
    }
    // Every size the model allocates fits 64 bits: a parameter count past
    // 2^63 would wrap into a small, wrong one.
    try {
      const char* w = "the model's parameter count";
      const std::int64_t kv = checked_mul(n_kv_heads, head_dim(), w);
      std::int64_t block = checked_add(checked_mul(2, dim, w), checked_mul(checked_mul(2, dim, w), dim, w), w);
      block = checked_add(block, checked_mul(checked_mul(2, kv, w), dim, w), w);
      block = checked_add(block, checked_mul(checked_mul(3, dim, w), ffn_dim, w), w);
      const std::int64_t total = checked_add(
          checked_add(checked_mul(checked_mul(2, vocab, w), dim, w), checked_mul(n_layers, block, w), w),
          dim, w);
      (void)checked_mul(total, 16, "the model's training state (16 bytes per parameter)");
      (void)checked_mul(max_seq, dim, "the RoPE table and one sequence's activations");
    } catch (const config_error& e) {
      throw config_error(tessera::detail::str(e.what(), " (model '", name, "': dim=", dim, ", n_layers=",
                                     n_layers, ", ffn_dim=", ffn_dim, ", vocab=", vocab,
                                     ", max_seq=", max_seq, ")"));
    }
  }

  /// Parameters of one transformer block: 2 norms, wq, wk, wv, wo, and the
  /// three SwiGLU matrices.
  std::int64_t block_params() const {
    return 2 * dim + dim * dim + 2 * kv_dim() * dim + dim * dim + 3 * dim * ffn_dim;
  }
  /// All parameters: embedding (V, H), L blocks, final norm (H), and the LM
  /// head (V, H) unless tied to the embedding (counted once then).
  std::int64_t num_params() const {
    return (tie_word_embeddings ? 1 : 2) * vocab * dim + n_layers * block_params() + dim;
  }

  /// Test preset: small enough for float64 finite differences, with GQA.
  static llama_config tiny() {
    return {"tiny", 16, 2, 4, 2, 24, 32, 64, 10000.0, 1e-5};
  }
  /// Trains on two CPU cores in minutes on the bundled corpus (byte vocabulary):
  /// H 128, L 4, nh 4 over nkv 2 (GQA), F 384, V 256; 0.85M parameters.
  /// Chosen by measurement on 2 cores: at equal wall time (~3 minutes) it
  /// reached a lower validation loss than H 256 / F 704 (3.1M parameters),
  /// which runs 2.3x fewer tokens per second (benchmarks/RESULTS.md).
  static llama_config small() {
    return {"small", 128, 4, 4, 2, 384, 256, 256, 10000.0, 1e-5};
  }
  /// Llama 2 7B (Touvron et al. 2023): H 4096, L 32, nh 32, F 11008, V 32000, theta 1e4.
  static llama_config llama2_7b() {
    return {"llama2_7b", 4096, 32, 32, 32, 11008, 32000, 4096, 10000.0, 1e-5};
  }
  /// Llama 3 8B (Meta 2024): H 4096, L 32, nh 32, nkv 8, F 14336, V 128256, theta 5e5.
  static llama_config llama3_8b() {
    return {"llama3_8b", 4096, 32, 32, 8, 14336, 128256, 8192, 500000.0, 1e-5};
  }
  /// Llama 3.1 8B (Meta 2024; meta-llama/Llama-3.1-8B's config.json): Llama 3
  /// 8B's sizes with 128K positions by llama3 RoPE scaling (factor 8,
  /// low/high frequency factors 1 and 4, original context 8192), untied
  /// embeddings.
  static llama_config llama3_1_8b() {
    llama_config c = llama3_8b();
    c.name = "llama3_1_8b";
    c.max_seq = 131072;
    c.rope_scaling = llama3_rope_scaling{8.0, 1.0, 4.0, 8192};
    return c;
  }
  /// Llama 3.2 1B (Meta 2024; meta-llama/Llama-3.2-1B's config.json): H
  /// 2048, L 16, nh 32, nkv 8 (hd 64), F 8192, V 128256, theta 5e5, 128K
  /// positions by llama3 RoPE scaling (factor 32, low/high frequency
  /// factors 1 and 4, original context 8192), tied embeddings; 1.24B
  /// parameters.
  static llama_config llama3_2_1b() {
    llama_config c{"llama3_2_1b", 2048, 16, 32, 8, 8192, 128256, 131072, 500000.0, 1e-5};
    c.rope_scaling = llama3_rope_scaling{32.0, 1.0, 4.0, 8192};
    c.tie_word_embeddings = true;
    return c;
  }
  /// Llama 3.2 3B (meta-llama/Llama-3.2-3B's config.json): Llama 3.2 1B's
  /// with H 3072, L 28, nh 24 (hd 128); 3.21B parameters.
  static llama_config llama3_2_3b() {
    llama_config c = llama3_2_1b();
    c.name = "llama3_2_3b";
    c.dim = 3072;
    c.n_layers = 28;
    c.n_heads = 24;
    return c;
  }
  /// Names accepted by from_name().
  static std::vector<std::string> preset_names() {
    return {"tiny", "small", "llama2_7b", "llama3_8b", "llama3_1_8b", "llama3_2_1b", "llama3_2_3b"};
  }
  /// Looks up a preset; throws config_error listing the valid names.
  static llama_config from_name(const std::string& n) {
    if (n == "tiny") return tiny();
    if (n == "small") return small();
    if (n == "llama2_7b") return llama2_7b();
    if (n == "llama3_8b") return llama3_8b();
    if (n == "llama3_1_8b") return llama3_1_8b();
    if (n == "llama3_2_1b") return llama3_2_1b();
    if (n == "llama3_2_3b") return llama3_2_3b();
    throw config_error("unknown preset '" + n +
                       "' (valid: tiny, small, llama2_7b, llama3_8b, llama3_1_8b, llama3_2_1b, "
                       "llama3_2_3b)");
  }
};

}  // namespace tessera::nn
