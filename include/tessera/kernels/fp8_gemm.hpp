#pragma once
/// \file kernels/fp8_gemm.hpp
/// The FP8 GEMM of a linear layer on the host: each operand cast to FP8
/// with its per-tensor scale s (q = fp8(a s), saturating) and multiplied by
/// 1/s (â = float(q) (1/s): kernels::fp8_round_trip), then the float GEMM
/// of the two (float32 accumulation), the output rounded once. This is the
/// reference semantics an FP8 GEMM has: cuBLASLt's FP8 matmul on the GPU
/// (the cuda_context overload in kernels/cuda/ops.hpp) multiplies the raw
/// FP8 values exactly, accumulates in float32 and multiplies by the two
/// inverse scales, which equals this to float32 summation order.
///
/// The scales are read from, and the inverse scales written to, the
/// context's memory (host memory here, device memory on the GPU), so that
/// code written once against a context (nn::fp8_linear) never reads a
/// device value on the host.
///
/// Sources: Micikevicius et al. 2022, "FP8 Formats for Deep Learning";
/// Transformer Engine's cuBLASLt GEMM (scale and scale-inverse per tensor).

#include <cstddef>
#include <cstdint>

#include "tessera/core/error.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/kernels/context.hpp"
#include "tessera/kernels/fp8.hpp"
#include "tessera/kernels/fp8_operand.hpp"
#include "tessera/kernels/gemm.hpp"

namespace tessera::kernels {

namespace detail {

/// The host's grow-only per-thread float buffers of the cast copies, one per
/// fp8_role (slots of the GEMM's workspace family past the GEMM's own).
template <int Role>
using fp8_operand_buffer = gemm_workspace<float, 16 + Role>;

inline float* fp8_operand_copy(fp8_role r, std::size_t n) {
  switch (r) {
    case fp8_role::x:
      return fp8_operand_buffer<0>::get(n);
    case fp8_role::w:
      return fp8_operand_buffer<1>::get(n);
    case fp8_role::dy:
      break;
  }
  return fp8_operand_buffer<2>::get(n);
}

// The FP8 round trip of a contiguous operand of n elements into its role's
// buffer, with *o.scale; writes *o.inverse.
template <class T>
const float* fp8_cast_copy(const host_context& ctx, const T* a, std::int64_t n,
                           const fp8_operand& o) {
  float* out = fp8_operand_copy(o.role, static_cast<std::size_t>(n));
  if (o.e5m2)
    fp8_round_trip<fp8_e5m2>(ctx, out, a, n, *o.scale);
  else
    fp8_round_trip<fp8_e4m3>(ctx, out, a, n, *o.scale);
  *o.inverse = 1.0f / *o.scale;
  return out;
}

}  // namespace detail

/// Bytes of FP8 operand copies the calling thread holds (grow-only until
/// fp8_release_workspace): float copies of the largest x, W and dy.
inline std::size_t fp8_workspace_bytes() {
  return detail::fp8_operand_buffer<0>::bytes() + detail::fp8_operand_buffer<1>::bytes() +
         detail::fp8_operand_buffer<2>::bytes();
}
/// Frees the calling thread's FP8 operand copies.
inline void fp8_release_workspace() {
  detail::fp8_operand_buffer<0>::release();
  detail::fp8_operand_buffer<1>::release();
  detail::fp8_operand_buffer<2>::release();
}

/// Row-major C(M,N) = â(op(A)) b̂(op(B)) + beta C with kernels::gemm's
/// transposes, where â is A cast to FP8 with *a.scale and back (file
/// comment), b̂ likewise: op(A) is A stored M x K (lda == K) or, with ta,
/// K x M (lda == M); likewise B (ldb == N, or K with tb); ldc >= N.
/// TA, TB in {float, bf16, fp16}; TC in {float, bf16, fp16}. Writes
/// *a.inverse and *b.inverse. beta == 0 does not read C.
/// Throws config_error as detail::check_fp8_gemm_args (kernels::gemm's size
/// rules, K >= 1, contiguous operands, scale pointers, two roles, not both
/// E5M2), or for a scale that is not finite > 0.
template <class TC, class TA, class TB>
void fp8_gemm(const host_context& ctx, transpose ta, transpose tb, std::int64_t M, std::int64_t N,
              std::int64_t K, const TA* A, std::int64_t lda, const fp8_operand& a, const TB* B,
              std::int64_t ldb, const fp8_operand& b, float beta, TC* C, std::int64_t ldc) {
  detail::check_fp8_gemm_args("fp8_gemm", ta, tb, M, N, K, lda, ldb, ldc, a, b);
  const float* ah = detail::fp8_cast_copy(ctx, A, M * K, a);
  const float* bh = detail::fp8_cast_copy(ctx, B, N * K, b);
  gemm_mixed<float, float, TC>(ta, tb, M, N, K, 1.0f, ah, lda, bh, ldb, beta, C, ldc);
}

}  // namespace tessera::kernels
