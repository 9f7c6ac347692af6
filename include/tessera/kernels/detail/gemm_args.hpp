#pragma once
/// \file kernels/detail/gemm_args.hpp
/// What every GEMM backend shares and none of them links: the transpose
/// flag, the FLOP count and the row-major argument rules. No BLAS header:
/// the CUDA GEMMs (kernels/cuda/gemm.cuh) include this, not kernels/gemm.hpp,
/// so no cblas.h reaches a CUDA translation unit.

#include <climits>
#include <cstdint>

#include "tessera/core/error.hpp"

namespace tessera::kernels {

/// Whether a GEMM operand is used as stored (`no`) or transposed (`yes`).
enum class transpose { no, yes };

/// Floating-point operations of one GEMM, C(M,N) += A(M,K) B(K,N): 2*M*N*K
/// (one multiply and one add per term). Used by the planner and for MFU.
inline double gemm_flops(std::int64_t M, std::int64_t N, std::int64_t K) {
  return 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
}

/// Which buffer a linear-layer GEMM reads as its A or B operand.
enum class linear_operand { input, weight, output_grad };

/// A linear layer's GEMM as a row-major call (kernels::gemm's arguments):
/// C = alpha op(A) op(B) + beta C, with the buffers A and B name. The host
/// kernels (kernels/gemm.hpp) and cuBLASLt (kernels/cuda/gemm.cuh) make the
/// same calls from these values.
struct linear_gemm {
  transpose ta = transpose::no, tb = transpose::no;
  std::int64_t M = 0, N = 0, K = 0;
  std::int64_t lda = 0, ldb = 0, ldc = 0;
  float alpha = 1.0f, beta = 0.0f;
  linear_operand a = linear_operand::input, b = linear_operand::weight;
};

/// Linear forward, y = x W^T: out(M,N) = inp(M,K) weight(N,K)^T, written.
constexpr linear_gemm linear_forward_gemm(std::int64_t M, std::int64_t N, std::int64_t K) {
  return {transpose::no, transpose::yes, M, N, K, K, K, N, 1.0f, 0.0f, linear_operand::input,
          linear_operand::weight};
}

/// Linear backward to the input: dinp(M,K) = dout(M,N) weight(N,K), written
/// (beta = 0) or added (beta = 1) when `accumulate`.
constexpr linear_gemm linear_backward_input_gemm(std::int64_t M, std::int64_t N, std::int64_t K,
                                                 bool accumulate) {
  return {transpose::no, transpose::no, M,    K,    N, N, K, K, 1.0f, accumulate ? 1.0f : 0.0f,
          linear_operand::output_grad,   linear_operand::weight};
}

/// Linear backward to the weight: dweight(N,K) += dout(M,N)^T inp(M,K)
/// (a parameter gradient: beta = 1).
constexpr linear_gemm linear_backward_weight_gemm(std::int64_t M, std::int64_t N, std::int64_t K) {
  return {transpose::yes, transpose::no, N, K, M, N, K, K, 1.0f, 1.0f, linear_operand::output_grad,
          linear_operand::input};
}

namespace detail {

/// Checks sizes and leading dimensions against the BLAS rules (row-major) and
/// the 32-bit `blasint` range; throws config_error naming the value.
inline void check_gemm_args(transpose ta, transpose tb, std::int64_t M, std::int64_t N,
                            std::int64_t K, std::int64_t lda, std::int64_t ldb, std::int64_t ldc) {
  TESSERA_THROW_IF(M < 0 || N < 0 || K < 0, config_error, "gemm: negative size M=", M, " N=", N,
                   " K=", K);
  const std::int64_t a_cols = ta == transpose::no ? K : M;
  const std::int64_t b_cols = tb == transpose::no ? N : K;
  auto max1 = [](std::int64_t x) { return x > 1 ? x : std::int64_t{1}; };
  TESSERA_THROW_IF(lda < max1(a_cols), config_error, "gemm: lda=", lda, " is below the row length ",
                   max1(a_cols), " of op(A)'s storage");
  TESSERA_THROW_IF(ldb < max1(b_cols), config_error, "gemm: ldb=", ldb, " is below the row length ",
                   max1(b_cols), " of op(B)'s storage");
  TESSERA_THROW_IF(ldc < max1(N), config_error, "gemm: ldc=", ldc, " is below N=", max1(N));
  const std::int64_t lim = INT_MAX;
  TESSERA_THROW_IF(M > lim || N > lim || K > lim || lda > lim || ldb > lim || ldc > lim,
                   config_error, "gemm: a size or leading dimension exceeds the BLAS int range ",
                   lim, " (M=", M, " N=", N, " K=", K, " lda=", lda, " ldb=", ldb, " ldc=", ldc,
                   ")");
}

}  // namespace detail
}  // namespace tessera::kernels
