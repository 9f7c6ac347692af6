#pragma once
/// \file kernels/fp8_operand.hpp
/// How an operand enters an FP8 GEMM (kernels::fp8_gemm, host in
/// kernels/fp8_gemm.hpp, GPU in kernels/cuda/ops.hpp): its format, and where
/// its scale and inverse scale live in the context's memory.
/// Source: Micikevicius et al. 2022, "FP8 Formats for Deep Learning"
/// (per-tensor scaling).

#include <cstdint>

#include "tessera/core/error.hpp"
#include "tessera/kernels/detail/gemm_args.hpp"

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

namespace detail {

/// The arguments of an FP8 GEMM (kernels::fp8_gemm on either backend):
/// kernels::gemm's size rules, K >= 1, operands whose leading dimensions
/// are their rows' lengths (each is cast whole), both scale pointers, two
/// different roles (each role has one copy buffer) and not both E5M2 (no
/// FP8 matmul multiplies E5M2 by E5M2). Throws config_error naming `who`.
inline void check_fp8_gemm_args(const char* who, transpose ta, transpose tb, std::int64_t M,
                                std::int64_t N, std::int64_t K, std::int64_t lda, std::int64_t ldb,
                                std::int64_t ldc, const fp8_operand& a, const fp8_operand& b) {
  check_gemm_args(ta, tb, M, N, K, lda, ldb, ldc);
  TESSERA_THROW_IF(K < 1, config_error, who, ": K=", K, " must be >= 1");
  const std::int64_t a_row = ta == transpose::no ? K : M, b_row = tb == transpose::no ? N : K;
  TESSERA_THROW_IF(lda != a_row || ldb != b_row, config_error, who, ": lda=", lda, " ldb=", ldb,
                   " must be the rows' lengths ", a_row, " and ", b_row,
                   " (an FP8 operand is cast whole)");
  TESSERA_THROW_IF(!a.scale || !a.inverse || !b.scale || !b.inverse, config_error, who,
                   ": an operand has no scale or inverse-scale pointer");
  TESSERA_THROW_IF(a.role == b.role, config_error, who, ": both operands have role ",
                   static_cast<int>(a.role), " (each role has one copy buffer)");
  TESSERA_THROW_IF(a.e5m2 && b.e5m2, config_error, who,
                   ": both operands are E5M2 (no FP8 matmul multiplies E5M2 by E5M2; gradients "
                   "are E5M2, weights and inputs E4M3)");
}

}  // namespace detail

}  // namespace tessera::kernels
