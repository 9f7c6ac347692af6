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

#include <cstdint>
#include <type_traits>

#include "tessera/core/numeric.hpp"
#include "tessera/kernels/detail/gemm_args.hpp"

namespace tessera::kernels::cuda {

/// Element types of a cuBLASLt layout (CUDA_R_32F, CUDA_R_16BF, CUDA_R_16F).
enum class lt_dtype { f32, bf16, f16 };

/// The lt_dtype of T in {float, bf16, fp16}.
template <class T>
constexpr lt_dtype lt_dtype_of() {
  if constexpr (std::is_same_v<T, bf16>)
    return lt_dtype::bf16;
  else if constexpr (std::is_same_v<T, fp16>)
    return lt_dtype::f16;
  else {
    static_assert(std::is_same_v<T, float>, "cuBLASLt GEMM types: bf16, fp16 or float");
    return lt_dtype::f32;
  }
}

/// A column-major matrix as cublasLtMatrixLayoutCreate takes it: `rows` x
/// `cols` elements of `type`, element (i, j) at i + j * ld.
struct lt_layout {
  lt_dtype type = lt_dtype::f32;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::int64_t ld = 0;
  constexpr bool operator==(const lt_layout&) const = default;
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
  constexpr bool operator==(const lt_matmul&) const = default;
};

/// The cuBLASLt matmul computing the row-major C(M,N) = alpha op(A)(M,K)
/// op(B)(K,N) + beta C of kernels::gemm's conventions (op(A) stored M x K
/// with lda >= K, or K x M with lda >= M; likewise B; ldc >= N). cuBLASLt's
/// A is our B and its B our A (file comment). Throws config_error as
/// kernels::gemm for bad sizes, and for K < 1 (cuBLASLt has no k = 0 matmul).
inline lt_matmul row_major_matmul(transpose ta, transpose tb, std::int64_t M, std::int64_t N,
                                  std::int64_t K, std::int64_t lda, std::int64_t ldb,
                                  std::int64_t ldc, lt_dtype ab, lt_dtype c_type) {
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
  p.a = {ab, b_t ? K : N, b_t ? N : K, ldb};
  // Our A stored row-major M x K (K x M) is column-major K x M (M x K).
  p.b = {ab, a_t ? M : K, a_t ? K : M, lda};
  p.c = {c_type, N, M, ldc};
  return p;
}

}  // namespace tessera::kernels::cuda
