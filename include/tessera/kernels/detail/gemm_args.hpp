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
