#pragma once
/// \file nn/llama_layout.hpp
/// The flat parameter layout of a Llama (DESIGN.md, principle 4), shared by
/// the model (nn/llama.hpp, every backend) and
/// the planners, and its initial weights. No kernels, no backend (only the
/// plain tensor table of kernels/detail/weight_init.hpp): any translation
/// unit may include it.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/core/random.hpp"
#include "tessera/kernels/detail/weight_init.hpp"
#include "tessera/nn/llama_config.hpp"
#include "tessera/nn/param_layout.hpp"

namespace tessera::nn {

/// This rank's place in its tensor-parallel group (size 1: no tensor
/// parallelism).
struct tp_rank {
  int size = 1;  ///< tp, the group's size
  int rank = 0;  ///< this rank's index in the group, [0, tp)
};

/// Throws config_error unless a model of config `c` splits over tp ranks:
/// tp divides the query heads nh and the SwiGLU width F, and either tp
/// divides the key/value heads nkv (each rank holds nkv/tp of them and the
/// nh/tp query heads that use them) or tp is a multiple of nkv (each
/// key/value head replicated on the tp/nkv ranks whose query heads use it).
/// The message names tp and the numbers.
inline void check_tensor_parallel(const llama_config& c, int tp) {
  TESSERA_THROW_IF(tp < 1, config_error, "tensor parallelism: tp=", tp, " must be >= 1");
  TESSERA_THROW_IF(c.n_heads % tp != 0 || (c.n_kv_heads % tp != 0 && tp % c.n_kv_heads != 0),
                   config_error, "tensor parallelism: tp=", tp,
                   " must divide the query heads nh=", c.n_heads,
                   " and either divide the key/value heads nkv=", c.n_kv_heads,
                   " or be a multiple of them (each rank holds its query heads and the "
                   "key/value heads they use)");
  TESSERA_THROW_IF(c.ffn_dim % tp != 0, config_error, "tensor parallelism: tp=", tp,
                   " does not divide the SwiGLU width F=", c.ffn_dim);
}

/// Throws config_error unless sequence parallelism can shard a sequence
/// of T tokens over tp ranks (each holds T/tp of every sequence's rows):
/// tp > 1 and tp divides T. The message names T and tp.
inline void check_sequence_parallel(std::int64_t T, int tp) {
  TESSERA_THROW_IF(tp < 2, config_error,
                   "sequence parallelism shards the tokens over the tensor-parallel group: it "
                   "needs tp > 1 (tp=", tp, ")");
  TESSERA_THROW_IF(T % tp != 0, config_error, "sequence parallelism: sequence length T=", T,
                   " is not divisible by tp=", tp);
}

/// How many tp ranks hold each key/value head: 1 when tp divides nkv,
/// tp/nkv when tp is a multiple of nkv (grouped-query heads replicated).
/// Precondition: check_tensor_parallel(c, tp) holds.
inline int kv_replicas(const llama_config& c, int tp) {
  return tp > c.n_kv_heads ? static_cast<int>(tp / c.n_kv_heads) : 1;
}

/// Where the LM head of a model with tied embeddings
/// (llama_config::tie_word_embeddings) reads its (V, H) weights.
enum class tied_head : std::uint8_t {
  /// The embedding itself: a model (or pipeline stage) holding both; the
  /// layout has no "lm_head" tensor.
  embedding,
  /// A copy in the head's segment, "lm_head" with param_entry::tied =
  /// "embedding": the last stage of a pipeline, whose first stage holds the
  /// embedding (Megatron-LM's word embeddings for the head). The copy is
  /// last in the layout, so every other tensor keeps its offset.
  copy,
};

/// Builds the parameter layout of a config: embedding, blocks (attn_norm, wq,
/// wk, wv, wo, mlp_norm, w_gate, w_up, w_down), final norm, LM head. With
/// tensor parallelism (`t.size` > 1) it is rank `t.rank`'s: wq, wk, wv,
/// w_gate and w_up hold their rows (output features) [r n/tp, (r+1) n/tp)
/// (whole heads: hd rows each), wo and w_down their columns (input
/// features) likewise (when tp > nkv, wk and wv hold the one key/value
/// head rank r's query heads use, head r / (tp/nkv), replicated on tp/nkv
/// ranks); the embedding and the LM head hold their rows of the
/// vocabulary padded to a multiple of tp (ceil(V/tp) each, the padding
/// last); the norms are whole on every rank. With tied embeddings
/// (c.tie_word_embeddings) there is no LM head tensor, unless `head` is
/// tied_head::copy: then "lm_head" is the embedding's copy (same shape and
/// vocabulary split, param_entry::tied = "embedding"); `head` is unused for
/// untied embeddings. Throws config_error as check_tensor_parallel.
inline param_layout make_llama_layout(const llama_config& c, tp_rank t = {},
                                      tied_head head = tied_head::embedding) {
  c.validate();
  check_tensor_parallel(c, t.size);
  TESSERA_THROW_IF(t.rank < 0 || t.rank >= t.size, config_error, "tensor parallelism: rank ",
                   t.rank, " is not in [0, ", t.size, ")");
  param_layout p;
  const std::int64_t H = c.dim, F = c.ffn_dim, KV = c.kv_dim(), tp = t.size, r = t.rank;
  auto rows = [&](const std::string& name, std::int64_t out, std::int64_t in, int l) {
    p.add_shard(name, {out / tp, in}, true, l, {out, in}, tp > 1 ? 0 : -1, r * (out / tp));
  };
  auto cols = [&](const std::string& name, std::int64_t out, std::int64_t in, int l) {
    p.add_shard(name, {out, in / tp}, true, l, {out, in}, tp > 1 ? 1 : -1, r * (in / tp));
  };
  // The vocabulary splits by rows, padded to a multiple of tp (padding rows
  // hold zeros, take no part in the softmax and get no gradient).
  const std::int64_t Vl = (c.vocab + tp - 1) / tp;
  auto vocab = [&](const std::string& name) {
    if (tp == 1)
      p.add(name, {c.vocab, H}, true, -1);
    else
      p.add_shard(name, {Vl, H}, true, -1, {c.vocab, H}, 0, r * Vl);
  };
  // Key/value heads: tp/nkv ranks share each one when tp > nkv.
  const int rep = kv_replicas(c, t.size);
  auto kv = [&](const std::string& name, int l) {
    if (rep == 1) return rows(name, KV, H, l);
    const std::int64_t hd = c.head_dim();
    param_entry& e = p.add_shard(name, {hd, H}, true, l, {KV, H}, 0, (r / rep) * hd);
    e.replicas = rep;
    e.replica = static_cast<int>(r % rep);
  };
  vocab("embedding");
  for (int l = 0; l < static_cast<int>(c.n_layers); ++l) {
    const std::string b = "blocks." + std::to_string(l) + ".";
    p.add(b + "attn_norm", {H}, false, l);
    rows(b + "attn.wq", H, H, l);
    kv(b + "attn.wk", l);
    kv(b + "attn.wv", l);
    cols(b + "attn.wo", H, H, l);
    p.add(b + "mlp_norm", {H}, false, l);
    rows(b + "mlp.w_gate", F, H, l);
    rows(b + "mlp.w_up", F, H, l);
    cols(b + "mlp.w_down", H, F, l);
  }
  p.add("final_norm", {H}, false, -1);
  if (!c.tie_word_embeddings) {
    vocab("lm_head");
  } else if (head == tied_head::copy) {
    vocab("lm_head");
    p.tied_copy("lm_head", "embedding");
  }
  return p;
}

/// The initial weights of a Llama (llama::init_weights) for flat elements
/// [lo, hi) of `layout` (make_llama_layout(c)): out[i - lo] for i in [lo, hi).
/// Matrices ~ N(0, 0.02^2) with attn.wo and mlp.w_down scaled by
/// 1/sqrt(2 L) (GPT-2), drawn over the whole tensor (a tensor-parallel
/// shard holds its slice of the same draw), norm gains 1, alignment
/// padding 0. Each tensor draws
/// from its own seeded stream, so any range (a ZeRO shard, one tensor on
/// one thread) gets the same values as the whole buffer; a tied copy
/// (param_entry::tied) draws its tensor's stream, so it starts equal to it.
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
    const std::uint64_t draw = e.tied.empty() ? idx : layout.draw_index(e.tied);
    if (e.shp.rank == 1) {
      for (std::int64_t i = b; i < en; ++i) out[i - lo] = to<Param>(1.0);
      continue;
    }
    rng r(mix64(seed) ^ mix64(draw * 0x9e3779b97f4a7c15ull));
    const bool is_out = e.name.ends_with("attn.wo") || e.name.ends_with("mlp.w_down");
    const double s = is_out ? std0 * out_scale : std0;
    // The whole tensor's stream, drawn in its row-major order: a shard
    // keeps the draws of its own elements, so a tp run starts from exactly
    // the single-rank model.
    std::int64_t drawn = 0;
    double z = 0;
    const std::int64_t whole = e.full.numel();
    for (std::int64_t i = e.offset; i < en; ++i) {
      const std::int64_t want = e.full_index(i - e.offset);
      if (want >= whole) break;  // padding rows (the last ones) stay 0
      while (drawn <= want) {
        z = r.normal();
        ++drawn;
      }
      if (i >= b) out[i - lo] = to<Param>(s * z);
    }
  }
}

/// The tensors of `layout` (make_llama_layout(c, ...)) as
/// kernels::weight_init reads them, in layout order: the same values as
/// init_llama_weights_range(c, layout, seed, ...), each element computed
/// from its index (tensor k's stream starts at rng_start of the seed that
/// function gives rng for tensor k; element w of the whole tensor is its
/// w-th normal), so the GPU draws a model in place and a tensor-parallel
/// shard costs its own elements, not the whole tensor's draws.
/// tests/kernels/weight_init.cpp holds the two equal.
inline std::vector<kernels::weight_init_tensor> llama_weight_init_tensors(
    const llama_config& c, const param_layout& layout, std::uint64_t seed) {
  const double std0 = 0.02;
  const double out_scale = 1.0 / std::sqrt(2.0 * static_cast<double>(c.n_layers));
  std::vector<kernels::weight_init_tensor> ts;
  ts.reserve(layout.entries().size());
  std::uint64_t idx = 0;
  for (const auto& e : layout.entries()) {
    ++idx;
    kernels::weight_init_tensor t;
    t.offset = e.offset;
    t.numel = e.numel;
    t.full_numel = e.full.numel();
    if (e.shp.rank == 1) {
      t.kind = kernels::weight_init_kind::ones;
    } else {
      const bool is_out = e.name.ends_with("attn.wo") || e.name.ends_with("mlp.w_down");
      t.kind = kernels::weight_init_kind::normal;
      t.scale = is_out ? std0 * out_scale : std0;
      const std::uint64_t draw = e.tied.empty() ? idx : layout.draw_index(e.tied);
      t.start = rng_start(mix64(seed) ^ mix64(draw * 0x9e3779b97f4a7c15ull));
      t.cols = e.shp[1];
      t.full_cols = e.full[1];
      t.shard_dim = e.shard_dim;
      t.shard_begin = e.shard_begin;
    }
    ts.push_back(t);
  }
  return ts;
}

/// Values of a model's whole (unsharded) tensors by their tessera name
/// (make_llama_layout's names): read(name, first, n, out) writes elements
/// [first, first + n) of tensor `name`, row-major over its full shape, as
/// doubles into out. A Hugging Face checkpoint (nn/hf_llama.hpp) is one.
using tensor_reader =
    std::function<void(const std::string& name, std::int64_t first, std::int64_t n, double* out)>;

/// Elements [lo, hi) of `layout`'s flat buffer read from `read` instead of
/// drawn: out[i - lo] for i in [lo, hi), each tensor-parallel shard the
/// slice of the whole tensor it holds, vocabulary padding rows and
/// alignment padding 0; a tied copy (param_entry::tied) reads its tensor
/// ("embedding"). Reads in runs of consecutive elements of the whole
/// tensor (a row shard's block, a column shard's row pieces).
/// Precondition: 0 <= lo <= hi <= layout.total(); out holds hi - lo elements.
template <class Param>
void load_llama_weights_range(const param_layout& layout, const tensor_reader& read,
                              std::int64_t lo, std::int64_t hi, Param* out) {
  TESSERA_EXPECTS(0 <= lo && lo <= hi && hi <= layout.total(), "load range outside the buffer");
  for (std::int64_t i = lo; i < hi; ++i) out[i - lo] = to<Param>(0.0);
  std::vector<double> run;
  for (const auto& e : layout.entries()) {
    const std::int64_t b = std::max(lo, e.offset), en = std::min(hi, e.offset + e.numel);
    const std::int64_t whole = e.full.numel();
    for (std::int64_t j = b - e.offset; j < en - e.offset;) {
      const std::int64_t first = e.full_index(j);
      if (first >= whole) break;  // padding rows (the last ones) stay 0
      std::int64_t n = en - e.offset - j;
      if (e.shard_dim == 1) n = std::min(n, e.shp[1] - j % e.shp[1]);
      n = std::min(n, whole - first);
      run.resize(static_cast<std::size_t>(n));
      read(e.tied.empty() ? e.name : e.tied, first, n, run.data());  // a copy reads its tensor
      for (std::int64_t k = 0; k < n; ++k) out[e.offset + j + k - lo] = to<Param>(run[k]);
      j += n;
    }
  }
}

}  // namespace tessera::nn
