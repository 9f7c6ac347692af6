#pragma once
/// \file nn/llama_layout.hpp
/// The flat parameter layout of a Llama (DESIGN.md, principle 4), shared by
/// the model (nn/llama.hpp, every backend) and
/// the planners, and its initial weights. No kernels, no backend: any translation unit may include it.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "tessera/core/error.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/core/random.hpp"
#include "tessera/nn/llama_config.hpp"
#include "tessera/nn/param_layout.hpp"

namespace tessera::nn {

/// Builds the parameter layout of a config: embedding, blocks (attn_norm, wq,
/// wk, wv, wo, mlp_norm, w_gate, w_up, w_down), final norm, LM head.
inline param_layout make_llama_layout(const llama_config& c) {
  c.validate();
  param_layout p;
  const std::int64_t H = c.dim, F = c.ffn_dim, KV = c.kv_dim();
  p.add("embedding", {c.vocab, H}, true, -1);
  for (int l = 0; l < static_cast<int>(c.n_layers); ++l) {
    const std::string b = "blocks." + std::to_string(l) + ".";
    p.add(b + "attn_norm", {H}, false, l);
    p.add(b + "attn.wq", {H, H}, true, l);
    p.add(b + "attn.wk", {KV, H}, true, l);
    p.add(b + "attn.wv", {KV, H}, true, l);
    p.add(b + "attn.wo", {H, H}, true, l);
    p.add(b + "mlp_norm", {H}, false, l);
    p.add(b + "mlp.w_gate", {F, H}, true, l);
    p.add(b + "mlp.w_up", {F, H}, true, l);
    p.add(b + "mlp.w_down", {H, F}, true, l);
  }
  p.add("final_norm", {H}, false, -1);
  p.add("lm_head", {c.vocab, H}, true, -1);
  return p;
}

/// The initial weights of a Llama (llama::init_weights) for flat elements
/// [lo, hi) of `layout` (make_llama_layout(c)): out[i - lo] for i in [lo, hi).
/// Matrices ~ N(0, 0.02^2) with attn.wo and mlp.w_down scaled by
/// 1/sqrt(2 L) (GPT-2), norm gains 1, alignment padding 0. Each tensor draws
/// from its own seeded stream, so any range (a ZeRO shard, one tensor on
/// one thread) gets the same values as the whole buffer.
/// Precondition: 0 <= lo <= hi <= layout.total(); out holds hi - lo elements.
template <class Param>
void init_llama_weights_range(const llama_config& c, const param_layout& layout,
                              std::uint64_t seed, std::int64_t lo, std::int64_t hi, Param* out) {
  TESSERA_EXPECTS(0 <= lo && lo <= hi && hi <= layout.total(), "init range outside the buffer");
  for (std::int64_t i = lo; i < hi; ++i) out[i - lo] = to<Param>(0.0);
  const double std0 = 0.02;
  const double out_scale = 1.0 / std::sqrt(2.0 * static_cast<double>(c.n_layers));
  std::uint64_t idx = 0;
  for (const auto& e : layout.entries()) {
    ++idx;
    const std::int64_t b = std::max(lo, e.offset), en = std::min(hi, e.offset + e.numel);
    if (b >= en) continue;
    if (e.shp.rank == 1) {
      for (std::int64_t i = b; i < en; ++i) out[i - lo] = to<Param>(1.0);
      continue;
    }
    rng r(mix64(seed) ^ mix64(idx * 0x9e3779b97f4a7c15ull));
    const bool is_out = e.name.ends_with("attn.wo") || e.name.ends_with("mlp.w_down");
    const double s = is_out ? std0 * out_scale : std0;
    for (std::int64_t i = e.offset; i < en; ++i) {
      const double z = r.normal();
      if (i >= b) out[i - lo] = to<Param>(s * z);
    }
  }
}

}  // namespace tessera::nn
