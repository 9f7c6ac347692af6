#pragma once
/// \file nn/llama.hpp
/// A Llama decoder with explicit forward and backward over flat buffers.
///
/// Gradient contract (llm.c): parameter gradients accumulate (+=) into the
/// flat gradient buffer, so micro-batches of one optimizer step add up;
/// activation gradients are written (=). zero_grad() clears the buffer.
///
/// The forward pass is a push, the backward pass is a pop
/// (seeds/000_837c961be0ac0c27.txt): forward() saves exactly what backward()
/// needs in an activation record per block, and backward() frees each record
/// as soon as it has consumed it, so activation memory is countable.
///
/// Block (pre-norm, Touvron et al. 2023):
///   xn1 = rmsnorm(x);  q,k,v = xn1 Wq^T, xn1 Wk^T, xn1 Wv^T;  rope(q, k)
///   a = causal_attention(q, k, v);  x' = x + a Wo^T
///   xn2 = rmsnorm(x');  h = silu(xn2 Wg^T) * (xn2 Wu^T);  y = x' + h Wd^T
/// Model: embedding -> L blocks -> final rmsnorm -> LM head + cross-entropy
/// (fused, chunked over tokens).

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/core/random.hpp"
#include "tessera/core/tensor.hpp"
#include "tessera/kernels/attention.hpp"
#include "tessera/kernels/cross_entropy.hpp"
#include "tessera/kernels/elementwise.hpp"
#include "tessera/kernels/embedding.hpp"
#include "tessera/kernels/gemm.hpp"
#include "tessera/kernels/rmsnorm.hpp"
#include "tessera/kernels/rope.hpp"
#include "tessera/kernels/swiglu.hpp"
#include "tessera/nn/llama_config.hpp"
#include "tessera/nn/param_layout.hpp"
#include "tessera/precision/policy.hpp"

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

/// Options of a model instance that are not model sizes.
struct llama_options {
  std::int64_t ce_chunk = 256;        ///< token rows per LM-head/cross-entropy chunk
  kernels::attention_tiles tiles{};   ///< attention tile sizes
  std::int32_t ignore_index = -100;   ///< target id that is not scored
};

/// Llama model over flat parameter (`param_type`) and gradient (`grad_type`)
/// buffers, with precision policy `P`. Not thread-safe; one instance per rank.
template <precision::policy P>
class llama {
public:
  using Param = typename P::param_type;
  using Grad = typename P::grad_type;
  using Acc = typename P::accum_type;

  /// Allocates parameters and gradients (uninitialised; call init_weights)
  /// and the RoPE tables from `mr`. Throws config_error for an invalid config.
  explicit llama(llama_config cfg, llama_options opt = {},
                 memory_resource& mr = host::default_resource())
      : cfg_(std::move(cfg)), opt_(opt), layout_(make_llama_layout(cfg_)), mr_(&mr) {
    TESSERA_THROW_IF(opt_.ce_chunk < 1, config_error, "ce_chunk=", opt_.ce_chunk, " must be >= 1");
    params_ = tensor<Param>(shape{layout_.total()}, mr);
    grads_ = tensor<Grad>(shape{layout_.total()}, mr);
    params_.zero();
    grads_.zero();
    for (int l = 0; l < static_cast<int>(cfg_.n_layers); ++l) blocks_.push_back(find_block_offsets(l));
    const std::int64_t half = cfg_.head_dim() / 2;
    rope_cos_ = tensor<float>(shape{cfg_.max_seq, half}, mr);
    rope_sin_ = tensor<float>(shape{cfg_.max_seq, half}, mr);
    kernels::rope_table(rope_cos_.data(), rope_sin_.data(), cfg_.max_seq, cfg_.head_dim(),
                        cfg_.rope_theta);
  }

  const llama_config& config() const { return cfg_; }
  const param_layout& layout() const { return layout_; }
  /// Flat parameter buffer, (layout().total()) elements of param_type.
  Param* params() { return params_.data(); }
  const Param* params() const { return params_.data(); }
  /// Flat gradient buffer, same offsets, grad_type.
  Grad* grads() { return grads_.data(); }
  const Grad* grads() const { return grads_.data(); }
  std::int64_t num_params() const { return layout_.num_params(); }
  /// RoPE tables (max_seq, hd/2), float32 whatever param_type is.
  const float* rope_cos() const { return rope_cos_.data(); }
  const float* rope_sin() const { return rope_sin_.data(); }

  /// Deterministic initialisation from `seed`: matrices ~ N(0, 0.02^2), the
  /// residual output projections (wo, w_down) scaled by 1/sqrt(2L) (GPT-2,
  /// Radford et al. 2019), norm gains 1. Each tensor draws from its own
  /// stream (seed, tensor index), so the values do not depend on the layout.
  void init_weights(std::uint64_t seed) {
    const double std0 = 0.02;
    const double out_scale = 1.0 / std::sqrt(2.0 * static_cast<double>(cfg_.n_layers));
    std::uint64_t idx = 0;
    for (const auto& e : layout_.entries()) {
      rng r(mix64(seed) ^ mix64(++idx * 0x9e3779b97f4a7c15ull));
      Param* p = params_.data() + e.offset;
      if (e.shp.rank == 1) {
        for (std::int64_t i = 0; i < e.numel; ++i) p[i] = to<Param>(1.0);
      } else {
        const bool is_out = e.name.ends_with("attn.wo") || e.name.ends_with("mlp.w_down");
        const double s = is_out ? std0 * out_scale : std0;
        for (std::int64_t i = 0; i < e.numel; ++i) p[i] = to<Param>(s * r.normal());
      }
    }
  }

  /// Sets every gradient to zero.
  void zero_grad() { grads_.zero(); }

  /// Forward and backward of one micro-batch.
  /// tokens: (B, T+1) int32 windows; position (b, t) reads tokens[b][t] and is
  /// scored against tokens[b][t+1] unless that is ignore_index. An input equal
  /// to ignore_index is padding: it embeds to zeros and gets no gradient.
  /// grad_scale: multiplies d(loss_sum); pass 1 / (scored tokens of the whole
  /// optimizer step, over every micro-batch and rank) so gradients are those
  /// of the mean loss of the global batch.
  /// Returns the sum of token losses (nats) and the count scored.
  /// Throws config_error if T > max_seq, B or T < 1, or a token is outside [0, V).
  kernels::ce_result forward_backward(const std::int32_t* tokens, std::int64_t B, std::int64_t T,
                                      Acc grad_scale) {
    forward(tokens, B, T, /*windows=*/true);
    const std::int64_t H = cfg_.dim, N = B * T;
    tensor<Grad> dx(shape{N, H}, *mr_);
    kernels::ce_result r = kernels::lm_head_cross_entropy<Param, Grad>(
        final_xn_.data(), param("lm_head"), tokens, B, T, H, cfg_.vocab, opt_.ce_chunk, dx.data(),
        grad("lm_head"), grad_scale, opt_.ignore_index, *mr_);
    backward(dx);
    return r;
  }

  /// Forward only (evaluation): loss sum and count over the windows, no
  /// gradients touched. Same shapes and throws as forward_backward.
  kernels::ce_result forward_loss(const std::int32_t* tokens, std::int64_t B, std::int64_t T) {
    forward(tokens, B, T, /*windows=*/true);
    kernels::ce_result r = kernels::lm_head_cross_entropy<Param, Grad>(
        final_xn_.data(), param("lm_head"), tokens, B, T, cfg_.dim, cfg_.vocab, opt_.ce_chunk,
        static_cast<Grad*>(nullptr), static_cast<Grad*>(nullptr), Acc(0), opt_.ignore_index, *mr_);
    clear_activations();
    return r;
  }

  /// Next-token logits (V float32) after the sequence ids[0, T) (B = 1), for
  /// generation. Throws config_error if T > max_seq or an id is outside [0, V).
  void next_token_logits(const std::int32_t* ids, std::int64_t T, float* logits) {
    forward(ids, 1, T, /*windows=*/false);
    kernels::lm_head_logits<Param>(logits, final_xn_.data() + (T - 1) * cfg_.dim, param("lm_head"),
                                cfg_.dim, cfg_.vocab);
    clear_activations();
  }

  /// Bytes the forward pass saves for backward per token (all blocks plus the
  /// final norm), as this implementation stores them. The planner's formula.
  std::int64_t saved_bytes_per_token() const {
    const std::int64_t H = cfg_.dim, F = cfg_.ffn_dim, KV = cfg_.kv_dim();
    const std::int64_t per_block = static_cast<std::int64_t>(sizeof(Param)) * (6 * H + 2 * KV + 3 * F) +
                                   static_cast<std::int64_t>(sizeof(Acc)) * (2 + cfg_.n_heads);
    return cfg_.n_layers * per_block +
           static_cast<std::int64_t>(sizeof(Param)) * 2 * H + static_cast<std::int64_t>(sizeof(Acc)) +
           static_cast<std::int64_t>(sizeof(std::int32_t));
  }

  /// Pointer to parameter `name` inside the flat buffer.
  Param* param(const std::string& name) { return params_.data() + layout_.at(name).offset; }
  /// Pointer to the gradient of `name` inside the flat gradient buffer.
  Grad* grad(const std::string& name) { return grads_.data() + layout_.at(name).offset; }

private:
  // What one block's forward saves for its backward (shapes per token row).
  struct block_record {
    tensor<Param> x_in;    // (N, H) block input (residual stream)
    tensor<Acc> rstd1;   // (N)
    tensor<Param> xn1;     // (N, H)
    tensor<Param> q;       // (N, nh*hd) after RoPE
    tensor<Param> k, v;    // (N, nkv*hd), k after RoPE
    tensor<Param> att;     // (N, nh*hd) attention output
    tensor<Acc> lse;     // (B, nh, T)
    tensor<Param> x_mid;   // (N, H) after the attention residual
    tensor<Acc> rstd2;   // (N)
    tensor<Param> xn2;     // (N, H)
    tensor<Param> gate;    // (N, F)
    tensor<Param> up;      // (N, F)
    tensor<Param> h;       // (N, F) silu(gate) * up
  };
  struct block_ptrs {
    std::int64_t attn_norm, wq, wk, wv, wo, mlp_norm, w_gate, w_up, w_down;
  };

  const block_ptrs& block_offsets(int l) const { return blocks_[static_cast<std::size_t>(l)]; }

  block_ptrs find_block_offsets(int l) const {
    const std::string b = "blocks." + std::to_string(l) + ".";
    return {layout_.at(b + "attn_norm").offset, layout_.at(b + "attn.wq").offset,
            layout_.at(b + "attn.wk").offset,   layout_.at(b + "attn.wv").offset,
            layout_.at(b + "attn.wo").offset,   layout_.at(b + "mlp_norm").offset,
            layout_.at(b + "mlp.w_gate").offset, layout_.at(b + "mlp.w_up").offset,
            layout_.at(b + "mlp.w_down").offset};
  }

  void check_shapes(std::int64_t B, std::int64_t T) const {
    TESSERA_THROW_IF(B < 1, config_error, "micro-batch B=", B, " must be >= 1");
    TESSERA_THROW_IF(T < 1, config_error, "sequence length T=", T, " must be >= 1");
    TESSERA_THROW_IF(T > cfg_.max_seq, config_error, "sequence length T=", T,
                     " exceeds the model's max_seq=", cfg_.max_seq);
  }

  void clear_activations() {
    records_.clear();
    final_in_.release();
    final_xn_.release();
    final_rstd_.release();
    ids_.release();
  }

  // Runs embedding, the blocks and the final norm, saving what backward needs.
  // windows: tokens is (B, T+1) and inputs are the first T of each row;
  // otherwise tokens is (B, T) of inputs.
  void forward(const std::int32_t* tokens, std::int64_t B, std::int64_t T, bool windows) {
    check_shapes(B, T);
    clear_activations();
    B_ = B;
    T_len_ = T;
    const std::int64_t N = B * T, H = cfg_.dim, F = cfg_.ffn_dim, KV = cfg_.kv_dim();
    const std::int64_t nh = cfg_.n_heads, nkv = cfg_.n_kv_heads, hd = cfg_.head_dim();
    ids_ = tensor<std::int32_t>(shape{N}, *mr_);
    const std::int64_t stride = windows ? T + 1 : T;
    // An input equal to ignore_index is padding: it embeds to zeros and its
    // row receives no gradient (its own target is the next column).
    pad_rows_.clear();
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = 0; t < T; ++t) {
        std::int32_t id = tokens[b * stride + t];
        if (id == opt_.ignore_index) {
          pad_rows_.push_back(b * T + t);
          id = 0;
        }
        ids_[b * T + t] = id;
      }

    tensor<Param> x(shape{N, H}, *mr_);
    kernels::embedding_forward<Param>(x.data(), ids_.data(), param("embedding"), N, cfg_.vocab, H);
    for (std::int64_t row : pad_rows_)
      for (std::int64_t i = 0; i < H; ++i) x[row * H + i] = to<Param>(0.0);
    tensor<Param> proj(shape{N, H}, *mr_);
    records_.resize(static_cast<std::size_t>(cfg_.n_layers));
    for (int l = 0; l < static_cast<int>(cfg_.n_layers); ++l) {
      const block_ptrs& o = block_offsets(l);
      const Param* p = params_.data();
      block_record& r = records_[static_cast<std::size_t>(l)];
      r.x_in = std::move(x);
      r.rstd1 = tensor<Acc>(shape{N}, *mr_);
      r.xn1 = tensor<Param>(shape{N, H}, *mr_);
      kernels::rmsnorm_forward<Param>(r.xn1.data(), r.rstd1.data(), r.x_in.data(), p + o.attn_norm, N,
                                  H, cfg_.norm_eps);
      r.q = tensor<Param>(shape{N, H}, *mr_);
      r.k = tensor<Param>(shape{N, KV}, *mr_);
      r.v = tensor<Param>(shape{N, KV}, *mr_);
      kernels::linear_forward<Param>(r.q.data(), r.xn1.data(), p + o.wq, N, H, H);
      kernels::linear_forward<Param>(r.k.data(), r.xn1.data(), p + o.wk, N, KV, H);
      kernels::linear_forward<Param>(r.v.data(), r.xn1.data(), p + o.wv, N, KV, H);
      kernels::rope_forward<Param>(r.q.data(), rope_cos_.data(), rope_sin_.data(), B, T, nh, hd);
      kernels::rope_forward<Param>(r.k.data(), rope_cos_.data(), rope_sin_.data(), B, T, nkv, hd);
      r.att = tensor<Param>(shape{N, H}, *mr_);
      r.lse = tensor<Acc>(shape{B, nh, T}, *mr_);
      kernels::attention_forward<Param>(r.att.data(), r.lse.data(), r.q.data(), r.k.data(), r.v.data(),
                                    B, T, nh, nkv, hd, opt_.tiles, *mr_);
      kernels::linear_forward<Param>(proj.data(), r.att.data(), p + o.wo, N, H, H);
      r.x_mid = tensor<Param>(shape{N, H}, *mr_);
      kernels::residual_add<Param>(r.x_mid.data(), r.x_in.data(), proj.data(), N * H);
      r.rstd2 = tensor<Acc>(shape{N}, *mr_);
      r.xn2 = tensor<Param>(shape{N, H}, *mr_);
      kernels::rmsnorm_forward<Param>(r.xn2.data(), r.rstd2.data(), r.x_mid.data(), p + o.mlp_norm, N,
                                  H, cfg_.norm_eps);
      r.gate = tensor<Param>(shape{N, F}, *mr_);
      r.up = tensor<Param>(shape{N, F}, *mr_);
      r.h = tensor<Param>(shape{N, F}, *mr_);
      kernels::linear_forward<Param>(r.gate.data(), r.xn2.data(), p + o.w_gate, N, F, H);
      kernels::linear_forward<Param>(r.up.data(), r.xn2.data(), p + o.w_up, N, F, H);
      kernels::swiglu_forward<Param>(r.h.data(), r.gate.data(), r.up.data(), N * F);
      kernels::linear_forward<Param>(proj.data(), r.h.data(), p + o.w_down, N, H, F);
      x = tensor<Param>(shape{N, H}, *mr_);
      kernels::residual_add<Param>(x.data(), r.x_mid.data(), proj.data(), N * H);
    }
    final_in_ = std::move(x);
    final_rstd_ = tensor<Acc>(shape{N}, *mr_);
    final_xn_ = tensor<Param>(shape{N, H}, *mr_);
    kernels::rmsnorm_forward<Param>(final_xn_.data(), final_rstd_.data(), final_in_.data(),
                                param("final_norm"), N, H, cfg_.norm_eps);
  }

  // Consumes the records in reverse. dxf: (N, H) gradient of the final norm's output.
  void backward(tensor<Grad>& dxf) {
    const std::int64_t B = B_, T = T_len_, N = B * T, H = cfg_.dim, F = cfg_.ffn_dim,
                       KV = cfg_.kv_dim();
    const std::int64_t nh = cfg_.n_heads, nkv = cfg_.n_kv_heads, hd = cfg_.head_dim();
    tensor<Grad> dres(shape{N, H}, *mr_);  // gradient of the residual stream
    kernels::rmsnorm_backward<Param, Grad>(dres.data(), grad("final_norm"), dxf.data(), final_in_.data(),
                                    param("final_norm"), final_rstd_.data(), N, H, false);
    final_in_.release();
    final_xn_.release();
    final_rstd_.release();
    dxf.release();
    tensor<Grad> dxn(shape{N, H}, *mr_), datt(shape{N, H}, *mr_);
    tensor<Grad> dq(shape{N, H}, *mr_), dk(shape{N, KV}, *mr_), dv(shape{N, KV}, *mr_);
    tensor<Grad> dh(shape{N, F}, *mr_), dgate(shape{N, F}, *mr_), dup(shape{N, F}, *mr_);
    for (int l = static_cast<int>(cfg_.n_layers) - 1; l >= 0; --l) {
      const block_ptrs& o = block_offsets(l);
      const Param* p = params_.data();
      Grad* g = grads_.data();
      block_record& r = records_[static_cast<std::size_t>(l)];
      // MLP: y = x_mid + h Wd^T
      kernels::linear_backward_input<Param, Grad>(dh.data(), dres.data(), p + o.w_down, N, H, F);
      kernels::linear_backward_weight<Param, Grad>(g + o.w_down, dres.data(), r.h.data(), N, H, F);
      kernels::swiglu_backward<Param, Grad>(dgate.data(), dup.data(), dh.data(), r.gate.data(),
                                     r.up.data(), N * F);
      kernels::linear_backward_input<Param, Grad>(dxn.data(), dgate.data(), p + o.w_gate, N, F, H);
      kernels::linear_backward_input<Param, Grad>(dxn.data(), dup.data(), p + o.w_up, N, F, H, true);
      kernels::linear_backward_weight<Param, Grad>(g + o.w_gate, dgate.data(), r.xn2.data(), N, F, H);
      kernels::linear_backward_weight<Param, Grad>(g + o.w_up, dup.data(), r.xn2.data(), N, F, H);
      kernels::rmsnorm_backward<Param, Grad>(dres.data(), g + o.mlp_norm, dxn.data(), r.x_mid.data(),
                                      p + o.mlp_norm, r.rstd2.data(), N, H, true);
      r.h.release();
      r.gate.release();
      r.up.release();
      r.xn2.release();
      r.x_mid.release();
      r.rstd2.release();
      // Attention: x_mid = x_in + att Wo^T
      kernels::linear_backward_input<Param, Grad>(datt.data(), dres.data(), p + o.wo, N, H, H);
      kernels::linear_backward_weight<Param, Grad>(g + o.wo, dres.data(), r.att.data(), N, H, H);
      kernels::attention_backward<Param, Grad>(dq.data(), dk.data(), dv.data(), datt.data(), r.q.data(),
                                        r.k.data(), r.v.data(), r.att.data(), r.lse.data(), B, T,
                                        nh, nkv, hd, opt_.tiles, *mr_);
      kernels::rope_backward<Grad>(dq.data(), rope_cos_.data(), rope_sin_.data(), B, T, nh, hd);
      kernels::rope_backward<Grad>(dk.data(), rope_cos_.data(), rope_sin_.data(), B, T, nkv, hd);
      kernels::linear_backward_input<Param, Grad>(dxn.data(), dq.data(), p + o.wq, N, H, H);
      kernels::linear_backward_input<Param, Grad>(dxn.data(), dk.data(), p + o.wk, N, KV, H, true);
      kernels::linear_backward_input<Param, Grad>(dxn.data(), dv.data(), p + o.wv, N, KV, H, true);
      kernels::linear_backward_weight<Param, Grad>(g + o.wq, dq.data(), r.xn1.data(), N, H, H);
      kernels::linear_backward_weight<Param, Grad>(g + o.wk, dk.data(), r.xn1.data(), N, KV, H);
      kernels::linear_backward_weight<Param, Grad>(g + o.wv, dv.data(), r.xn1.data(), N, KV, H);
      kernels::rmsnorm_backward<Param, Grad>(dres.data(), g + o.attn_norm, dxn.data(), r.x_in.data(),
                                      p + o.attn_norm, r.rstd1.data(), N, H, true);
      records_.pop_back();
    }
    for (std::int64_t row : pad_rows_)
      for (std::int64_t i = 0; i < H; ++i) dres[row * H + i] = Grad(0);
    kernels::embedding_backward<Grad>(grad("embedding"), dres.data(), ids_.data(), N, cfg_.vocab, H);
    ids_.release();
  }

  llama_config cfg_;
  llama_options opt_;
  param_layout layout_;
  memory_resource* mr_;
  tensor<Param> params_;
  tensor<Grad> grads_;
  tensor<float> rope_cos_, rope_sin_;
  std::vector<block_ptrs> blocks_;  // offsets of each block's tensors
  std::vector<block_record> records_;
  tensor<Param> final_in_, final_xn_;
  tensor<Acc> final_rstd_;
  tensor<std::int32_t> ids_;
  std::vector<std::int64_t> pad_rows_;  // input rows holding ignore_index (padding)
  std::int64_t B_ = 0, T_len_ = 0;
};

}  // namespace tessera::nn
