#pragma once
/// \file nn/llama_record.hpp
/// What an nn::llama instance (nn/llama.hpp) is built with and what one
/// micro-batch passes through it: the stage range (a pipeline stage is a
/// range of the modules), the model options, the micro-batch's inputs, the
/// record a training forward leaves for its backward, and the loss of a
/// host-memory call.

#include <cstdint>
#include <vector>

#include "tessera/core/tensor.hpp"
#include "tessera/nn/checkpointing.hpp"
#include "tessera/nn/embedding.hpp"
#include "tessera/nn/llama_layout.hpp"
#include "tessera/nn/lm_head.hpp"
#include "tessera/nn/transformer_block.hpp"
#include "tessera/precision/fp8_scaling.hpp"
#include "tessera/precision/policy.hpp"

namespace tessera::nn {

/// The modules one model instance holds: blocks [first_block, last_block)
/// (last_block -1: to the end), and whether the embedding and the head are
/// here. The whole model by default.
struct stage_range {
  std::int64_t first_block = 0;  ///< first block of the stage, in [0, L]
  std::int64_t last_block = -1;  ///< one past its last block, in [first_block, L]; -1: L
  bool embedding = true;         ///< holds the embedding (then first_block is 0)
  bool head = true;              ///< holds the final norm and LM head (then last_block is L)
};

/// Options of a model instance that are not model sizes.
struct llama_options {
  std::int64_t ce_chunk = 256;       ///< token rows per LM-head/cross-entropy chunk
  std::int32_t ignore_index = -100;  ///< target id that is not scored; input id that is padding
  /// Do not allocate the flat parameter buffer: params() is null and a
  /// strategy must point every segment at its parameters
  /// (set_segment_params) before the model reads them (ZeRO-3).
  bool external_params = false;
  /// Do not allocate the flat gradient buffer: grads() is null and a
  /// strategy must point every segment at its gradients
  /// (set_segment_grads) before a backward pass writes them (ZeRO-2/3).
  bool external_grads = false;
  /// Which blocks keep only their input and recompute the rest in backward.
  checkpoint_policy checkpointing{};
  /// The modules of this instance (a pipeline stage), the whole model by default.
  stage_range stage{};
  /// Where init_weights and init_weights_range take the weights from:
  /// nullptr, drawn from the seed (init_llama_weights_range); set, read from
  /// whole tensors (load_llama_weights_range; a Hugging Face checkpoint's
  /// hf_checkpoint::reader()), the seed unused. Not owned: the reader (and
  /// what it reads) must outlive every init_weights* call.
  const tensor_reader* weights = nullptr;
  /// Under an FP8 policy (precision::fp8_linear<P>): the recipe of the
  /// blocks' FP8 linear layers (nn/fp8_linear.hpp); unused otherwise.
  precision::fp8_recipe fp8{};
};

/// What one micro-batch's training forward leaves for its backward.
template <precision::policy P, class Backend>
struct llama_record {
  embedding_record<Backend> embedding;                 ///< the input ids (stages with it)
  std::vector<block_record<P, Backend>> blocks;        ///< one per block of the stage
  head_record<P, Backend> head;                        ///< d(loss)/d(head input) (stages with it)
  tensor<typename P::param_type, Backend> output;      ///< (rows, H) stage output (stages without the head; rows = N, or N/tp sequence-parallel)
  tensor<typename P::act_grad_type, Backend> grad_input;  ///< (rows, H) after backward: d(loss)/d(stage input) (stages without the embedding)
  /// (rows, H) between a split backward's B and W on the embedding's
  /// stage: the gradient of the embedding's output, which W scatters.
  tensor<typename P::act_grad_type, Backend> grad_embedding;
  std::int64_t B = 0, T = 0;  ///< the micro-batch's rows and tokens per row (N = B T)
  /// The micro-batch's (B, T) document starts (micro_batch::doc_start, not
  /// owned: the caller keeps them until the backward), or null.
  const std::int32_t* doc_start = nullptr;
  bool filled = false;        ///< between forward and backward (or B)
  bool weights_pending = false;  ///< between a split backward's B and W
};

/// The loss of a host-memory call: the sum of -log p over scored targets
/// (nats) and how many were scored.
struct loss_sum {
  double sum = 0;
  std::int64_t scored = 0;
};

/// One micro-batch, in the context's memory.
template <class Param>
struct micro_batch {
  const std::int32_t* inputs = nullptr;   ///< (B, T) input ids (stages with the embedding)
  const std::int32_t* targets = nullptr;  ///< (B, T) target ids (stages with the head)
  const Param* hidden = nullptr;          ///< (B, T, H) stage input (stages without the embedding; this rank's N/tp rows under sequence parallelism)
  std::int64_t B = 0, T = 0;
  /// (B, T) int32, or null: packed documents (every stage): the position
  /// of the first token of each input token's document in its row
  /// (data::document_starts); RoPE rotates by the position in the document
  /// and attention stays inside it (kernels::attention_mask). It must stay
  /// valid until the micro-batch's backward. Null: one document per row.
  const std::int32_t* doc_start = nullptr;
};

}  // namespace tessera::nn
