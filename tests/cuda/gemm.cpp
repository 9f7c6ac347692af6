// cuBLASLt GEMMs (include/tessera/kernels/cuda/gemm.cuh) against a float64
// reference of the same bf16 inputs: every transpose pair, odd sizes, wide
// leading dimensions, float and bf16 outputs, and the three linear-layer
// products with the gradient contract (weight gradient accumulates).
// Skipped without a device (main.cpp).
#include <tessera/kernels/cuda/gemm.cuh>

#include "cuda_testing.hpp"

namespace kc = tessera::kernels::cuda;
using tessera::bf16;
using tessera::kernels::transpose;
using namespace tessera::testing;

namespace {

/// C = alpha op(A) op(B) + beta C in float64, row-major; also returns, per
/// element, sum_k |a b| (the scale of the float32 accumulation error).
template <class TA, class TC>
void gemm_ref(std::vector<double>& C, std::vector<double>& scale, transpose ta, transpose tb,
              std::int64_t M, std::int64_t N, std::int64_t K, double alpha,
              const std::vector<TA>& A, std::int64_t lda, const std::vector<TA>& B,
              std::int64_t ldb, double beta, const std::vector<TC>& C0, std::int64_t ldc) {
  C.assign(static_cast<std::size_t>(M * N), 0);
  scale.assign(C.size(), 0);
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t n = 0; n < N; ++n) {
      double s = 0, a_s = 0;
      for (std::int64_t k = 0; k < K; ++k) {
        const double a = as_double(ta == transpose::no ? A[m * lda + k] : A[k * lda + m]);
        const double b = as_double(tb == transpose::no ? B[k * ldb + n] : B[n * ldb + k]);
        s += a * b;
        a_s += std::abs(a * b);
      }
      const double c0 = beta != 0 ? as_double(C0[m * ldc + n]) : 0.0;
      C[m * N + n] = alpha * s + beta * c0;
      scale[m * N + n] = std::abs(alpha) * a_s + std::abs(beta * c0);
    }
}

/// Largest |got - want| / bound, bound = rel * |want| + 1e-6 * scale: float32
/// accumulation of K products (each exact in float32) errs by at most about
/// K * 2^-24 * scale; 1e-6 covers K up to ~16 with the worst case and far
/// more in practice (random signs), and a bf16 output adds `rel` = 2^-8.
template <class TC>
double gemm_error(const std::vector<TC>& got, std::int64_t ldc, const std::vector<double>& want,
                  const std::vector<double>& scale, std::int64_t M, std::int64_t N, double rel) {
  double worst = 0;
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t n = 0; n < N; ++n) {
      const double g = as_double(got[m * ldc + n]), w = want[m * N + n];
      if (std::isnan(g)) return INFINITY;
      worst =
          std::max(worst, std::abs(g - w) / (rel * std::abs(w) + 1e-6 * scale[m * N + n] + 1e-30));
    }
  return worst;
}

}  // namespace

TEST_CASE("cuda gemm: every transpose pair, odd sizes and wide leading dimensions",
          "[cuda][gemm]") {
  std::mt19937_64 rng(201);
  tessera::cuda::stream s;
  kc::cublaslt_context ctx;
  const std::int64_t M = 37, N = 50, K = 72;
  for (transpose ta : {transpose::no, transpose::yes})
    for (transpose tb : {transpose::no, transpose::yes}) {
      INFO("ta=" << (ta == transpose::yes) << " tb=" << (tb == transpose::yes));
      const std::int64_t lda = (ta == transpose::no ? K : M) + 8;
      const std::int64_t ldb = (tb == transpose::no ? N : K) + 16;
      const std::int64_t ldc = N + 8;
      const auto A =
          random_vector<bf16>(static_cast<std::size_t>((ta == transpose::no ? M : K) * lda), rng);
      const auto B =
          random_vector<bf16>(static_cast<std::size_t>((tb == transpose::no ? K : N) * ldb), rng);
      const auto C0 = random_vector<float>(static_cast<std::size_t>(M * ldc), rng);
      std::vector<double> want, scale;
      gemm_ref(want, scale, ta, tb, M, N, K, 0.5, A, lda, B, ldb, 2.0, C0, ldc);
      auto dA = to_device(A), dB = to_device(B);
      auto dC = to_device(C0);
      ctx.gemm(ta, tb, M, N, K, 0.5f, dA.data(), lda, dB.data(), ldb, 2.0f, dC.data(), ldc, s);
      s.synchronize();
      CHECK(gemm_error(to_host(dC), ldc, want, scale, M, N, 0.0) <= 1.0);

      // bf16 output, beta = 0 (C is poisoned: must not be read).
      auto dCb = poisoned_device<bf16>(static_cast<std::size_t>(M * ldc));
      gemm_ref(want, scale, ta, tb, M, N, K, 1.0, A, lda, B, ldb, 0.0, C0, ldc);
      ctx.gemm(ta, tb, M, N, K, 1.0f, dA.data(), lda, dB.data(), ldb, 0.0f, dCb.data(), ldc, s);
      s.synchronize();
      CHECK(gemm_error(to_host(dCb), ldc, want, scale, M, N, bf16_tol) <= 1.0);
    }
  CHECK(ctx.cached_plans() == 8);
}

TEST_CASE("cuda linear layer: forward, input gradient, weight gradient accumulates",
          "[cuda][gemm]") {
  std::mt19937_64 rng(202);
  tessera::cuda::stream s;
  kc::cublaslt_context ctx;
  const std::int64_t M = 256, N = 384, K = 512;  // tokens, out features, in features
  const auto inp = random_vector<bf16>(static_cast<std::size_t>(M * K), rng);
  const auto w = random_vector<bf16>(static_cast<std::size_t>(N * K), rng);
  const auto dout = random_vector<bf16>(static_cast<std::size_t>(M * N), rng);
  const auto dw0 = random_vector<float>(static_cast<std::size_t>(N * K), rng);
  auto d_inp = to_device(inp), d_w = to_device(w), d_dout = to_device(dout);
  std::vector<double> want, scale;
  const std::vector<float> none;

  // out = inp W^T, float and bf16 outputs.
  gemm_ref(want, scale, transpose::no, transpose::yes, M, N, K, 1.0, inp, K, w, K, 0.0, none, N);
  auto d_out = poisoned_device<float>(static_cast<std::size_t>(M * N));
  auto d_outb = poisoned_device<bf16>(static_cast<std::size_t>(M * N));
  kc::linear_forward(ctx, d_out.data(), d_inp.data(), d_w.data(), M, N, K, s);
  kc::linear_forward(ctx, d_outb.data(), d_inp.data(), d_w.data(), M, N, K, s);
  s.synchronize();
  CHECK(gemm_error(to_host(d_out), N, want, scale, M, N, 0.0) <= 1.0);
  CHECK(gemm_error(to_host(d_outb), N, want, scale, M, N, bf16_tol) <= 1.0);

  // dinp = dout W.
  gemm_ref(want, scale, transpose::no, transpose::no, M, K, N, 1.0, dout, N, w, K, 0.0, none, K);
  auto d_dinp = poisoned_device<float>(static_cast<std::size_t>(M * K));
  kc::linear_backward_input(ctx, d_dinp.data(), d_dout.data(), d_w.data(), M, N, K, s);
  s.synchronize();
  CHECK(gemm_error(to_host(d_dinp), K, want, scale, M, K, 0.0) <= 1.0);

  // dW += dout^T inp, twice (two micro-batches accumulate).
  auto d_dw = to_device(dw0);
  kc::linear_backward_weight(ctx, d_dw.data(), d_dout.data(), d_inp.data(), M, N, K, s);
  kc::linear_backward_weight(ctx, d_dw.data(), d_dout.data(), d_inp.data(), M, N, K, s);
  s.synchronize();
  gemm_ref(want, scale, transpose::yes, transpose::no, N, K, M, 2.0, dout, N, inp, K, 1.0, dw0, K);
  CHECK(gemm_error(to_host(d_dw), K, want, scale, N, K, 0.0) <= 1.0);

  CHECK_THROWS_AS(ctx.gemm(transpose::no, transpose::no, M, N, 0, 1.0f, d_inp.data(), K, d_w.data(),
                           N, 0.0f, d_out.data(), N, s),
                  tessera::config_error);
}
