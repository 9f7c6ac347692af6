#pragma once
/// \file nn/cuda_llama.hpp
/// The Llama decoder of nn/llama.hpp on one GPU: bf16 weights and
/// activations, float32 gradients, every GEMM through cuBLASLt (bf16
/// operands, float32 accumulation), causal flash attention with
/// grouped-query heads, the LM head fused with cross-entropy in chunks, and
/// activation checkpointing (nn/checkpointing.hpp).
///
/// Same parameter layout and initial weights as the host model
/// (nn/llama_layout.hpp), the same gradient contract (parameter gradients
/// accumulate, +=, across micro-batches; zero_grad() clears them) and the
/// same loss (sum of -log p over scored targets, scaled by `grad_scale` in
/// the gradients). Activation gradients are bf16 (cuBLASLt takes bf16
/// operands only); parameter gradients are float32 (the weight-gradient
/// GEMMs accumulate with beta = 1).
///
/// Memory: every buffer is allocated at construction for a fixed
/// micro-batch (B, T), from the device caching allocator, on the model's
/// stream; plan::plan_cuda_step (plan/cuda_step.hpp) lists them and
/// predicts the total to the byte.
///
/// Streams: all work is enqueued on the stream given at construction;
/// nothing synchronises the host except init_weights, load_params and
/// copy_params_to_host. NVTX ranges name every phase ("forward block 3",
/// "backward block 3", "recompute block 3", "lm head + cross-entropy").
///
/// Plain C++ (compiled by g++ against the CUDA runtime headers); link
/// tessera::cuda_kernels.

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "tessera/core/cuda.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/core/nvtx.hpp"
#include "tessera/core/tensor.hpp"
#include "tessera/kernels/cuda/attention.hpp"
#include "tessera/kernels/cuda/cross_entropy.hpp"
#include "tessera/kernels/cuda/gemm.cuh"
#include "tessera/kernels/cuda/kernels.hpp"
#include "tessera/kernels/rope.hpp"
#include "tessera/nn/checkpointing.hpp"
#include "tessera/nn/llama_config.hpp"
#include "tessera/nn/llama_layout.hpp"
#include "tessera/plan/cuda_step.hpp"

namespace tessera::nn {

/// Options of a cuda_llama that are not model sizes.
struct cuda_llama_options {
  /// Token rows per LM-head/cross-entropy chunk: the float32 logits block
  /// is ce_chunk x V x 4 bytes (128 MiB at 1024 x 32000).
  std::int64_t ce_chunk = 1024;
  std::int32_t ignore_index = -100;  ///< target id that is not scored
  activation_checkpointing checkpointing = activation_checkpointing::full;
  /// cuBLASLt workspace bytes (NVIDIA's recommendation for Hopper: 32 MiB).
  std::size_t cublaslt_workspace = std::size_t(32) << 20;
};

/// A Llama on one GPU for micro-batches of B sequences of T tokens.
/// Not thread-safe; one instance per GPU and stream.
class cuda_llama {
 public:
  using Param = bf16;  ///< weights and activations
  using Grad = float;  ///< parameter gradients
  using Act = bf16;    ///< activation gradients

  /// Builds the model for micro-batches (B, T) on `stream` (not owned; must
  /// outlive the model), allocating every buffer now from `mr` on that
  /// stream (stream-ordered reuse). Weights are uninitialised: call
  /// init_weights or load_params. Gradients are zero.
  /// Throws config_error for an invalid config, B or T < 1, T > max_seq,
  /// ce_chunk < 1, or a head dimension the flash-attention kernels do not
  /// support; tessera::error naming the request if the device runs out of
  /// memory (the caching allocator's message); cuda_error for a CUDA or
  /// cuBLASLt failure.
  cuda_llama(llama_config cfg, std::int64_t B, std::int64_t T, cuda_llama_options opt,
             cudaStream_t stream, cuda_caching_resource& mr = tessera::cuda::resource(
                                                              tessera::cuda::current_device()))
      : cfg_(std::move(cfg)),
        opt_(opt),
        layout_(make_llama_layout(cfg_)),
        B_(B),
        T_(T),
        stream_(stream),
        mr_(mr, stream),
        ctx_(opt.cublaslt_workspace, mr_) {
    TESSERA_THROW_IF(B < 1, config_error, "cuda_llama: micro-batch B=", B, " must be >= 1");
    TESSERA_THROW_IF(T < 1 || T > cfg_.max_seq, config_error, "cuda_llama: sequence length T=", T,
                     " must be in [1, max_seq=", cfg_.max_seq, "]");
    TESSERA_THROW_IF(opt_.ce_chunk < 1, config_error, "cuda_llama: ce_chunk=", opt_.ce_chunk,
                     " must be >= 1");
    const std::int64_t hd = cfg_.head_dim();
    TESSERA_THROW_IF(!kernels::cuda::attention_supported_hd(hd), config_error,
                     "cuda_llama: head dimension ", hd, " (dim ", cfg_.dim, " / n_heads ",
                     cfg_.n_heads, ") is not supported by the flash-attention kernels");
    for (int l = 0; l < static_cast<int>(cfg_.n_layers); ++l) blocks_.push_back(offsets_of(l));
    const std::int64_t P = layout_.total(), N = B * T, H = cfg_.dim, KV = cfg_.kv_dim(),
                       F = cfg_.ffn_dim, L = cfg_.n_layers;
    params_ = dev<Param>(P);
    grads_ = dev<Grad>(P);
    zero_grad();
    // RoPE tables: the host's float32 tables, copied once.
    const std::int64_t half = hd / 2;
    std::vector<float> cos(static_cast<std::size_t>(cfg_.max_seq * half)), sin(cos.size());
    kernels::rope_table(cos.data(), sin.data(), cfg_.max_seq, hd, cfg_.rope_theta);
    rope_cos_ = dev<float>(cfg_.max_seq * half);
    rope_sin_ = dev<float>(cfg_.max_seq * half);
    tessera::cuda::copy_from_host(rope_cos_.data(), cos.data(), cos.size() * sizeof(float),
                                  stream_);
    tessera::cuda::copy_from_host(rope_sin_.data(), sin.data(), sin.size() * sizeof(float),
                                  stream_);
    // Activations.
    const bool full = opt_.checkpointing == activation_checkpointing::full;
    records_.resize(static_cast<std::size_t>(L));
    for (auto& r : records_) {
      r.x_in = dev<Param>(N * H);
      if (!full) allocate_record(r);
    }
    if (full) allocate_record(work_);
    final_in_ = dev<Param>(N * H);
    final_xn_ = dev<Param>(N * H);
    final_rstd_ = dev<float>(N);
    proj_ = dev<Param>(N * H);
    dres_ = dev<Act>(N * H);
    datt_ = dev<Act>(N * H);
    dxn_ = dev<Act>(N * H);
    dq_ = dev<Act>(N * H);
    dk_ = dev<Act>(N * KV);
    dv_ = dev<Act>(N * KV);
    dh_ = dev<Act>(N * F);
    dup_ = dev<Act>(N * F);
    scratch_bytes_ = plan::cuda_kernel_scratch_bytes(cfg_, B, T, opt_.ce_chunk);
    scratch_ = dev<std::uint8_t>(static_cast<std::int64_t>(scratch_bytes_));
  }

  /// Waits for the model's stream, so no queued kernel still uses a buffer
  /// that returns to the allocator (whose cache is keyed by stream handle).
  ~cuda_llama() { (void)cudaStreamSynchronize(stream_); }
  cuda_llama(const cuda_llama&) = delete;
  cuda_llama& operator=(const cuda_llama&) = delete;

  const llama_config& config() const { return cfg_; }
  const param_layout& layout() const { return layout_; }
  /// Real parameters (without alignment padding).
  std::int64_t num_params() const { return layout_.num_params(); }
  const cuda_llama_options& options() const { return opt_; }
  std::int64_t micro_batch() const { return B_; }
  std::int64_t seq() const { return T_; }
  cudaStream_t stream() const { return stream_; }
  /// Flat bf16 weights (layout().total() elements, device).
  Param* params() { return params_.data(); }
  const Param* params() const { return params_.data(); }
  /// Flat float32 gradients (layout().total() elements, device).
  Grad* grads() { return grads_.data(); }
  const Grad* grads() const { return grads_.data(); }
  /// The cuBLASLt context of the model's stream.
  kernels::cuda::cublaslt_context& blas() { return ctx_; }

  /// The host model's initial weights (init_llama_weights_range, the same
  /// values as nn::llama<bf16_mixed>::init_weights(seed)), generated on the
  /// host one tensor per OpenMP thread and copied in. Synchronises.
  void init_weights(std::uint64_t seed) {
    const auto& es = layout_.entries();
    std::vector<Param> h(static_cast<std::size_t>(layout_.total()), to<Param>(0.0));
    const auto n = static_cast<std::int64_t>(es.size());
#pragma omp parallel for schedule(dynamic, 1)
    for (std::int64_t i = 0; i < n; ++i) {
      const auto& e = es[static_cast<std::size_t>(i)];
      init_llama_weights_range(cfg_, layout_, seed, e.offset, e.offset + e.numel,
                               h.data() + e.offset);
    }
    load_params(h.data());
  }

  /// Copies layout().total() bf16 weights from the host. Synchronises.
  void load_params(const Param* host) {
    tessera::cuda::copy_from_host(params_.data(), host,
                                  static_cast<std::size_t>(layout_.total()) * sizeof(Param),
                                  stream_);
  }
  /// Copies the weights to the host (layout().total() elements). Synchronises.
  void copy_params_to_host(Param* host) const {
    tessera::cuda::copy_to_host(host, params_.data(),
                                static_cast<std::size_t>(layout_.total()) * sizeof(Param),
                                stream_);
  }

  /// Sets every gradient to zero (enqueued on the stream).
  void zero_grad() {
    TESSERA_CUDA_CHECK(cudaMemsetAsync(grads_.data(), 0,
                                       static_cast<std::size_t>(layout_.total()) * sizeof(Grad),
                                       stream_));
  }

  /// Forward and backward of one micro-batch, enqueued on the stream.
  /// - `d_inputs`, `d_targets`: (B, T) int32 on the device. Inputs must lie
  ///   in [0, V) or equal ignore_index (padding: embeds to zeros, no
  ///   gradient); targets equal to ignore_index are not scored. The device
  ///   does not check ids (the loader does, on the host).
  /// - `*d_loss` (one double, device) is written: the sum over scored
  ///   positions of -log p(target).
  /// - Parameter gradients accumulate (+=) grad_scale * d(loss sum)/dparams;
  ///   grad_scale is 1 / (scored tokens of the whole optimizer step).
  void forward_backward(const std::int32_t* d_inputs, const std::int32_t* d_targets,
                        double* d_loss, float grad_scale) {
    forward(d_inputs);
    {
      TESSERA_NVTX_RANGE("lm head + cross-entropy");
      kernels::cuda::lm_head_cross_entropy(ctx_, d_loss, final_xn_.data(), param("lm_head"),
                                           d_targets, N(), cfg_.vocab, cfg_.dim, opt_.ignore_index,
                                           grad_scale, datt_.data(), grad("lm_head"),
                                           opt_.ce_chunk, scratch_.data(), scratch_bytes_,
                                           stream_);
    }
    backward(d_inputs, datt_.data());
  }

  /// Forward only (evaluation): `*d_loss` = the sum of -log p over scored
  /// targets. Gradients are untouched.
  void forward_loss(const std::int32_t* d_inputs, const std::int32_t* d_targets, double* d_loss) {
    forward(d_inputs);
    TESSERA_NVTX_RANGE("lm head + cross-entropy (forward)");
    kernels::cuda::lm_head_cross_entropy(ctx_, d_loss, final_xn_.data(), param("lm_head"),
                                         d_targets, N(), cfg_.vocab, cfg_.dim, opt_.ignore_index,
                                         0.0f, nullptr, nullptr, opt_.ce_chunk, scratch_.data(),
                                         scratch_bytes_, stream_);
  }

  /// FLOPs the step executes beyond the model FLOPs because of activation
  /// checkpointing, per token: with `full`, every block's forward again
  /// except the down projection (2 (2 H H + 2 H KV + 2 H F) for the q, k, v,
  /// o, gate and up GEMMs) plus the causal attention forward (2 T H, the
  /// S^2 square counted once, as in train::flops_per_token). 0 with `none`.
  double recompute_flops_per_token() const {
    if (opt_.checkpointing != activation_checkpointing::full) return 0;
    const double H = static_cast<double>(cfg_.dim), KV = static_cast<double>(cfg_.kv_dim()),
                 F = static_cast<double>(cfg_.ffn_dim), L = static_cast<double>(cfg_.n_layers),
                 T = static_cast<double>(T_);
    return L * (2.0 * (2 * H * H + 2 * H * KV + 2 * H * F) + 2.0 * T * H);
  }

 private:
  // Absolute flat offsets of one block's tensors.
  struct block_params {
    std::int64_t attn_norm, wq, wk, wv, wo, mlp_norm, w_gate, w_up, w_down;
  };
  // One block's activations (x_in is the checkpoint; the rest is the record).
  struct record {
    tensor<Param, tessera::cuda> x_in, xn1, q, k, v, att, x_mid, xn2, gate, up, h;
    tensor<float, tessera::cuda> rstd1, rstd2, lse;
  };

  template <class T>
  tensor<T, tessera::cuda> dev(std::int64_t n) {
    return tensor<T, tessera::cuda>(shape{n}, mr_);
  }
  block_params offsets_of(int l) const {
    const std::string b = "blocks." + std::to_string(l) + ".";
    auto at = [&](const char* n) { return layout_.at(b + n).offset; };
    return {at("attn_norm"), at("attn.wq"),    at("attn.wk"),  at("attn.wv"),   at("attn.wo"),
            at("mlp_norm"),  at("mlp.w_gate"), at("mlp.w_up"), at("mlp.w_down")};
  }
  void allocate_record(record& r) {
    const std::int64_t N = B_ * T_, H = cfg_.dim, KV = cfg_.kv_dim(), F = cfg_.ffn_dim;
    r.xn1 = dev<Param>(N * H);
    r.q = dev<Param>(N * H);
    r.k = dev<Param>(N * KV);
    r.v = dev<Param>(N * KV);
    r.att = dev<Param>(N * H);
    r.x_mid = dev<Param>(N * H);
    r.xn2 = dev<Param>(N * H);
    r.gate = dev<Param>(N * F);
    r.up = dev<Param>(N * F);
    r.h = dev<Param>(N * F);
    r.rstd1 = dev<float>(N);
    r.rstd2 = dev<float>(N);
    r.lse = dev<float>(B_ * cfg_.n_heads * T_);
  }
  std::int64_t N() const { return B_ * T_; }
  const Param* param(const char* name) const { return params_.data() + layout_.at(name).offset; }
  Grad* grad(const char* name) { return grads_.data() + layout_.at(name).offset; }
  // The record block l's forward writes and its backward reads.
  record& rec(int l) {
    return opt_.checkpointing == activation_checkpointing::full
               ? work_
               : records_[static_cast<std::size_t>(l)];
  }
  // Block input of block l (its checkpoint) and block output (the next
  // block's input, or the final norm's).
  const Param* block_in(int l) const { return records_[static_cast<std::size_t>(l)].x_in.data(); }
  Param* block_out(int l) {
    return l + 1 < static_cast<int>(cfg_.n_layers)
               ? records_[static_cast<std::size_t>(l + 1)].x_in.data()
               : final_in_.data();
  }

  // Forward of block l from block_in(l) into rec(l); when `out` is not
  // null, also the down projection and the residual, into `out`.
  void block_forward(int l, Param* out) {
    namespace kc = kernels::cuda;
    record& r = rec(l);
    const block_params& o = blocks_[static_cast<std::size_t>(l)];
    const Param* p = params_.data();
    const std::int64_t N = this->N(), H = cfg_.dim, KV = cfg_.kv_dim(), F = cfg_.ffn_dim;
    const Param* x = block_in(l);
    kc::rmsnorm_forward<Param>(r.xn1.data(), r.rstd1.data(), x, p + o.attn_norm, N, H,
                               cfg_.norm_eps, stream_);
    kc::linear_forward<Param>(ctx_, r.q.data(), r.xn1.data(), p + o.wq, N, H, H, stream_);
    kc::linear_forward<Param>(ctx_, r.k.data(), r.xn1.data(), p + o.wk, N, KV, H, stream_);
    kc::linear_forward<Param>(ctx_, r.v.data(), r.xn1.data(), p + o.wv, N, KV, H, stream_);
    kc::rope_forward<Param>(r.q.data(), rope_cos_.data(), rope_sin_.data(), B_, T_, cfg_.n_heads,
                            cfg_.head_dim(), stream_);
    kc::rope_forward<Param>(r.k.data(), rope_cos_.data(), rope_sin_.data(), B_, T_,
                            cfg_.n_kv_heads, cfg_.head_dim(), stream_);
    kc::flash_attention_forward(r.att.data(), r.lse.data(), r.q.data(), r.k.data(), r.v.data(),
                                B_, T_, cfg_.n_heads, cfg_.n_kv_heads, cfg_.head_dim(), stream_);
    kc::linear_forward<Param>(ctx_, proj_.data(), r.att.data(), p + o.wo, N, H, H, stream_);
    kc::residual_add<Param>(r.x_mid.data(), x, proj_.data(), N * H, stream_);
    kc::rmsnorm_forward<Param>(r.xn2.data(), r.rstd2.data(), r.x_mid.data(), p + o.mlp_norm, N, H,
                               cfg_.norm_eps, stream_);
    kc::linear_forward<Param>(ctx_, r.gate.data(), r.xn2.data(), p + o.w_gate, N, F, H, stream_);
    kc::linear_forward<Param>(ctx_, r.up.data(), r.xn2.data(), p + o.w_up, N, F, H, stream_);
    kc::swiglu_forward<Param>(r.h.data(), r.gate.data(), r.up.data(), N * F, stream_);
    if (out == nullptr) return;
    kc::linear_forward<Param>(ctx_, proj_.data(), r.h.data(), p + o.w_down, N, H, F, stream_);
    kc::residual_add<Param>(out, r.x_mid.data(), proj_.data(), N * H, stream_);
  }

  // Embedding, the blocks (saving checkpoints or records) and the final norm.
  void forward(const std::int32_t* d_inputs) {
    namespace kc = kernels::cuda;
    const std::int64_t N = this->N(), H = cfg_.dim;
    {
      TESSERA_NVTX_RANGE("embedding forward");
      kc::embedding_forward<Param>(records_.empty() ? final_in_.data() : records_[0].x_in.data(),
                                   d_inputs, param("embedding"), N, cfg_.vocab, H, stream_);
    }
    for (int l = 0; l < static_cast<int>(cfg_.n_layers); ++l) {
      nvtx_range range("forward block ", l);
      block_forward(l, block_out(l));
    }
    TESSERA_NVTX_RANGE("final norm forward");
    kc::rmsnorm_forward<Param>(final_xn_.data(), final_rstd_.data(), final_in_.data(),
                               param("final_norm"), N, H, cfg_.norm_eps, stream_);
  }

  // Backward of block l: dres_ holds the gradient of the block output on
  // entry and of the block input on return.
  void block_backward(int l) {
    namespace kc = kernels::cuda;
    record& r = rec(l);
    const block_params& o = blocks_[static_cast<std::size_t>(l)];
    const Param* p = params_.data();
    Grad* g = grads_.data();
    const std::int64_t N = this->N(), H = cfg_.dim, KV = cfg_.kv_dim(), F = cfg_.ffn_dim;
    void* s = scratch_.data();
    // MLP: y = x_mid + h Wd^T, h = silu(x_mid' Wg^T) * (x_mid' Wu^T), x_mid' = rmsnorm(x_mid).
    kc::linear_backward_input<Act>(ctx_, dh_.data(), dres_.data(), p + o.w_down, N, H, F, stream_);
    kc::linear_backward_weight(ctx_, g + o.w_down, dres_.data(), r.h.data(), N, H, F, stream_);
    Act* dgate = dh_.data();  // swiglu_backward's outputs may alias its dout
    kc::swiglu_backward<Param, Act>(dgate, dup_.data(), dh_.data(), r.gate.data(), r.up.data(),
                                    N * F, stream_);
    kc::linear_backward_input<Act>(ctx_, dxn_.data(), dgate, p + o.w_gate, N, F, H, stream_);
    kc::linear_backward_input<Act>(ctx_, dxn_.data(), dup_.data(), p + o.w_up, N, F, H, stream_,
                                   true);
    kc::linear_backward_weight(ctx_, g + o.w_gate, dgate, r.xn2.data(), N, F, H, stream_);
    kc::linear_backward_weight(ctx_, g + o.w_up, dup_.data(), r.xn2.data(), N, F, H, stream_);
    kc::rmsnorm_backward<Param, Act>(dres_.data(), g + o.mlp_norm, dxn_.data(), r.x_mid.data(),
                                     p + o.mlp_norm, r.rstd2.data(), N, H, s, scratch_bytes_,
                                     stream_, true);
    // Attention: x_mid = x_in + att Wo^T.
    kc::linear_backward_input<Act>(ctx_, datt_.data(), dres_.data(), p + o.wo, N, H, H, stream_);
    kc::linear_backward_weight(ctx_, g + o.wo, dres_.data(), r.att.data(), N, H, H, stream_);
    kc::flash_attention_backward(dq_.data(), dk_.data(), dv_.data(), datt_.data(), r.q.data(),
                                 r.k.data(), r.v.data(), r.att.data(), r.lse.data(), B_, T_,
                                 cfg_.n_heads, cfg_.n_kv_heads, cfg_.head_dim(), s, scratch_bytes_,
                                 stream_);
    kc::rope_backward<Act>(dq_.data(), rope_cos_.data(), rope_sin_.data(), B_, T_, cfg_.n_heads,
                           cfg_.head_dim(), stream_);
    kc::rope_backward<Act>(dk_.data(), rope_cos_.data(), rope_sin_.data(), B_, T_,
                           cfg_.n_kv_heads, cfg_.head_dim(), stream_);
    kc::linear_backward_input<Act>(ctx_, dxn_.data(), dq_.data(), p + o.wq, N, H, H, stream_);
    kc::linear_backward_input<Act>(ctx_, dxn_.data(), dk_.data(), p + o.wk, N, KV, H, stream_,
                                   true);
    kc::linear_backward_input<Act>(ctx_, dxn_.data(), dv_.data(), p + o.wv, N, KV, H, stream_,
                                   true);
    kc::linear_backward_weight(ctx_, g + o.wq, dq_.data(), r.xn1.data(), N, H, H, stream_);
    kc::linear_backward_weight(ctx_, g + o.wk, dk_.data(), r.xn1.data(), N, KV, H, stream_);
    kc::linear_backward_weight(ctx_, g + o.wv, dv_.data(), r.xn1.data(), N, KV, H, stream_);
    kc::rmsnorm_backward<Param, Act>(dres_.data(), g + o.attn_norm, dxn_.data(), block_in(l),
                                     p + o.attn_norm, r.rstd1.data(), N, H, s, scratch_bytes_,
                                     stream_, true);
  }

  // dxf: (N, H) gradient of the final norm's output (in datt_).
  void backward(const std::int32_t* d_inputs, const Act* dxf) {
    namespace kc = kernels::cuda;
    const std::int64_t N = this->N(), H = cfg_.dim;
    // datt_ holds dxf; the final norm's backward writes dres_ (not accumulated).
    {
      TESSERA_NVTX_RANGE("final norm backward");
      kc::rmsnorm_backward<Param, Act>(dres_.data(), grad("final_norm"), dxf, final_in_.data(),
                                       param("final_norm"), final_rstd_.data(), N, H,
                                       scratch_.data(), scratch_bytes_, stream_, false);
    }
    const bool full = opt_.checkpointing == activation_checkpointing::full;
    for (int l = static_cast<int>(cfg_.n_layers) - 1; l >= 0; --l) {
      if (full) {
        nvtx_range range("recompute block ", l);
        block_forward(l, nullptr);
      }
      nvtx_range range("backward block ", l);
      block_backward(l);
    }
    TESSERA_NVTX_RANGE("embedding backward");
    kc::embedding_backward<Act>(grad("embedding"), dres_.data(), d_inputs, N, cfg_.vocab, H,
                                stream_);
  }

  llama_config cfg_;
  cuda_llama_options opt_;
  param_layout layout_;
  std::int64_t B_, T_;
  cudaStream_t stream_;
  stream_bound_resource mr_;  // before every tensor: they deallocate through it
  kernels::cuda::cublaslt_context ctx_;
  std::vector<block_params> blocks_;
  tensor<Param, tessera::cuda> params_;
  tensor<Grad, tessera::cuda> grads_;
  tensor<float, tessera::cuda> rope_cos_, rope_sin_;
  std::vector<record> records_;  // x_in always; the rest only without checkpointing
  record work_;                  // the recompute record (full checkpointing)
  tensor<Param, tessera::cuda> final_in_, final_xn_, proj_;
  tensor<float, tessera::cuda> final_rstd_;
  tensor<Act, tessera::cuda> dres_, datt_, dxn_, dq_, dk_, dv_, dh_, dup_;
  tensor<std::uint8_t, tessera::cuda> scratch_;
  std::size_t scratch_bytes_ = 0;
};

}  // namespace tessera::nn
