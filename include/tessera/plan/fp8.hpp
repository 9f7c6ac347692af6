#pragma once
/// \file plan/fp8.hpp
/// The bytes an FP8 precision policy (precision::fp8_mixed; the planner's
/// dtype_sizes::fp8_linear) adds to a rank: the copies of the FP8 GEMMs'
/// operands, and the scale state of the blocks' seven linear layers
/// (nn::block_linear), on either backend. plan_memory and plan_pipeline add
/// them to their plans (memory_plan::fp8, pipeline_stage_plan::fp8).
///
/// Host (nn/fp8_linear.hpp): each FP8 GEMM casts its two operands into
/// grow-only per-thread float buffers, x̂ (M x K), Ŵ (N x K) and d̂y
/// (M x N), one buffer per kind, so once a rank's thread has run a training
/// forward and backward nn::fp8_workspace_bytes() is 4 (max M K + max N K
/// + max M N) bytes, the maxima over the block's linears
/// (fp8_host_operand_bytes). Each linear's nn::fp8_linear_state keeps, for
/// each operand (x, W, dy), a float scale, a float step amax and, under
/// delayed scaling, an amax history of recipe.history floats
/// (fp8_state_bytes). Both live in the process heap, outside the memory
/// resource the model allocates from.
///
/// GPU (the CUDA FP8 linear, written to this rule): one-byte FP8 copies of
/// x, W and dy and their transposes in the device's caching allocator
/// (fp8_operand_bytes), and per linear nine device floats
/// (fp8_device_state_bytes); the amax histories stay in host memory.
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

/// Device bytes of the FP8 operand buffers of the CUDA FP8 linear: the
/// rule that implementation allocates to (hold it to this function). Per
/// GPU, six grow-only one-byte buffers in the device's caching allocator,
/// each sized to its largest use over the block's linear layers: the FP8
/// casts of x (M K), W (N K) and dy (M N), E4M3 or E5M2 alike, and their
/// transposed copies xT (M K), WT (N K) and dyT (M N), which the backward's
/// GEMMs need because cuBLASLt's FP8 matmul takes only the TN layout
/// (Transformer Engine's cast-transpose makes them the same way):
/// 2 (max M K + max N K + max M N) bytes. Throws as fp8_largest_operands.
/// Source: NVIDIA cuBLASLt documentation, cublasLtMatmul's FP8 layout
/// requirements; Transformer Engine's common/transpose/cast_transpose.
inline std::uint64_t fp8_operand_bytes(const nn::llama_config& c, std::int64_t tokens,
                                       nn::tp_rank t = {}) {
  static_assert(sizeof(fp8_e4m3) == 1 && sizeof(fp8_e5m2) == 1);
  return 2 * sizeof(fp8_e4m3) *
         static_cast<std::uint64_t>(fp8_largest_operands(c, tokens, t).total());
}

/// Floats per linear layer the CUDA FP8 linear keeps on the device: the
/// scale, the inverse scale and the step amax of each of x, W and dy.
inline constexpr std::int64_t fp8_device_floats_per_linear = 9;

/// Device bytes of the FP8 scales of `blocks` transformer blocks on a GPU
/// (what the CUDA FP8 linear allocates besides fp8_operand_bytes):
/// fp8_device_floats_per_linear floats for each of the 7 linears of a
/// block, in the device's caching allocator. The amax histories stay in
/// host memory (fp8_state_bytes counts them there). Throws config_error
/// for blocks < 0.
inline std::uint64_t fp8_device_state_bytes(std::int64_t blocks) {
  TESSERA_THROW_IF(blocks < 0, config_error, "FP8 state: blocks=", blocks, " must be >= 0");
  return sizeof(float) *
         static_cast<std::uint64_t>(blocks * nn::block_linears * fp8_device_floats_per_linear);
}

/// Host bytes of the FP8 state of `blocks` transformer blocks under recipe
/// `r`: one nn::fp8_linear_state per linear (7 per block), holding for each
/// operand (x, W, dy) a float scale, a float step amax and, under delayed
/// scaling, an amax history of r.history floats: 3 (2 + history) floats per
/// linear under delayed scaling, 3 x 2 under current. The states' floats
/// and history vectors, not the objects' fixed members (the recipe copies,
/// the ring index). Throws config_error for blocks < 0 or as r.validate().
inline std::uint64_t fp8_state_bytes(std::int64_t blocks, const precision::fp8_recipe& r) {
  TESSERA_THROW_IF(blocks < 0, config_error, "FP8 state: blocks=", blocks, " must be >= 0");
  r.validate();
  const std::int64_t history = r.scaling == precision::fp8_scaling::delayed ? r.history : 0;
  return sizeof(float) * static_cast<std::uint64_t>(blocks * nn::block_linears * 3 * (2 + history));
}

/// The FP8 bytes of one rank (plan_fp8): zero under a policy without FP8.
struct fp8_plan {
  backend_kind backend = backend_kind::host;  ///< whose rule counted them
  precision::fp8_recipe recipe{};             ///< the scales' recipe (host: the histories' length)
  std::int64_t blocks = 0;                    ///< transformer blocks the rank holds
  fp8_operand_elems largest{};                ///< the largest operands, elements (0 without blocks)
  /// host: fp8_state_bytes (scales, step amaxes, amax histories; heap,
  /// outside the memory resource); cuda: fp8_device_state_bytes (device
  /// scales; the histories are host memory, not counted here).
  std::uint64_t state = 0;
  /// host: fp8_host_operand_bytes (float copies, thread-local heap, outside
  /// the memory resource); cuda: fp8_operand_bytes (one-byte copies and
  /// their transposes, caching allocator). 0 without blocks.
  std::uint64_t operands = 0;
  /// state + operands.
  std::uint64_t total() const { return state + operands; }
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
  const std::int64_t T = a.seq > 0 ? a.seq : c.max_seq;
  TESSERA_THROW_IF(a.micro_batch < 1 || T < 1, config_error, "FP8 plan: B=", a.micro_batch,
                   " T=", T, " must be >= 1");
  p.recipe.validate();
  p.blocks = blocks;
  const bool host = a.backend == backend_kind::host;
  p.state = host ? fp8_state_bytes(blocks, p.recipe) : fp8_device_state_bytes(blocks);
  if (blocks == 0) return p;
  const std::int64_t M = a.micro_batch * T;
  p.largest = fp8_largest_operands(c, M, t);
  p.operands = host ? fp8_host_operand_bytes(c, M, t) : fp8_operand_bytes(c, M, t);
  return p;
}

}  // namespace tessera::plan
