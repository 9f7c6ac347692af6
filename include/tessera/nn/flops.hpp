#pragma once
/// \file nn/flops.hpp
/// The Llama's FLOP count (a model's FLOP count lives with the model):
/// model FLOPs per token of a training step, and the extra FLOPs activation
/// checkpointing recomputes.

#include <cstdint>

#include "tessera/nn/checkpointing.hpp"
#include "tessera/nn/llama_config.hpp"

namespace tessera::nn {

/// Model FLOPs per token of a training step (forward + backward) for `c` at
/// sequence length T: 6 N_matmul + 6 L H T, where N_matmul counts every
/// weight that enters a GEMM (blocks and LM head, not the embedding lookup)
/// and 6 L H T is causal attention (QK^T and PV, forward 2x2 L H T / 2,
/// backward twice that), counted once (PaLM, Chowdhery et al. 2022, App. B,
/// with the causal half). Seeds 003/004: F_train ~ 6ND. MFU divides this.
inline double flops_per_token(const llama_config& c, std::int64_t T) {
  const double H = static_cast<double>(c.dim), F = static_cast<double>(c.ffn_dim);
  const double KV = static_cast<double>(c.kv_dim()), L = static_cast<double>(c.n_layers);
  const double n_matmul = L * (2 * H * H + 2 * KV * H + 3 * H * F) + static_cast<double>(c.vocab) * H;
  return 6.0 * n_matmul + 6.0 * L * H * static_cast<double>(T);
}

/// FLOPs per token a step executes beyond flops_per_token because of
/// activation checkpointing: each recomputed block's forward again except
/// the down projection (2 (2 H H + 2 H KV + 2 H F) for the q, k, v, o, gate
/// and up GEMMs) plus the causal attention forward (2 T H, the square
/// counted once). 0 without checkpointing. HFU counts it, MFU does not.
inline double recompute_flops_per_token(const llama_config& c, std::int64_t T,
                                        const checkpoint_policy& p) {
  const double H = static_cast<double>(c.dim), KV = static_cast<double>(c.kv_dim()),
               F = static_cast<double>(c.ffn_dim), Tt = static_cast<double>(T);
  const double per_block = 2.0 * (2 * H * H + 2 * H * KV + 2 * H * F) + 2.0 * Tt * H;
  return static_cast<double>(p.recomputed_blocks(c.n_layers)) * per_block;
}

}  // namespace tessera::nn
