// cuBLASLt GEMMs (include/tessera/kernels/cuda/gemm.cuh) against a float64
// reference of the same bf16 inputs: every transpose pair, odd sizes, wide
// leading dimensions, float and bf16 outputs, and the three linear-layer
// products with the gradient contract (weight gradient accumulates).
// Skipped without a device (main.cpp).
#include <tessera/kernels/cuda/gemm.cuh>
#include <tessera/kernels/fp8.hpp>

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

// ---- FP8 (cublaslt_context::gemm_fp8) ----------------------------------------------------------

namespace {

// FP8 copies of random bf16 values at `scale` (the host kernel's scaled
// cast), and their dequantised values in float64: q * (1/scale) in float, as
// the GPU multiplies.
template <class F8>
struct fp8_operand {
  std::vector<F8> q;
  std::vector<double> value;
  float scale;
  fp8_operand(std::size_t n, double range, float scale_factor, std::mt19937_64& rng) {
    const tessera::kernels::host_context h{};
    std::vector<bf16> x(n);
    std::uniform_real_distribution<double> u(-range, range);
    for (auto& v : x) v = tessera::to<bf16>(u(rng));
    scale = static_cast<float>(F8::max_finite) /
            tessera::kernels::fp8_amax(h, x.data(), static_cast<std::int64_t>(n)) * scale_factor;
    q.resize(n);
    tessera::kernels::fp8_quantize(h, q.data(), x.data(), static_cast<std::int64_t>(n), scale);
    value.resize(n);
    for (std::size_t i = 0; i < n; ++i)
      value[i] = static_cast<double>(static_cast<float>(q[i]) * (1.0f / scale));
  }
};

// C(M,N) = A(M,K) B(N,K)^T + beta C0 in float64 from dequantised values, and sum |a b|.
void fp8_ref(std::vector<double>& C, std::vector<double>& scale, std::int64_t M, std::int64_t N,
             std::int64_t K, const std::vector<double>& A, const std::vector<double>& B,
             double beta, const std::vector<float>& C0) {
  C.assign(static_cast<std::size_t>(M * N), 0);
  scale.assign(C.size(), 0);
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t n = 0; n < N; ++n) {
      double s = 0, a_s = 0;
      for (std::int64_t k = 0; k < K; ++k) {
        const double t = A[static_cast<std::size_t>(m * K + k)] * B[static_cast<std::size_t>(n * K + k)];
        s += t;
        a_s += std::abs(t);
      }
      const std::size_t i = static_cast<std::size_t>(m * N + n);
      const double c0 = beta != 0 ? double(C0[i]) : 0.0;
      C[i] = s + beta * c0;
      scale[i] = a_s + std::abs(beta * c0);
    }
}

template <class FA, class FB>
void check_fp8_gemm(std::int64_t M, std::int64_t N, std::int64_t K, std::mt19937_64& rng) {
  INFO(tessera::dtype_name<FA>() << " x " << tessera::dtype_name<FB>() << " M=" << M << " N=" << N
                                 << " K=" << K);
  tessera::cuda::stream s;
  kc::cublaslt_context ctx;
  const fp8_operand<FA> a(static_cast<std::size_t>(M * K), 2.0, 0.8f, rng);
  const fp8_operand<FB> b(static_cast<std::size_t>(N * K), 0.05, 0.6f, rng);
  const std::vector<float> inv{1.0f / a.scale, 1.0f / b.scale};
  auto d_a = to_device(a.q);
  auto d_b = to_device(b.q);
  auto d_inv = to_device(inv);
  std::vector<double> want, sc;

  // bf16 output, beta 0 (C poisoned), with the output's amax.
  fp8_ref(want, sc, M, N, K, a.value, b.value, 0.0, {});
  auto d_y = poisoned_device<bf16>(static_cast<std::size_t>(M * N));
  auto d_amax = to_device(std::vector<float>{-1.0f});
  ctx.gemm_fp8(M, N, K, d_a.data(), K, d_inv.data(), d_b.data(), K, d_inv.data() + 1, 0.0f,
               d_y.data(), N, s, d_amax.data());
  s.synchronize();
  CHECK(gemm_error(to_host(d_y), N, want, sc, M, N, bf16_tol) <= 1.0);
  double amax = 0;
  for (double v : want) amax = std::max(amax, std::abs(v));
  // cuBLASLt may take the amax before or after D's rounding to bf16.
  CHECK(std::abs(double(to_host(d_amax)[0]) - amax) <= std::ldexp(1.0, -8) * amax);

  // float output accumulating (the weight gradient's contract), twice.
  const auto c0 = random_vector<float>(static_cast<std::size_t>(M * N), rng);
  auto d_c = to_device(c0);
  ctx.gemm_fp8(M, N, K, d_a.data(), K, d_inv.data(), d_b.data(), K, d_inv.data() + 1, 1.0f,
               d_c.data(), N, s);
  ctx.gemm_fp8(M, N, K, d_a.data(), K, d_inv.data(), d_b.data(), K, d_inv.data() + 1, 1.0f,
               d_c.data(), N, s);
  s.synchronize();
  std::vector<double> want2 = want;
  for (std::size_t i = 0; i < want2.size(); ++i) {
    want2[i] = 2 * want[i] + double(c0[i]);
    sc[i] = 2 * sc[i] + std::abs(double(c0[i]));
  }
  CHECK(gemm_error(to_host(d_c), N, want2, sc, M, N, 0.0) <= 1.0);
}

}  // namespace

TEST_CASE("cuda gemm: FP8 matmuls (E4M3 and E5M2) with scale pointers and amax against float64",
          "[cuda][gemm][fp8]") {
  std::mt19937_64 rng(208);
  if (!has_fp8_tensor_cores()) {
    // cuBLASLt has no FP8 matmul before sm_89: a clear error, not garbage.
    tessera::cuda::stream s;
    kc::cublaslt_context ctx;
    auto d_q = to_device(std::vector<tessera::fp8_e4m3>(256));
    auto d_y = to_device(std::vector<bf16>(256));
    auto d_one = to_device(std::vector<float>{1.0f});
    CHECK_THROWS_AS(ctx.gemm_fp8(16, 16, 16, d_q.data(), 16, d_one.data(), d_q.data(), 16,
                                 d_one.data(), 0.0f, d_y.data(), 16, s),
                    tessera::cuda_error);
    return;
  }
  check_fp8_gemm<tessera::fp8_e4m3, tessera::fp8_e4m3>(128, 256, 512, rng);
  check_fp8_gemm<tessera::fp8_e5m2, tessera::fp8_e4m3>(64, 96, 160, rng);  // gradients x E4M3
  check_fp8_gemm<tessera::fp8_e4m3, tessera::fp8_e5m2>(48, 32, 64, rng);
}
