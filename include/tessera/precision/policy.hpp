#pragma once
/// \file precision/policy.hpp
/// Precision policies: which type stores parameters and saved activations,
/// which type parameter gradients and activation gradients use, which type
/// the master weights and optimizer state use, which type every GEMM and
/// reduction accumulates in, and which type the RoPE tables hold. The
/// policy decides each of them for every backend: the same policy gives
/// the same types on the host and on a GPU.
///
/// Presets: `fp32`, `bf16_mixed` (bf16 weights and activations, float32
/// master weights, optimizer state, gradients and accumulation),
/// `bf16_mixed_bf16_grads`, `fp16_mixed` (fp16 weights, activations and
/// activation gradients under a loss scale) and `fp64` (float64
/// throughout; what the finite-difference tests run).
///
/// `loss_scaled<P>` says whether a policy's backward needs a loss scale
/// (precision/loss_scaler.hpp): true for fp16_mixed, whose activation
/// gradients underflow fp16 without one. `fp8_linear<P>` says whether the
/// transformer blocks' linear layers run FP8 GEMMs (nn/fp8_linear.hpp):
/// true for fp8_mixed.

#include <concepts>
#include <string>
#include <string_view>
#include <type_traits>

#include "tessera/core/numeric.hpp"

namespace tessera::precision {

/// A precision policy names its types and a short name for logs.
template <class P>
concept policy = requires {
  typename P::param_type;     // parameters and saved activations (storage)
  typename P::grad_type;      // parameter gradients (accumulated over micro-batches)
  typename P::act_grad_type;  // activation gradients (the backward's residual stream)
  typename P::master_type;    // master weights and optimizer state
  typename P::accum_type;     // accumulation in GEMMs and reductions
  typename P::rope_type;      // RoPE cos/sin tables
  { P::name } -> std::convertible_to<std::string_view>;
} && std::is_same_v<typename P::accum_type, accum_t<typename P::param_type>> &&
    std::is_same_v<typename P::grad_type, typename P::accum_type>;

/// float32 everywhere: parameters are their own master weights.
struct fp32 {
  using param_type = float;
  using grad_type = float;
  using act_grad_type = float;
  using master_type = float;
  using accum_type = float;
  using rope_type = float;
  static constexpr const char* name = "fp32";
};

/// float64 everywhere, RoPE tables included (reference runs and
/// finite-difference tests: the model then matches an exact float64 Llama
/// to float64 rounding). Host only: the CUDA kernels take 16-bit storage and float32.
struct fp64 {
  using param_type = double;
  using grad_type = double;
  using act_grad_type = double;
  using master_type = double;
  using accum_type = double;
  using rope_type = double;
  static constexpr const char* name = "fp64";
};

/// bf16 weights and saved activations; float32 parameter and activation
/// gradients, master weights and optimizer state; float32 accumulation in
/// every GEMM and reduction (Micikevicius et al. 2018, "Mixed Precision
/// Training", with bf16 needing no loss scaling). On a GPU, whose GEMMs and
/// attention take bf16 operands, a float32 activation gradient is rounded
/// to bf16 where it enters one (and kept float32 in the residual stream).
struct bf16_mixed {
  using param_type = bf16;
  using grad_type = float;
  using act_grad_type = float;
  using master_type = float;
  using accum_type = float;
  using rope_type = float;
  static constexpr const char* name = "bf16_mixed";
};

/// As bf16_mixed, but activation gradients are bf16 too (what autocast
/// gives in PyTorch, where a gradient has its activation's dtype): half the
/// backward's activation-gradient bytes, and on a GPU no conversions around
/// the bf16 GEMMs and attention kernels. Parameter gradients stay float32.
struct bf16_mixed_bf16_grads {
  using param_type = bf16;
  using grad_type = float;
  using act_grad_type = bf16;
  using master_type = float;
  using accum_type = float;
  using rope_type = float;
  static constexpr const char* name = "bf16_mixed_bf16_grads";
};

/// fp16 weights, saved activations and activation gradients; float32
/// parameter gradients (reduced in float32), master weights, optimizer
/// state and accumulation (Micikevicius et al. 2018, "Mixed Precision
/// Training": fp16 storage, fp32 master weights, loss scaling). fp16 keeps
/// 11 significant bits against bf16's 8, but its range ends at 65504 and
/// its smallest subnormal is 2^-24: the backward runs under a loss scale
/// (the loss multiplied before backward, the gradients unscaled once
/// before the norm), moved by a dynamic loss scaler that skips a step with
/// a non-finite gradient (precision/loss_scaler.hpp). Attention scores, the
/// softmax, norms and the cross-entropy accumulate in float32 (accum_type),
/// so they do not overflow fp16.
struct fp16_mixed {
  using param_type = fp16;
  using grad_type = float;
  using act_grad_type = fp16;
  using master_type = float;
  using accum_type = float;
  using rope_type = float;
  static constexpr const char* name = "fp16_mixed";
  static constexpr bool loss_scaled = true;
};

/// bf16_mixed with FP8 GEMMs in the seven linear layers of every
/// transformer block (q, k, v, o, gate, up, down), as Transformer Engine,
/// Megatron-Core and torchao train: each GEMM's operands (the input x, the
/// weight W, the output gradient dy) are cast to FP8 with per-tensor float32
/// scales (precision/fp8_scaling.hpp: an fp8_recipe picks delayed or
/// current scaling and the formats, E4M3 forward and E5M2 gradients by
/// default), multiplied exactly and accumulated in float32 (nn/fp8_linear.hpp).
/// Everything else (norms, attention and its softmax, the embedding, the LM
/// head and the cross-entropy) stays as bf16_mixed; parameters are stored
/// bf16, gradients, master weights and optimizer state are float32. It
/// trains on the host backend, whose GEMMs are the float GEMMs of the
/// dequantised operands (the reference semantics of an FP8 GEMM); a
/// trainer<fp8_mixed, cuda> does not compile, naming the policies the cuda
/// backend trains.
/// Source: Micikevicius et al. 2022, "FP8 Formats for Deep Learning".
struct fp8_mixed {
  using param_type = bf16;
  using grad_type = float;
  using act_grad_type = float;
  using master_type = float;
  using accum_type = float;
  using rope_type = float;
  static constexpr const char* name = "fp8_mixed";
  static constexpr bool fp8_linear = true;
};

/// True when `P` runs its backward under a loss scale (P::loss_scaled).
template <class P>
inline constexpr bool loss_scaled = [] {
  if constexpr (requires { P::loss_scaled; })
    return static_cast<bool>(P::loss_scaled);
  else
    return false;
}();

/// True when `P` runs the transformer blocks' linear layers as FP8 GEMMs
/// (P::fp8_linear): their operands cast to FP8 under the run's fp8_recipe.
template <class P>
inline constexpr bool fp8_linear = [] {
  if constexpr (requires { P::fp8_linear; })
    return static_cast<bool>(P::fp8_linear);
  else
    return false;
}();

/// The policy a command line's precision name stands for: the short names
/// "bf16", "fp16" and "fp8" give "bf16_mixed", "fp16_mixed" and
/// "fp8_mixed"; any other name is returned as it is (the caller checks it
/// where it looks it up).
inline std::string policy_name(std::string_view name) {
  if (name == "bf16") return bf16_mixed::name;
  if (name == "fp16") return fp16_mixed::name;
  if (name == "fp8") return fp8_mixed::name;
  return std::string(name);
}

static_assert(policy<fp32> && policy<fp64> && policy<bf16_mixed> && policy<bf16_mixed_bf16_grads> &&
              policy<fp16_mixed> && policy<fp8_mixed>);
static_assert(loss_scaled<fp16_mixed> && !loss_scaled<bf16_mixed> && !loss_scaled<fp8_mixed>);
static_assert(fp8_linear<fp8_mixed> && !fp8_linear<bf16_mixed> && !fp8_linear<fp16_mixed>);

}  // namespace tessera::precision
