#pragma once
/// \file plan/cuda_step.hpp
/// Device memory of one training step on one GPU: the same model, engine
/// and trainer as on the host (one code path), so the plan is plan_memory
/// (plan/memory.hpp) with the CUDA kernels' scratch, the cuBLASLt
/// workspace and the loader's device buffers. Host-only: plain C++ with no
/// CUDA headers, so examples/plan prints it on any machine.
///
/// The GPU allocates through the caching allocator, stream-ordered, as the
/// model's forward and backward go (as PyTorch does), so the peak is the
/// persistent state plus the activation timeline's peak; the allocator's
/// rounding to 512-byte blocks and its segments (caching_allocator.hpp) add
/// a little on top, which the device check measures.
///
/// Per parameter, bf16_mixed: 2 (bf16 weight) + 4 (float32 gradient) + 4
/// (master) + 4 + 4 (moments) = 18 bytes. The seed's 16 bytes per parameter
/// (seeds/004) keep the gradient in 16 bits; float32 gradients are what the
/// weight-gradient GEMMs accumulate into (beta = 1) across layers and
/// micro-batches without bf16 rounding at each addition. fp16_mixed counts
/// as bf16_mixed_bf16_grads does (16-bit weights, activations and
/// activation gradients, 2 bytes each). fp8_mixed stores its policy's
/// types, those of bf16_mixed (bf16 weights and activations, float32
/// activation gradients), and adds what kernels::fp8_gemm on the GPU
/// allocates (plan/fp8.hpp: the scalars, fp8_scalar_bytes, persistent; one
/// GEMM's FP8 operand copies, fp8_operand_bytes, a transient).

#include <cstdint>
#include <string>

#include "tessera/core/error.hpp"
#include "tessera/nn/checkpointing.hpp"
#include "tessera/nn/llama_config.hpp"
#include "tessera/plan/memory.hpp"

namespace tessera::plan {

/// What sizes a one-GPU step.
struct cuda_step_options {
  std::int64_t micro_batch = 1;    ///< B, sequences per micro-batch
  std::int64_t seq = 0;            ///< T, tokens per sequence (0: the config's max_seq)
  std::int64_t micro_batches = 1;  ///< A, per optimizer step
  /// Activation checkpointing (full by default on a GPU: the 7B step fits).
  nn::checkpoint_policy checkpointing{nn::activation_checkpointing::full, 1};
  std::int64_t ce_chunk = 1024;  ///< token rows per LM-head/cross-entropy chunk
  /// The precision policy's name (dtype_sizes::from_name): bf16_mixed_bf16_grads
  /// (bf16 activation gradients, the GPU's default), bf16_mixed, fp16_mixed
  /// or fp8_mixed.
  std::string precision = "bf16_mixed_bf16_grads";
  std::string optimizer =
      "adamw";  ///< optimizer_spec::from_name: adamw, sgd, lion, adafactor, muon
  /// cuBLASLt workspace (kernels::cuda_context_options, 32 MiB).
  std::uint64_t cublaslt_workspace = std::uint64_t(32) << 20;
};

/// The plan of one optimizer step of train::trainer<P, cuda> on one GPU
/// (dp 1, zero<0>) for `c` at `o`. Throws config_error for an invalid
/// config, B or ce_chunk < 1, T < 0 or T > max_seq, an unknown precision
/// or optimizer, or a policy the GPU cannot run (fp32 and fp64: the CUDA
/// attention and cross-entropy kernels take 16-bit operands). Under
/// fp8_mixed the plan's fp8 holds the CUDA FP8 linear's device bytes
/// (plan_fp8 with backend cuda).
inline memory_plan plan_cuda_step(const nn::llama_config& c, const cuda_step_options& o) {
  c.validate();
  TESSERA_THROW_IF(o.micro_batch < 1, config_error, "micro-batch B=", o.micro_batch,
                   " must be >= 1");
  TESSERA_THROW_IF(o.seq < 0, config_error, "sequence length T=", o.seq,
                   " must be >= 1 (or 0 for the config's max_seq)");
  TESSERA_THROW_IF(o.ce_chunk < 1, config_error, "ce_chunk=", o.ce_chunk, " must be >= 1");
  TESSERA_THROW_IF(o.micro_batches < 1, config_error, "micro_batches=", o.micro_batches,
                   " must be >= 1");
  const dtype_sizes d = dtype_sizes::from_name(o.precision);
  TESSERA_THROW_IF(d.param != 2, config_error, "precision ", o.precision,
                   ": the GPU trains 16-bit weights and activations (bf16_mixed, "
                   "bf16_mixed_bf16_grads, fp16_mixed or fp8_mixed)");
  activation_options a;
  a.micro_batch = o.micro_batch;
  a.seq = o.seq;
  a.model.ce_chunk = o.ce_chunk;
  a.model.checkpointing = o.checkpointing;
  a.backend = backend_kind::cuda;
  a.micro_batches = o.micro_batches;
  a.cublaslt_workspace = o.cublaslt_workspace;
  return plan_memory(c, d, optimizer_spec::from_name(o.optimizer), sharding{0, 1}, a);
}

}  // namespace tessera::plan
