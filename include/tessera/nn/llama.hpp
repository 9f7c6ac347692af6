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
/// Model: embedding -> L blocks (nn/transformer_block.hpp) -> final rmsnorm
/// -> LM head + cross-entropy (fused, chunked over tokens).
///
/// Segments and hooks (nn/segment_hooks.hpp): the flat buffer is tiled by
/// segments -1 (embedding), 0..L-1 (blocks), L (final norm + LM head). The
/// model reads segment s's parameters from `segment_params(s)`, which is the
/// segment's place in the flat buffer unless a strategy points it elsewhere
/// (set_segment_params; ZeRO-3 points it at a gathered copy and builds the
/// model with `llama_options::external_params`, so no full parameter buffer
/// exists). Gradients likewise go to `segment_grads(s)`, the segment's place
/// in the flat gradient buffer unless a strategy points it elsewhere
/// (set_segment_grads; ZeRO-2/3 point each segment at its bucket's gradient
/// buffer, which lives only through the accumulation window, and build the
/// model with `llama_options::external_grads`, so no full gradient buffer
/// exists).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/core/random.hpp"
#include "tessera/core/tensor.hpp"
#include "tessera/kernels/cross_entropy.hpp"
#include "tessera/kernels/embedding.hpp"
#include "tessera/kernels/rmsnorm.hpp"
#include "tessera/kernels/rope.hpp"
#include "tessera/nn/llama_config.hpp"
#include "tessera/nn/llama_layout.hpp"
#include "tessera/nn/param_layout.hpp"
#include "tessera/nn/segment_hooks.hpp"
#include "tessera/nn/transformer_block.hpp"
#include "tessera/precision/policy.hpp"

namespace tessera::nn {

/// Options of a model instance that are not model sizes.
struct llama_options {
  std::int64_t ce_chunk = 256;       ///< token rows per LM-head/cross-entropy chunk
  kernels::attention_tiles tiles{};  ///< attention tile sizes
  std::int32_t ignore_index = -100;  ///< target id that is not scored
  /// Do not allocate the flat parameter buffer: params() is null and a
  /// strategy must point every segment at its parameters
  /// (set_segment_params) before the model reads them (ZeRO-3).
  bool external_params = false;
  /// Do not allocate the flat gradient buffer: grads() is null and a
  /// strategy must point every segment at its gradients
  /// (set_segment_grads) before a backward pass writes them (ZeRO-2/3).
  bool external_grads = false;
};

/// Llama model over flat parameter (`param_type`) and gradient (`grad_type`)
/// buffers, with precision policy `P`. Not thread-safe; one instance per rank.
template <precision::policy P>
class llama {
 public:
  using Param = typename P::param_type;
  using Grad = typename P::grad_type;
  using Acc = typename P::accum_type;

  /// Allocates parameters (unless opt.external_params) and gradients
  /// (uninitialised; call init_weights) and the RoPE tables from `mr`.
  /// Throws config_error for an invalid config.
  explicit llama(llama_config cfg, llama_options opt = {},
                 memory_resource& mr = host::default_resource())
      : cfg_(std::move(cfg)), opt_(opt), layout_(make_llama_layout(cfg_)), mr_(&mr) {
    TESSERA_THROW_IF(opt_.ce_chunk < 1, config_error, "ce_chunk=", opt_.ce_chunk, " must be >= 1");
    const int L = static_cast<int>(cfg_.n_layers);
    seg_begin_.push_back(0);
    for (int l = 0; l < L; ++l)
      seg_begin_.push_back(layout_.at("blocks." + std::to_string(l) + ".attn_norm").offset);
    seg_begin_.push_back(layout_.at("final_norm").offset);
    seg_begin_.push_back(layout_.total());
    for (int l = 0; l < L; ++l) blocks_.push_back(block_offsets::of(layout_, l, segment_begin(l)));
    if (!opt_.external_params) {
      params_ = tensor<Param>(shape{layout_.total()}, mr);
      params_.zero();
    }
    if (!opt_.external_grads) {
      grads_ = tensor<Grad>(shape{layout_.total()}, mr);
      grads_.zero();
    }
    seg_params_.assign(static_cast<std::size_t>(L + 2), nullptr);
    seg_grads_.assign(static_cast<std::size_t>(L + 2), nullptr);
    if (!opt_.external_params)
      for (int s = -1; s <= L; ++s) set_segment_params(s, params_.data() + segment_begin(s));
    reset_segment_grads();
    const std::int64_t half = cfg_.head_dim() / 2;
    rope_cos_ = tensor<float>(shape{cfg_.max_seq, half}, mr);
    rope_sin_ = tensor<float>(shape{cfg_.max_seq, half}, mr);
    kernels::rope_table(rope_cos_.data(), rope_sin_.data(), cfg_.max_seq, cfg_.head_dim(),
                        cfg_.rope_theta);
  }

  const llama_config& config() const { return cfg_; }
  const param_layout& layout() const { return layout_; }
  /// Flat parameter buffer, (layout().total()) elements of param_type;
  /// nullptr with llama_options::external_params.
  Param* params() { return params_.data(); }
  const Param* params() const { return params_.data(); }
  /// Flat gradient buffer, same offsets, grad_type; nullptr with
  /// llama_options::external_grads.
  Grad* grads() { return grads_.data(); }
  const Grad* grads() const { return grads_.data(); }
  std::int64_t num_params() const { return layout_.num_params(); }
  /// RoPE tables (max_seq, hd/2), float32 whatever param_type is.
  const float* rope_cos() const { return rope_cos_.data(); }
  const float* rope_sin() const { return rope_sin_.data(); }

  /// Segments: -1 embedding, 0..L-1 blocks, L head (nn/segment_hooks.hpp).
  int first_segment() const { return -1; }
  int last_segment() const { return static_cast<int>(cfg_.n_layers); }
  /// Flat offset of segment s's first element; segment s is
  /// [segment_begin(s), segment_end(s)), and the segments tile [0, total()).
  std::int64_t segment_begin(int s) const { return seg_begin_[seg(s)]; }
  std::int64_t segment_end(int s) const { return seg_begin_[seg(s) + 1]; }
  /// Where the model reads segment s's parameters: `p` holds
  /// segment_end(s) - segment_begin(s) elements in flat-buffer order. Not
  /// owned; must stay valid and unchanged while the model reads it.
  void set_segment_params(int s, const Param* p) { seg_params_[seg(s)] = p; }
  const Param* segment_params(int s) const { return seg_params_[seg(s)]; }
  /// Where backward accumulates (+=) segment s's parameter gradients: `g`
  /// holds segment_end(s) - segment_begin(s) elements in flat-buffer order.
  /// Not owned; must stay valid while a backward pass writes it.
  void set_segment_grads(int s, Grad* g) { seg_grads_[seg(s)] = g; }
  Grad* segment_grads(int s) const { return seg_grads_[seg(s)]; }
  /// Points every segment back at its place in the flat gradient buffer
  /// (nullptr with external_grads).
  void reset_segment_grads() {
    for (int s = first_segment(); s <= last_segment(); ++s)
      set_segment_grads(s, grads_.empty() ? nullptr : grads_.data() + segment_begin(s));
  }
  /// Installs per-segment hooks (nullptr: none). Not owned.
  void set_hooks(segment_hooks* h) { hooks_ = h; }

  /// Deterministic initialisation from `seed`: matrices ~ N(0, 0.02^2), the
  /// residual output projections (wo, w_down) scaled by 1/sqrt(2L) (GPT-2,
  /// Radford et al. 2019), norm gains 1. Each tensor draws from its own
  /// stream (seed, tensor index), so the values do not depend on the layout.
  /// Throws config_error with external_params (use init_weights_range).
  void init_weights(std::uint64_t seed) {
    TESSERA_THROW_IF(params_.empty(), config_error,
                     "init_weights: the model has external parameters; use init_weights_range");
    init_weights_range(seed, 0, layout_.total(), params_.data());
  }

  /// The same values as init_weights(seed), for flat elements [lo, hi) only:
  /// out[i - lo] for i in [lo, hi); alignment padding is set to 0. A shard
  /// under ZeRO initialises itself without building the full buffer.
  /// Precondition: 0 <= lo <= hi <= layout().total(); out holds hi - lo.
  void init_weights_range(std::uint64_t seed, std::int64_t lo, std::int64_t hi, Param* out) const {
    init_llama_weights_range(cfg_, layout_, seed, lo, hi, out);
  }

  /// Sets every gradient to zero: the flat buffer, or with external_grads
  /// every segment whose gradients are set.
  void zero_grad() {
    if (!grads_.empty()) {
      grads_.zero();
      return;
    }
    for (int s = first_segment(); s <= last_segment(); ++s)
      if (Grad* g = segment_grads(s))
        for (std::int64_t i = 0; i < segment_end(s) - segment_begin(s); ++i) g[i] = Grad(0);
  }

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
        final_xn_.data(), head_param("lm_head"), tokens, B, T, H, cfg_.vocab, opt_.ce_chunk,
        dx.data(), seg_grad("lm_head"), grad_scale, opt_.ignore_index, *mr_);
    backward(dx);
    return r;
  }

  /// Forward only (evaluation): loss sum and count over the windows, no
  /// gradients touched. Same shapes and throws as forward_backward.
  kernels::ce_result forward_loss(const std::int32_t* tokens, std::int64_t B, std::int64_t T) {
    forward(tokens, B, T, /*windows=*/true);
    kernels::ce_result r = kernels::lm_head_cross_entropy<Param, Grad>(
        final_xn_.data(), head_param("lm_head"), tokens, B, T, cfg_.dim, cfg_.vocab, opt_.ce_chunk,
        static_cast<Grad*>(nullptr), static_cast<Grad*>(nullptr), Acc(0), opt_.ignore_index, *mr_);
    hook(&segment_hooks::after_forward, last_segment());
    clear_activations();
    return r;
  }

  /// Next-token logits (V float32) after the sequence ids[0, T) (B = 1), for
  /// generation. Throws config_error if T > max_seq or an id is outside [0, V).
  void next_token_logits(const std::int32_t* ids, std::int64_t T, float* logits) {
    forward(ids, 1, T, /*windows=*/false);
    kernels::lm_head_logits<Param>(logits, final_xn_.data() + (T - 1) * cfg_.dim,
                                   head_param("lm_head"), cfg_.dim, cfg_.vocab);
    hook(&segment_hooks::after_forward, last_segment());
    clear_activations();
  }

  /// Bytes the forward pass saves for backward per token (all blocks plus the
  /// final norm), as this implementation stores them. The planner's formula.
  std::int64_t saved_bytes_per_token() const {
    const std::int64_t H = cfg_.dim, F = cfg_.ffn_dim, KV = cfg_.kv_dim();
    const std::int64_t per_block =
        static_cast<std::int64_t>(sizeof(Param)) * (6 * H + 2 * KV + 3 * F) +
        static_cast<std::int64_t>(sizeof(Acc)) * (2 + cfg_.n_heads);
    return cfg_.n_layers * per_block + static_cast<std::int64_t>(sizeof(Param)) * 2 * H +
           static_cast<std::int64_t>(sizeof(Acc)) + static_cast<std::int64_t>(sizeof(std::int32_t));
  }

  /// Pointer to parameter `name` inside the flat buffer. Throws config_error
  /// with external_params.
  Param* param(const std::string& name) {
    TESSERA_THROW_IF(params_.empty(), config_error, "param('", name,
                     "'): the model has external parameters (ZeRO-3); no flat buffer");
    return params_.data() + layout_.at(name).offset;
  }
  /// Pointer to the gradient of `name` inside the flat gradient buffer.
  /// Throws config_error with external_grads.
  Grad* grad(const std::string& name) {
    TESSERA_THROW_IF(grads_.empty(), config_error, "grad('", name,
                     "'): the model has external gradients (ZeRO-2/3); no flat buffer");
    return grads_.data() + layout_.at(name).offset;
  }

 private:
  std::size_t seg(int s) const {
    TESSERA_EXPECTS(s >= -1 && s <= static_cast<int>(cfg_.n_layers), "segment id out of range");
    return static_cast<std::size_t>(s + 1);
  }
  void hook(void (segment_hooks::*fn)(int), int s) {
    if (hooks_) (hooks_->*fn)(s);
  }
  // Parameter `name` of the embedding or head segment, via the segment table.
  const Param* head_param(const std::string& name) const {
    const std::int64_t off = layout_.at(name).offset;
    const int s = off < segment_begin(0) ? -1 : last_segment();
    const Param* base = segment_params(s);
    TESSERA_THROW_IF(base == nullptr, error, "segment ", s, " has no parameters set (", name, ")");
    return base + (off - segment_begin(s));
  }
  // Gradient of parameter `name` of the embedding or head segment, via the
  // segment table.
  Grad* seg_grad(const std::string& name) const {
    const std::int64_t off = layout_.at(name).offset;
    const int s = off < segment_begin(0) ? -1 : last_segment();
    Grad* base = segment_grads(s);
    TESSERA_THROW_IF(base == nullptr, error, "segment ", s, " has no gradients set (", name, ")");
    return base + (off - segment_begin(s));
  }
  Grad* block_grads(int l) const {
    Grad* g = segment_grads(l);
    TESSERA_THROW_IF(g == nullptr, error, "segment ", l, " (block ", l, ") has no gradients set");
    return g;
  }
  const Param* block_params(int l) const {
    const Param* p = segment_params(l);
    TESSERA_THROW_IF(p == nullptr, error, "segment ", l, " (block ", l, ") has no parameters set");
    return p;
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

  block_dims dims() const {
    return block_dims::of(cfg_, B_, T_len_, opt_.tiles, rope_cos_.data(), rope_sin_.data(), *mr_);
  }

  // Runs embedding, the blocks and the final norm, saving what backward needs.
  // windows: tokens is (B, T+1) and inputs are the first T of each row;
  // otherwise tokens is (B, T) of inputs. Leaves the head segment acquired
  // (before_forward(L) called); the caller ends it.
  void forward(const std::int32_t* tokens, std::int64_t B, std::int64_t T, bool windows) {
    check_shapes(B, T);
    clear_activations();
    B_ = B;
    T_len_ = T;
    const std::int64_t N = B * T, H = cfg_.dim;
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
    hook(&segment_hooks::before_forward, -1);
    kernels::embedding_forward<Param>(x.data(), ids_.data(), head_param("embedding"), N, cfg_.vocab,
                                      H);
    hook(&segment_hooks::after_forward, -1);
    for (std::int64_t row : pad_rows_)
      for (std::int64_t i = 0; i < H; ++i) x[row * H + i] = to<Param>(0.0);
    tensor<Param> proj(shape{N, H}, *mr_);
    const block_dims d = dims();
    records_.resize(static_cast<std::size_t>(cfg_.n_layers));
    for (int l = 0; l < static_cast<int>(cfg_.n_layers); ++l) {
      hook(&segment_hooks::before_forward, l);
      block_forward<P>(records_[static_cast<std::size_t>(l)], x, block_params(l),
                       blocks_[static_cast<std::size_t>(l)], d, proj);
      hook(&segment_hooks::after_forward, l);
    }
    hook(&segment_hooks::before_forward, last_segment());
    final_in_ = std::move(x);
    final_rstd_ = tensor<Acc>(shape{N}, *mr_);
    final_xn_ = tensor<Param>(shape{N, H}, *mr_);
    kernels::rmsnorm_forward<Param>(final_xn_.data(), final_rstd_.data(), final_in_.data(),
                                    head_param("final_norm"), N, H, cfg_.norm_eps);
  }

  // Consumes the records in reverse. dxf: (N, H) gradient of the final norm's output.
  void backward(tensor<Grad>& dxf) {
    const std::int64_t N = B_ * T_len_, H = cfg_.dim;
    tensor<Grad> dres(shape{N, H}, *mr_);  // gradient of the residual stream
    kernels::rmsnorm_backward<Param, Grad>(dres.data(), seg_grad("final_norm"), dxf.data(),
                                           final_in_.data(), head_param("final_norm"),
                                           final_rstd_.data(), N, H, false);
    final_in_.release();
    final_xn_.release();
    final_rstd_.release();
    dxf.release();
    hook(&segment_hooks::after_backward, last_segment());
    const block_dims d = dims();
    block_grad_scratch<P> scratch(d);
    for (int l = static_cast<int>(cfg_.n_layers) - 1; l >= 0; --l) {
      hook(&segment_hooks::before_backward, l);
      block_backward<P>(records_[static_cast<std::size_t>(l)], dres, block_params(l),
                        block_grads(l), blocks_[static_cast<std::size_t>(l)], d,
                        scratch);
      records_.pop_back();
      hook(&segment_hooks::after_backward, l);
    }
    hook(&segment_hooks::before_backward, -1);
    for (std::int64_t row : pad_rows_)
      for (std::int64_t i = 0; i < H; ++i) dres[row * H + i] = Grad(0);
    kernels::embedding_backward<Grad>(seg_grad("embedding"), dres.data(), ids_.data(), N, cfg_.vocab,
                                      H);
    ids_.release();
    hook(&segment_hooks::after_backward, -1);
  }

  llama_config cfg_;
  llama_options opt_;
  param_layout layout_;
  memory_resource* mr_;
  tensor<Param> params_;  // (total) flat parameters; empty with external_params
  tensor<Grad> grads_;    // (total) flat gradients; empty with external_grads
  tensor<float> rope_cos_, rope_sin_;
  std::vector<std::int64_t> seg_begin_;   // L+3 boundaries: segment s is [s+1], [s+2]
  std::vector<const Param*> seg_params_;  // L+2: where segment s's parameters are read
  std::vector<Grad*> seg_grads_;          // L+2: where segment s's gradients accumulate
  segment_hooks* hooks_ = nullptr;
  std::vector<block_offsets> blocks_;  // offsets of each block's tensors in its segment
  std::vector<block_record<P>> records_;
  tensor<Param> final_in_, final_xn_;
  tensor<Acc> final_rstd_;
  tensor<std::int32_t> ids_;
  std::vector<std::int64_t> pad_rows_;  // input rows holding ignore_index (padding)
  std::int64_t B_ = 0, T_len_ = 0;
};

}  // namespace tessera::nn
