#pragma once
/// \file kernels/cuda/gemm_plan.hpp
/// What each cuBLASLt matmul is asked to compute, as plain values built
/// without the CUDA headers: the column-major cuBLASLt matmul that computes
/// a row-major GEMM (lt_matmul: transposes, operand layouts with their
/// leading dimensions, element types, the float32 compute and scale types).
/// The row-major GEMM of each linear-layer product is linear_gemm
/// (kernels/detail/gemm_args.hpp), shared with the host kernels.
/// kernels/cuda/gemm.cuh builds its descriptors from these values and only
/// from them, so a host test can interpret every descriptor the model builds
/// with a reference GEMM (tests/kernels/cuda_gemm_plan.cpp).
///
/// Row-major to column-major: a row-major C(M,N) occupies the same bytes as
/// the column-major C^T(N,M), and C^T = op(B)^T op(A)^T, so cuBLASLt is asked
/// for m = N, n = M with the operands swapped (its A is our B, its B our A)
/// and the transpose flags kept; leading dimensions are unchanged.
/// Source: the cuBLASLt documentation (cublasLtMatmul: D = alpha op(A) op(B)
/// + beta C, column-major; cublasLtMatrixLayoutCreate(type, rows, cols, ld)).

#include <compare>
#include <cstdint>
#include <type_traits>

#include "tessera/core/numeric.hpp"
#include "tessera/kernels/detail/gemm_args.hpp"

namespace tessera::kernels::cuda {

/// Element types of a cuBLASLt layout (CUDA_R_32F, CUDA_R_16BF, CUDA_R_16F,
/// CUDA_R_8F_E4M3, CUDA_R_8F_E5M2).
enum class lt_dtype { f32, bf16, f16, e4m3, e5m2 };

/// The lt_dtype of T in {float, bf16, fp16, fp8_e4m3, fp8_e5m2}.
template <class T>
constexpr lt_dtype lt_dtype_of() {
  if constexpr (std::is_same_v<T, bf16>)
    return lt_dtype::bf16;
  else if constexpr (std::is_same_v<T, fp16>)
    return lt_dtype::f16;
  else if constexpr (std::is_same_v<T, fp8_e4m3>)
    return lt_dtype::e4m3;
  else if constexpr (std::is_same_v<T, fp8_e5m2>)
    return lt_dtype::e5m2;
  else {
    static_assert(std::is_same_v<T, float>,
                  "cuBLASLt GEMM types: bf16, fp16, float, fp8_e4m3 or fp8_e5m2");
    return lt_dtype::f32;
  }
}

/// Bytes of one element of `t`.
constexpr std::int64_t lt_dtype_bytes(lt_dtype t) {
  return t == lt_dtype::f32 ? 4 : (t == lt_dtype::e4m3 || t == lt_dtype::e5m2) ? 1 : 2;
}

/// The name of `t` in messages.
constexpr const char* lt_dtype_name(lt_dtype t) {
  switch (t) {
    case lt_dtype::bf16:
      return "bf16";
    case lt_dtype::f16:
      return "fp16";
    case lt_dtype::e4m3:
      return "fp8_e4m3";
    case lt_dtype::e5m2:
      return "fp8_e5m2";
    case lt_dtype::f32:
      break;
  }
  return "float";
}

/// A column-major matrix as cublasLtMatrixLayoutCreate takes it: `rows` x
/// `cols` elements of `type`, element (i, j) at i + j * ld.
struct lt_layout {
  lt_dtype type = lt_dtype::f32;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::int64_t ld = 0;
  constexpr auto operator<=>(const lt_layout&) const = default;
};

/// One cublasLtMatmul, column-major: D(m,n) = alpha op(A)(m,k) op(B)(k,n) +
/// beta C, with D = C in place; op(X) = X^T when trans_x. Compute type
/// CUBLAS_COMPUTE_32F and scale type float: float32 accumulation, float
/// alpha and beta, no TF32 for float operands. `a` and `b` are the layouts
/// as stored (before op).
struct lt_matmul {
  bool trans_a = false;  ///< CUBLASLT_MATMUL_DESC_TRANSA
  bool trans_b = false;  ///< CUBLASLT_MATMUL_DESC_TRANSB
  std::int64_t m = 0, n = 0, k = 0;
  lt_layout a, b, c;  ///< cuBLASLt's A, B, and C = D
  constexpr auto operator<=>(const lt_matmul&) const = default;
};

/// The cuBLASLt matmul computing the row-major C(M,N) = alpha op(A)(M,K)
/// op(B)(K,N) + beta C of kernels::gemm's conventions (op(A) stored M x K
/// with lda >= K, or K x M with lda >= M; likewise B; ldc >= N). cuBLASLt's
/// A is our B and its B our A (file comment). Throws config_error as
/// kernels::gemm for bad sizes, and for K < 1 (cuBLASLt has no k = 0 matmul).
inline lt_matmul row_major_matmul(transpose ta, transpose tb, std::int64_t M, std::int64_t N,
                                  std::int64_t K, std::int64_t lda, std::int64_t ldb,
                                  std::int64_t ldc, lt_dtype a_type, lt_dtype b_type,
                                  lt_dtype c_type) {
  kernels::detail::check_gemm_args(ta, tb, M, N, K, lda, ldb, ldc);
  TESSERA_THROW_IF(K < 1, config_error, "gemm (cuda): K=", K,
                   " must be >= 1 (cuBLASLt has no k = 0 matmul)");
  const bool a_t = ta == transpose::yes, b_t = tb == transpose::yes;
  lt_matmul p;
  p.trans_a = b_t;  // cuBLASLt's A is our B
  p.trans_b = a_t;
  p.m = N;
  p.n = M;
  p.k = K;
  // Our B stored row-major K x N (N x K when transposed) is column-major N x K (K x N).
  p.a = {b_type, b_t ? K : N, b_t ? N : K, ldb};
  // Our A stored row-major M x K (K x M) is column-major K x M (M x K).
  p.b = {a_type, a_t ? M : K, a_t ? K : M, lda};
  p.c = {c_type, N, M, ldc};
  return p;
}

/// row_major_matmul with A and B of one type `ab`.
inline lt_matmul row_major_matmul(transpose ta, transpose tb, std::int64_t M, std::int64_t N,
                                  std::int64_t K, std::int64_t lda, std::int64_t ldb,
                                  std::int64_t ldc, lt_dtype ab, lt_dtype c_type) {
  return row_major_matmul(ta, tb, M, N, K, lda, ldb, ldc, ab, ab, c_type);
}

/// The cuBLASLt FP8 matmul computing the row-major C(M,N) = alpha A(M,K)
/// B(N,K)^T + beta C, A and B FP8 (lda, ldb >= K), the form of a linear
/// layer's forward (C = x W^T). cuBLASLt's FP8 matmuls take only the "TN"
/// layout (its A transposed, its B not), which is exactly this product
/// under the row-major mapping (file comment); the two backward products
/// are put in this form by transposed FP8 copies of their operands
/// (Transformer Engine's cast-transpose). The dequantisation scales
/// (CUBLASLT_MATMUL_DESC_A/B_SCALE_POINTER) multiply alpha at run time and
/// are not part of the descriptor.
/// Refused with config_error (besides row_major_matmul's refusals):
/// - A or B not E4M3 or E5M2, or both E5M2 (cuBLASLt has no E5M2 x E5M2);
/// - C not bf16, fp16 or float;
/// - K, lda or ldb not a multiple of 16, or ldc * sizeof(C) not a multiple
///   of 16 (FP8 matmuls need 16-byte aligned rows).
/// Source: the cuBLASLt documentation, cublasLtMatmul, "FP8 requirements".
inline lt_matmul row_major_fp8_matmul(std::int64_t M, std::int64_t N, std::int64_t K,
                                      std::int64_t lda, std::int64_t ldb, std::int64_t ldc,
                                      lt_dtype a_type, lt_dtype b_type, lt_dtype c_type) {
  auto fp8 = [](lt_dtype t) { return t == lt_dtype::e4m3 || t == lt_dtype::e5m2; };
  TESSERA_THROW_IF(!fp8(a_type) || !fp8(b_type), config_error, "fp8 gemm (cuda): operands ",
                   lt_dtype_name(a_type), " x ", lt_dtype_name(b_type),
                   " must be fp8_e4m3 or fp8_e5m2");
  TESSERA_THROW_IF(a_type == lt_dtype::e5m2 && b_type == lt_dtype::e5m2, config_error,
                   "fp8 gemm (cuda): fp8_e5m2 x fp8_e5m2 has no cuBLASLt matmul (one operand "
                   "must be fp8_e4m3)");
  TESSERA_THROW_IF(fp8(c_type), config_error, "fp8 gemm (cuda): output ", lt_dtype_name(c_type),
                   " must be bf16, fp16 or float");
  TESSERA_THROW_IF(K % 16 != 0 || lda % 16 != 0 || ldb % 16 != 0, config_error,
                   "fp8 gemm (cuda): K=", K, " lda=", lda, " ldb=", ldb,
                   " must be multiples of 16 (cuBLASLt's FP8 matmul needs 16-byte aligned rows)");
  TESSERA_THROW_IF(ldc * lt_dtype_bytes(c_type) % 16 != 0, config_error, "fp8 gemm (cuda): ldc=",
                   ldc, " of ", lt_dtype_name(c_type),
                   " is not 16-byte aligned (a multiple of ", 16 / lt_dtype_bytes(c_type), ")");
  return row_major_matmul(transpose::no, transpose::yes, M, N, K, lda, ldb, ldc, a_type, b_type,
                          c_type);
}

}  // namespace tessera::kernels::cuda
