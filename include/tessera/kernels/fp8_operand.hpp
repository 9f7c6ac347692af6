#pragma once
/// \file kernels/fp8_operand.hpp
/// How an operand enters an FP8 GEMM (kernels::fp8_gemm, host in
/// kernels/fp8_gemm.hpp, GPU in kernels/cuda/ops.hpp): its format, and where
/// its scale and inverse scale live in the context's memory.
/// Source: Micikevicius et al. 2022, "FP8 Formats for Deep Learning"
/// (per-tensor scaling).

namespace tessera::kernels {

/// The operands of a linear layer's FP8 GEMMs: its input x, its weight W and
/// the gradient of its output dy. Each has its own scale and its own
/// workspace for its cast copy.
enum class fp8_role : int { x = 0, w = 1, dy = 2 };

/// One operand of an FP8 GEMM: its format, and where its scale lives.
struct fp8_operand {
  bool e5m2 = false;             ///< cast to E5M2 (a gradient under the hybrid format), else E4M3
  const float* scale = nullptr;  ///< the cast's scale s (context memory; finite > 0)
  float* inverse = nullptr;      ///< receives 1/s (context memory): what the product multiplies by
  fp8_role role = fp8_role::x;   ///< which per-operand workspace holds the cast copy
};

}  // namespace tessera::kernels
