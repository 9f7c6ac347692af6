#pragma once
/// \file plan/fp8.hpp
/// The bytes an FP8 precision policy (precision::fp8_mixed; the planner's
/// dtype_sizes::fp8_linear) adds to a rank: the copies of the FP8 GEMMs'
/// operands, and the scale state of the blocks' seven linear layers
/// (nn::block_linear), on either backend. plan_memory and plan_pipeline add
/// them to their plans (memory_plan::fp8, pipeline_stage_plan::fp8).
///
/// Both backends (nn/fp8_linear.hpp): each linear's scales, inverse scales
/// and amaxes, nn::fp8_linear_scalars floats, in the context's memory (one
/// tensor of the model, from its memory resource: fp8_scalar_bytes).
///
/// Host: each FP8 GEMM casts its two operands into grow-only per-thread
/// float buffers, x̂ (M x K), Ŵ (N x K) and d̂y (M x N), one buffer per
/// kind, so once a rank's thread has run a training forward and backward
/// nn::fp8_workspace_bytes() is 4 (max M K + max N K + max M N) bytes, the
/// maxima over the block's linears (fp8_host_operand_bytes). Each linear's
/// nn::fp8_linear_state keeps, for each operand (x, W, dy), a float scale
/// and, under delayed scaling, an amax history of recipe.history floats,
/// and scalars of its own it does not use once the model attaches it
/// (fp8_state_bytes). Both live in the process heap, outside the memory
/// resource the model allocates from.
///
/// GPU (kernels::fp8_gemm on a cuda_context): each GEMM casts its two
/// operands to one-byte FP8 copies (transposed where cuBLASLt's layout
/// needs it) in scratch of the device's caching allocator, freed when the
/// GEMM is queued: at most the largest GEMM's two copies at a time
/// (fp8_operand_bytes), a transient. The amax histories stay in host
/// memory.
///
/// M is the token rows of one micro-batch as every linear sees them: B T,
/// under sequence parallelism too (a column-parallel layer's input is the
/// gathered (B T, H) norm output; a row-parallel layer's input holds every
/// row, its output is reduce-scattered after the GEMM). N and K are the
/// layer's output and input features on this tp rank, read from
/// nn::make_llama_layout(c, {tp, rank}) (one key/value head when tp > nkv).
///
/// All figures are bytes unless a name says otherwise.

#include <algorithm>
#include <cstdint>
#include <string>

#include "tessera/core/error.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/nn/fp8_linear.hpp"
#include "tessera/nn/llama_config.hpp"
#include "tessera/nn/llama_layout.hpp"
#include "tessera/plan/activations.hpp"
#include "tessera/plan/state.hpp"
#include "tessera/precision/fp8_scaling.hpp"

namespace tessera::plan {

/// The largest operand of each kind over the seven linear layers of a
/// block, in elements.
struct fp8_operand_elems {
  std::int64_t x = 0;   ///< max over the linears of M K (the input)
  std::int64_t w = 0;   ///< max of N K (the weight)
  std::int64_t dy = 0;  ///< max of M N (the output gradient)
  /// max over the linears and their three products (forward x, W;
  /// backward to the input dy, W; backward to the weight dy, x) of the
  /// two operands' elements: one GEMM's operands.
  std::int64_t gemm = 0;
  /// x + w + dy.
  std::int64_t total() const { return x + w + dy; }
};

/// The largest x (M K), W (N K) and dy (M N) over the block's linear layers
/// (nn::block_linear_names; every block has the same shapes) for M =
/// `tokens` rows, N and K the layers' features on tp rank `t` (file
/// comment). Throws config_error for tokens < 1, an invalid config, or a
/// tp that does not split `c` (nn::make_llama_layout).
inline fp8_operand_elems fp8_largest_operands(const nn::llama_config& c, std::int64_t tokens,
                                              nn::tp_rank t = {}) {
  TESSERA_THROW_IF(tokens < 1, config_error, "FP8 operands: tokens M=", tokens, " must be >= 1");
  c.validate();
  const nn::param_layout layout = nn::make_llama_layout(c, t);
  fp8_operand_elems e;
  for (const char* name : nn::block_linear_names) {
    const nn::param_entry& w = layout.at(std::string("blocks.0.") + name);
    const std::int64_t N = w.shp[0], K = w.shp[1];
    e.x = std::max(e.x, tokens * K);
    e.w = std::max(e.w, N * K);
    e.dy = std::max(e.dy, tokens * N);
    e.gemm = std::max({e.gemm, tokens * K + N * K, tokens * N + N * K, tokens * N + tokens * K});
  }
  return e;
}

/// Bytes of the host's FP8 operand copies (nn/fp8_linear.hpp): what
/// nn::fp8_workspace_bytes() reports on a rank's thread once its FP8
/// linear layers have run a training forward and backward of `tokens`
/// rows, the float buffers x̂, Ŵ and d̂y each grown to its largest use:
/// 4 (max M K + max N K + max M N). Grow-only, so held from the first step
/// on; thread-local heap buffers, outside the memory resource. Throws as
/// fp8_largest_operands.
inline std::uint64_t fp8_host_operand_bytes(const nn::llama_config& c, std::int64_t tokens,
                                            nn::tp_rank t = {}) {
  return sizeof(float) * static_cast<std::uint64_t>(fp8_largest_operands(c, tokens, t).total());
}

/// Device bytes of the FP8 operand copies on a GPU (kernels::fp8_gemm on a
/// cuda_context): one-byte copies of one GEMM's two operands, E4M3 or E5M2
/// alike, transposed or not, as scratch of the caching allocator for the
/// GEMM's duration, so at most the largest GEMM's: max over the block's
/// linears of M K + N K (forward), M N + N K (backward to the input) and
/// M N + M K (backward to the weight). A transient. Throws as
/// fp8_largest_operands. Source: the cuBLASLt documentation (FP8 matmuls
/// take FP8 operands in the TN layout); kernels/cuda/ops.hpp.
inline std::uint64_t fp8_operand_bytes(const nn::llama_config& c, std::int64_t tokens,
                                       nn::tp_rank t = {}) {
  static_assert(sizeof(fp8_e4m3) == 1 && sizeof(fp8_e5m2) == 1);
  return sizeof(fp8_e4m3) * static_cast<std::uint64_t>(fp8_largest_operands(c, tokens, t).gemm);
}

/// Bytes of the FP8 scalars of `blocks` transformer blocks in the context's
/// memory, on either backend: nn::fp8_linear_scalars floats (the scale,
/// inverse scale and amaxes of x, W and dy) for each of the 7 linears of a
/// block, one tensor from the model's memory resource. Throws config_error
/// for blocks < 0.
inline std::uint64_t fp8_scalar_bytes(std::int64_t blocks) {
  TESSERA_THROW_IF(blocks < 0, config_error, "FP8 state: blocks=", blocks, " must be >= 0");
  return sizeof(float) *
         static_cast<std::uint64_t>(blocks * nn::block_linears * nn::fp8_linear_scalars);
}

/// Host bytes of the FP8 state of `blocks` transformer blocks under recipe
/// `r`, outside the memory resource: one nn::fp8_linear_state per linear
/// (7 per block), holding for each operand (x, W, dy) a float scale and,
/// under delayed scaling, an amax history of r.history floats, and
/// nn::fp8_linear_scalars floats of its own: 3 (1 + history) + 15 floats
/// per linear under delayed scaling, 3 + 15 under current. The states'
/// floats and history vectors, not the objects' fixed members (the recipe
/// copies, the ring index). Throws config_error for blocks < 0 or as
/// r.validate().
inline std::uint64_t fp8_state_bytes(std::int64_t blocks, const precision::fp8_recipe& r) {
  TESSERA_THROW_IF(blocks < 0, config_error, "FP8 state: blocks=", blocks, " must be >= 0");
  r.validate();
  const std::int64_t history = r.scaling == precision::fp8_scaling::delayed ? r.history : 0;
  return sizeof(float) * static_cast<std::uint64_t>(blocks * nn::block_linears *
                                                    (3 * (1 + history) + nn::fp8_linear_scalars));
}

/// The FP8 bytes of one rank (plan_fp8): zero under a policy without FP8.
struct fp8_plan {
  backend_kind backend = backend_kind::host;  ///< whose rule counted them
  precision::fp8_recipe recipe{};             ///< the scales' recipe (host: the histories' length)
  std::int64_t blocks = 0;                    ///< transformer blocks the rank holds
  fp8_operand_elems largest{};                ///< the largest operands, elements (0 without blocks)
  /// fp8_scalar_bytes: the scalars in the context's memory (the model's
  /// memory resource, host or device), persistent.
  std::uint64_t scalars = 0;
  /// host: fp8_state_bytes (scales, amax histories, the states' own
  /// scalars; heap, outside the memory resource); cuda: 0 (that state is
  /// host memory, not the GPU's).
  std::uint64_t state = 0;
  /// host: fp8_host_operand_bytes (float copies, thread-local heap, outside
  /// the memory resource, held from the first step); cuda:
  /// fp8_operand_bytes (one GEMM's one-byte copies, caching-allocator
  /// scratch: a transient). 0 without blocks.
  std::uint64_t operands = 0;
  /// What stays allocated between steps: scalars + state, and on the host
  /// the grow-only operand copies.
  std::uint64_t persistent() const {
    return scalars + state + (backend == backend_kind::host ? operands : 0);
  }
  /// What a step adds while it runs: the GPU's operand copies.
  std::uint64_t transient() const { return backend == backend_kind::host ? 0 : operands; }
  /// The part outside the model's memory resource (the host's heap):
  /// state + operands on the host, 0 on a GPU.
  std::uint64_t outside_resource() const {
    return backend == backend_kind::host ? state + operands : 0;
  }
  /// persistent() + transient().
  std::uint64_t total() const { return persistent() + transient(); }
};

/// The FP8 bytes of a rank that holds `blocks` transformer blocks of `c`
/// (all of them without a pipeline; a pipeline rank's stage otherwise) and
/// trains micro-batches of a.micro_batch x a.seq tokens (0: c.max_seq), on
/// tp rank `t`, under d's policy: on a.backend's rule (file comment), the
/// recipe a.model.fp8 (nn::llama_options::fp8, as train::train_config::fp8
/// gives it to the model). All zero unless d.fp8_linear. Throws
/// config_error for blocks outside [0, c.n_layers], a micro-batch shape
/// < 1, an invalid recipe, or as fp8_largest_operands.
inline fp8_plan plan_fp8(const nn::llama_config& c, const dtype_sizes& d,
                         const activation_options& a, nn::tp_rank t, std::int64_t blocks) {
  fp8_plan p;
  p.backend = a.backend;
  p.recipe = a.model.fp8;
  if (!d.fp8_linear) return p;
  TESSERA_THROW_IF(blocks < 0 || blocks > c.n_layers, config_error, "FP8 plan: blocks=", blocks,
                   " must be in [0, ", c.n_layers, "]");
  // a rank's tokens of each sequence (T/cp under context parallelism)
  const std::int64_t T = (a.seq > 0 ? a.seq : c.max_seq) / std::max(1, a.cp);
  TESSERA_THROW_IF(a.micro_batch < 1 || T < 1, config_error, "FP8 plan: B=", a.micro_batch,
                   " T=", T, " must be >= 1");
  p.recipe.validate();
  p.blocks = blocks;
  const bool host = a.backend == backend_kind::host;
  p.scalars = fp8_scalar_bytes(blocks);
  p.state = host ? fp8_state_bytes(blocks, p.recipe) : 0;
  if (blocks == 0) return p;
  const std::int64_t M = a.micro_batch * T;
  p.largest = fp8_largest_operands(c, M, t);
  p.operands = host ? fp8_host_operand_bytes(c, M, t) : fp8_operand_bytes(c, M, t);
  return p;
}

}  // namespace tessera::plan
