#pragma once
/// \file plan/cuda_step.hpp
/// Device memory of one training step of nn::cuda_llama with
/// optim::cuda_adamw on one GPU (bf16 weights and activations, float32
/// gradients, master weights and moments), buffer by buffer as the model,
/// the optimizer and train::cuda_trainer allocate them. Host-only: plain
/// C++ with no CUDA headers, so examples/plan prints it on any machine.
///
/// The model allocates everything once, at construction, for a fixed
/// micro-batch (B, T) (as llm.c does), so the peak is the sum of the items
/// below; tests/cuda/llama.cpp holds the device allocator's peak to this
/// plan to the byte.
///
/// Per parameter: 2 (bf16 weight) + 4 (float32 gradient) + 4 (master) +
/// 4 + 4 (moments) = 18 bytes. The seed's 16 bytes per parameter
/// (seeds/004) keep the gradient in 16 bits; float32 gradients are what
/// the weight-gradient GEMMs accumulate into (beta = 1) across layers and
/// micro-batches without bf16 rounding at each addition.

#include <algorithm>
#include <cstdint>

#include "tessera/core/error.hpp"
#include "tessera/kernels/cuda/attention_launch.hpp"
#include "tessera/kernels/cuda/launch.hpp"
#include "tessera/nn/checkpointing.hpp"
#include "tessera/nn/llama_config.hpp"
#include "tessera/nn/llama_layout.hpp"

namespace tessera::plan {

/// What sizes a cuda_llama step's buffers.
struct cuda_step_options {
  std::int64_t micro_batch = 1;  ///< B, sequences per micro-batch
  std::int64_t seq = 0;          ///< T, tokens per sequence (0: the config's max_seq)
  std::int64_t micro_batches = 1;  ///< per optimizer step (one loss double each)
  nn::activation_checkpointing checkpointing = nn::activation_checkpointing::full;
  std::int64_t ce_chunk = 1024;  ///< token rows per LM-head/cross-entropy chunk
  /// cuBLASLt workspace (nn::cuda_llama_options::cublaslt_workspace, 32 MiB).
  std::uint64_t cublaslt_workspace = std::uint64_t(32) << 20;
  /// The pinned double-buffered loader's device buffers (2 x inputs and
  /// targets of N int32); false when the caller feeds token ids itself.
  bool loader = true;
};

/// Bytes of every device buffer of the step (nothing else is allocated).
struct cuda_step_plan {
  std::int64_t params = 0;  ///< flat buffer elements (layout total, with padding)
  std::int64_t tokens = 0;  ///< N = B T
  // model state
  std::uint64_t weights = 0;      ///< params x 2 (bf16)
  std::uint64_t grads = 0;        ///< params x 4 (float32)
  std::uint64_t rope_tables = 0;  ///< cos and sin, max_seq x hd/2 float32 each
  std::uint64_t cublaslt_workspace = 0;
  // optimizer state
  std::uint64_t master = 0;     ///< params x 4
  std::uint64_t moments = 0;    ///< params x 8
  std::uint64_t optimizer_misc = 0;  ///< segment table, norm scratch, norm, clip coefficient
  // activations of one micro-batch
  std::uint64_t checkpoints = 0;  ///< full: L block inputs (N, H) bf16; none: L whole records
  std::uint64_t work_record = 0;  ///< full: one record (without its input) that backward recomputes into
  std::uint64_t final_norm = 0;   ///< final_in, final_xn (N, H) bf16 and final_rstd (N) float
  std::uint64_t projection = 0;   ///< (N, H) bf16 output-projection buffer of forward
  std::uint64_t grad_scratch = 0;  ///< dres, datt, dxn, dq (N, H), dk, dv (N, KV), dh, dup (N, F) bf16
  std::uint64_t kernel_scratch = 0;  ///< max(RMSNorm dweight, attention backward, fused CE) scratch
  std::uint64_t losses = 0;          ///< one double per micro-batch
  std::uint64_t loader_buffers = 0;  ///< 2 x 2 x N int32

  std::uint64_t state() const {
    return weights + grads + rope_tables + cublaslt_workspace + master + moments + optimizer_misc;
  }
  std::uint64_t activations() const {
    return checkpoints + work_record + final_norm + projection + grad_scratch + kernel_scratch +
           losses + loader_buffers;
  }
  std::uint64_t total() const { return state() + activations(); }
};

/// Bytes of one block's activation record: bf16 xn1, q, att, x_mid, xn2
/// (N, H), k, v (N, KV), gate, up, h (N, F); float32 rstd1, rstd2 (N) and
/// lse (B, nh, T); plus the bf16 block input (N, H) when `with_input`.
inline std::uint64_t cuda_block_record_bytes(const nn::llama_config& c, std::int64_t N,
                                             bool with_input) {
  const auto n = static_cast<std::uint64_t>(N), H = static_cast<std::uint64_t>(c.dim),
             KV = static_cast<std::uint64_t>(c.kv_dim()), F = static_cast<std::uint64_t>(c.ffn_dim),
             nh = static_cast<std::uint64_t>(c.n_heads);
  const std::uint64_t bf16_elems = n * (5 * H + 2 * KV + 3 * F + (with_input ? H : 0));
  return 2 * bf16_elems + 4 * n * (2 + nh);
}

/// Scratch bytes the model's kernels share (one buffer, used one at a time
/// on one stream).
inline std::uint64_t cuda_kernel_scratch_bytes(const nn::llama_config& c, std::int64_t B,
                                               std::int64_t T, std::int64_t ce_chunk) {
  const std::int64_t N = B * T;
  const std::uint64_t rms = kernels::cuda::rmsnorm_backward_scratch_bytes(N, c.dim);
  const std::uint64_t att = kernels::cuda::attention_backward_scratch_bytes(
      B, T, c.n_heads, c.n_kv_heads, c.head_dim());
  const std::uint64_t ce =
      kernels::cuda::lm_head_cross_entropy_scratch_bytes(N, c.vocab, c.dim, ce_chunk);
  return std::max({rms, att, ce});
}

/// The plan of one optimizer step of cuda_llama + cuda_adamw (+ the loader)
/// for `c` at `o`. Throws config_error for an invalid config, B, T or
/// ce_chunk < 1, T < 0 or T > max_seq.
inline cuda_step_plan plan_cuda_step(const nn::llama_config& c, const cuda_step_options& o) {
  c.validate();
  const std::int64_t B = o.micro_batch, T = o.seq > 0 ? o.seq : c.max_seq;
  TESSERA_THROW_IF(B < 1, config_error, "micro-batch B=", B, " must be >= 1");
  TESSERA_THROW_IF(o.seq < 0, config_error, "sequence length T=", o.seq,
                   " must be >= 1 (or 0 for the config's max_seq)");
  TESSERA_THROW_IF(T > c.max_seq, config_error, "sequence length T=", T,
                   " exceeds the model's max_seq=", c.max_seq);
  TESSERA_THROW_IF(o.ce_chunk < 1, config_error, "ce_chunk=", o.ce_chunk, " must be >= 1");
  TESSERA_THROW_IF(o.micro_batches < 1, config_error, "micro_batches=", o.micro_batches,
                   " must be >= 1");
  const nn::param_layout layout = nn::make_llama_layout(c);
  cuda_step_plan p;
  p.params = layout.total();
  p.tokens = B * T;
  const auto P = static_cast<std::uint64_t>(p.params), N = static_cast<std::uint64_t>(p.tokens),
             H = static_cast<std::uint64_t>(c.dim), KV = static_cast<std::uint64_t>(c.kv_dim()),
             F = static_cast<std::uint64_t>(c.ffn_dim), L = static_cast<std::uint64_t>(c.n_layers);
  p.weights = 2 * P;
  p.grads = 4 * P;
  p.rope_tables = 2 * 4 * static_cast<std::uint64_t>(c.max_seq) *
                  static_cast<std::uint64_t>(c.head_dim() / 2);
  p.cublaslt_workspace = o.cublaslt_workspace;
  p.master = 4 * P;
  p.moments = 8 * P;
  // adamw_segment {int64 begin, int64 end, int32 decay} is 24 bytes.
  p.optimizer_misc = 24 * layout.entries().size() +
                     kernels::cuda::grad_sum_squares_scratch_bytes(p.params) + sizeof(double) +
                     sizeof(float);
  const bool full = o.checkpointing == nn::activation_checkpointing::full;
  p.checkpoints = full ? L * N * H * 2 : L * cuda_block_record_bytes(c, p.tokens, true);
  p.work_record = full ? cuda_block_record_bytes(c, p.tokens, false) : 0;
  p.final_norm = 2 * N * H * 2 + N * 4;
  p.projection = N * H * 2;
  p.grad_scratch = 2 * N * (4 * H + 2 * KV + 2 * F);
  p.kernel_scratch = cuda_kernel_scratch_bytes(c, B, T, o.ce_chunk);
  p.losses = sizeof(double) * static_cast<std::uint64_t>(o.micro_batches);
  p.loader_buffers = o.loader ? 2 * 2 * N * sizeof(std::int32_t) : 0;
  return p;
}

}  // namespace tessera::plan
