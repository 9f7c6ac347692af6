// Tests kernels/fp8_gemm.hpp, the host FP8 GEMM (the reference a GPU's FP8
// GEMM is held to): for every transpose pair, C = â(op(A)) b̂(op(B)) + beta C
// against float64 of operands cast independently with the core FP8 types
// (â = float(F8(a s)) (1/s) in float); the inverse scales written; the
// argument refusals shared with the GPU's (detail::check_fp8_gemm_args).
#include "tessera/kernels/fp8_gemm.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "kernel_testing.hpp"

namespace test_kernels_fp8_gemm {

using namespace tessera;
using kernels::fp8_operand;
using kernels::fp8_role;
using kernels::transpose;

namespace {

// float(F8(float(a) s)) * (1/s) in float, saturating: what the GEMM multiplies.
template <class F8, class T>
std::vector<double> cast(const std::vector<T>& a, float s) {
  std::vector<double> out(a.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    out[i] = static_cast<float>(F8(to<float>(a[i]) * s, fp8_saturation::finite)) * (1.0f / s);
  return out;
}

}  // namespace

TEST_CASE("fp8_gemm equals float64 on the cast operands for every transpose pair",
          "[kernels][fp8]") {
  const kernels::host_context ctx;
  const std::int64_t M = 7, N = 5, K = 9;
  std::mt19937_64 rng(17);
  for (transpose ta : {transpose::no, transpose::yes})
    for (transpose tb : {transpose::no, transpose::yes})
      for (bool e5m2 : {false, true}) {
        INFO("ta " << int(ta) << " tb " << int(tb) << (e5m2 ? " B E5M2" : " B E4M3"));
        const auto A = testing::random_vector<bf16>(static_cast<std::size_t>(M * K), rng, -3, 3);
        const auto B =
            testing::random_vector<float>(static_cast<std::size_t>(N * K), rng, -1e-3, 1e-3);
        auto C = testing::random_vector<float>(static_cast<std::size_t>(M * N), rng);
        const auto C0 = C;
        float sc[4] = {100.3f, 3.7e5f, 0, 0};  // scales (not powers of two), then inverses
        const fp8_operand a{false, &sc[0], &sc[2], fp8_role::x};
        const fp8_operand b{e5m2, &sc[1], &sc[3], fp8_role::dy};
        const std::int64_t lda = ta == transpose::no ? K : M, ldb = tb == transpose::no ? N : K;
        kernels::fp8_gemm(ctx, ta, tb, M, N, K, A.data(), lda, a, B.data(), ldb, b, 0.5f, C.data(),
                          N);
        CHECK(sc[2] == 1.0f / sc[0]);
        CHECK(sc[3] == 1.0f / sc[1]);
        const auto ah = cast<fp8_e4m3>(A, sc[0]);
        const auto bh = e5m2 ? cast<fp8_e5m2>(B, sc[1]) : cast<fp8_e4m3>(B, sc[1]);
        double worst = 0;
        for (std::int64_t m = 0; m < M; ++m)
          for (std::int64_t n = 0; n < N; ++n) {
            double s = 0, mag = 0;
            for (std::int64_t k = 0; k < K; ++k) {
              const double x = ta == transpose::no ? ah[m * K + k] : ah[k * M + m];
              const double y = tb == transpose::no ? bh[k * N + n] : bh[n * K + k];
              s += x * y;
              mag += std::abs(x * y);
            }
            const double want = s + 0.5 * C0[m * N + n];
            worst = std::max(worst, std::abs(C[m * N + n] - want) /
                                        (K * 6e-8 * mag + 6e-8 * std::abs(want) + 1e-30));
          }
        CHECK(worst <= 4.0);  // float32 accumulation of exact products
      }
}

TEST_CASE("fp8_gemm refuses what no FP8 GEMM computes, naming it", "[kernels][fp8][errors]") {
  const kernels::host_context ctx;
  std::vector<float> A(64, 1.0f), C(64);
  float sc[4] = {1, 1, 0, 0};
  const fp8_operand x{false, &sc[0], &sc[2], fp8_role::x};
  const fp8_operand w{false, &sc[1], &sc[3], fp8_role::w};
  auto run = [&](const fp8_operand& a, const fp8_operand& b, std::int64_t lda) {
    kernels::fp8_gemm(ctx, transpose::no, transpose::yes, 4, 4, 4, A.data(), lda, a, A.data(), 4, b,
                      0.0f, C.data(), 4);
  };
  CHECK_NOTHROW(run(x, w, 4));
  CHECK_THROWS_WITH(run(x, w, 8), Catch::Contains("lda=8 ldb=4 must be the rows' lengths 4 and 4"));
  CHECK_THROWS_WITH(run(x, x, 4), Catch::Contains("both operands have role 0"));
  fp8_operand e1 = x, e2 = w;
  e1.e5m2 = e2.e5m2 = true;
  CHECK_THROWS_WITH(run(e1, e2, 4), Catch::Contains("both operands are E5M2"));
  fp8_operand none = w;
  none.scale = nullptr;
  CHECK_THROWS_WITH(run(x, none, 4), Catch::Contains("no scale or inverse-scale pointer"));
  CHECK_THROWS_WITH(kernels::fp8_gemm(ctx, transpose::no, transpose::yes, 4, 4, 0, A.data(), 1, x,
                                      A.data(), 1, w, 0.0f, C.data(), 4),
                    Catch::Contains("K=0 must be >= 1"));
  sc[0] = 0.0f;  // a scale that is not finite > 0, checked where its value is on the host
  CHECK_THROWS_AS(run(x, w, 4), config_error);
}

}  // namespace test_kernels_fp8_gemm
