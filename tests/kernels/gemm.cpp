// Tests of include/tessera/kernels/gemm.hpp: gemm / gemm_mixed against a naive
// float64 triple loop over every transpose, odd and non-square sizes, padded
// leading dimensions; the linear-layer wrappers against the same reference and
// against float64 central finite differences.

#include "tessera/kernels/gemm.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernel_testing.hpp"

namespace test_kernels_gemm {

using namespace tessera;
using namespace tessera::kernels;
using namespace tessera::testing;

namespace {

struct ref_result {
  std::vector<double> c;      // (M, ldc) reference values
  std::vector<double> scale;  // |alpha| sum_k |a b| + |beta c|: the rounding-error scale
};

// C(M,N) = alpha op(A) op(B) + beta C in float64, naive triple loop.
ref_result reference(transpose ta, transpose tb, std::int64_t M, std::int64_t N, std::int64_t K,
                     double alpha, const std::vector<double>& A, std::int64_t lda,
                     const std::vector<double>& B, std::int64_t ldb, double beta,
                     const std::vector<double>& C, std::int64_t ldc) {
  ref_result r{C, std::vector<double>(C.size(), 0.0)};
  for (std::int64_t i = 0; i < M; ++i)
    for (std::int64_t j = 0; j < N; ++j) {
      double s = 0, sa = 0;
      for (std::int64_t k = 0; k < K; ++k) {
        const double a = ta == transpose::no ? A[i * lda + k] : A[k * lda + i];
        const double b = tb == transpose::no ? B[k * ldb + j] : B[j * ldb + k];
        s += a * b;
        sa += std::fabs(a * b);
      }
      const double c = beta == 0 ? 0.0 : C[i * ldc + j];
      r.c[i * ldc + j] = alpha * s + beta * c;
      r.scale[i * ldc + j] = std::fabs(alpha) * sa + std::fabs(beta * c);
    }
  return r;
}

// Runs gemm<TA,TB,TC> on random inputs with padded leading dimensions and
// checks |C - ref| <= rel_out * |ref| + rel_acc * scale for every element,
// that padding is untouched, and (beta == 0) that NaN in C is never read.
template <class TA, class TB, class TC>
void check_gemm(transpose ta, transpose tb, std::int64_t M, std::int64_t N, std::int64_t K,
                double beta, double rel_out, double rel_acc_per_k, std::uint64_t seed,
                double alpha = 0.75) {
  std::mt19937_64 rng(seed);
  const std::int64_t pad = 3;
  const std::int64_t a_rows = ta == transpose::no ? M : K, a_cols = ta == transpose::no ? K : M;
  const std::int64_t b_rows = tb == transpose::no ? K : N, b_cols = tb == transpose::no ? N : K;
  const std::int64_t lda = a_cols + pad, ldb = b_cols + pad, ldc = N + pad;
  auto A = random_vector<TA>(static_cast<std::size_t>(a_rows * lda), rng);
  auto B = random_vector<TB>(static_cast<std::size_t>(b_rows * ldb), rng);
  auto C = random_vector<TC>(static_cast<std::size_t>(M * ldc), rng);
  const TC sentinel = to<TC>(12345.0);
  for (std::int64_t i = 0; i < M; ++i)
    for (std::int64_t j = N; j < ldc; ++j) C[i * ldc + j] = sentinel;
  if (beta == 0)
    for (std::int64_t i = 0; i < M; ++i)
      for (std::int64_t j = 0; j < N; ++j) C[i * ldc + j] = nan_value<TC>();
  const auto ref = reference(ta, tb, M, N, K, alpha, to_double(A), lda, to_double(B), ldb, beta,
                             to_double(C), ldc);
  gemm(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
  // Accumulation error bound: (K + 2) roundings (K terms, alpha, beta) of the
  // compute type, each relative to the absolute-value sum (Higham, Accuracy and
  // Stability, eq. 3.5: |fl(x.y) - x.y| <= gamma_K |x|.|y|).
  const double rel_acc = rel_acc_per_k * static_cast<double>(K + 2);
  int bad = 0;
  for (std::int64_t i = 0; i < M; ++i) {
    for (std::int64_t j = 0; j < ldc; ++j) {
      const auto idx = static_cast<std::size_t>(i * ldc + j);
      const double got = as_double(C[idx]);
      if (j >= N) {
        if (got != as_double(sentinel)) ++bad;
        continue;
      }
      const double tol = rel_out * std::fabs(ref.c[idx]) + (1 + rel_out) * rel_acc * ref.scale[idx];
      if (!(std::fabs(got - ref.c[idx]) <= tol)) {
        if (bad++ < 5)
          FAIL_CHECK("C(" << i << "," << j << ") = " << got << ", reference " << ref.c[idx]
                          << ", tolerance " << tol);
      }
    }
  }
  CHECK(bad == 0);
}

const std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>> kSizes = {
    {1, 1, 1}, {7, 5, 3}, {33, 17, 29}, {64, 65, 127}, {5, 1, 9}, {1, 40, 2}, {19, 23, 0}};
const transpose kOps[] = {transpose::no, transpose::yes};

template <class TA, class TB, class TC>
void check_all(double rel_out, double rel_acc_per_k, double alpha = 0.75) {
  std::uint64_t seed = 100;
  for (auto [M, N, K] : kSizes)
    for (auto ta : kOps)
      for (auto tb : kOps)
        for (double beta : {0.0, -0.5, 1.0}) {
          INFO("M=" << M << " N=" << N << " K=" << K << " ta=" << (ta == transpose::yes)
                    << " tb=" << (tb == transpose::yes) << " beta=" << beta
                    << " alpha=" << alpha);
          check_gemm<TA, TB, TC>(ta, tb, M, N, K, beta, rel_out, rel_acc_per_k, ++seed, alpha);
        }
}

// Whether /proc/cpuinfo lists `flag` (whole word).
bool cpu_flag(const std::string& flag) {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("flags", 0) == 0) return (line + " ").find(" " + flag + " ") != std::string::npos;
  return false;
}

}  // namespace

TEST_CASE("gemm float matches a float64 triple loop", "[kernels][gemm]") {
  // float32: 1e-5 relative to the absolute-value sum (the float32 tolerance of
  // DESIGN.md; the worst-case bound (K+2) 2^-24 is below it for K <= 127).
  check_all<float, float, float>(0.0, 1e-5 / 129);
}

TEST_CASE("gemm double matches a float64 triple loop", "[kernels][gemm]") {
  // float64: 1e-12 relative to the absolute-value sum.
  check_all<double, double, double>(0.0, 1e-12 / 129);
}

TEST_CASE("gemm bf16 matches float64 on the same rounded inputs", "[kernels][gemm]") {
  // float32 accumulation: (K+2) 2^-24 of the absolute-value sum; bf16 output:
  // one rounding, 2^-8 relative.
  SECTION("bf16 x bf16 -> bf16") {
    check_all<bf16, bf16, bf16>(u_bf16, u_f32);
  }
  SECTION("bf16 x bf16 -> float") {
    check_all<bf16, bf16, float>(0.0, u_f32);
  }
  SECTION("float x bf16 -> float (dinp = dout . W)") {
    check_all<float, bf16, float>(0.0, u_f32);
  }
  SECTION("bf16 x float -> float") {
    check_all<bf16, float, float>(0.0, u_f32);
  }
  SECTION("float x float -> bf16") {
    check_all<float, float, bf16>(u_bf16, u_f32);
  }
}

TEST_CASE("bf16 x bf16 GEMMs on oneDNN's native bf16 matmul match float64", "[kernels][gemm]") {
  // alpha = 1: the calls oneDNN takes where it is built in and the CPU has
  // bf16 dot products (the tests above, alpha 0.75, take convert + sgemm).
  const std::string engine = kernels::detail::bf16_gemm_engine();
  INFO("bf16 GEMM engine: " << engine);
#if defined(TESSERA_HAS_ONEDNN)
  if (cpu_flag("avx512_bf16") || cpu_flag("amx_bf16")) CHECK(engine.rfind("oneDNN ", 0) == 0);
#else
  CHECK(engine == "convert + sgemm");
#endif
  SECTION("bf16 x bf16 -> bf16") { check_all<bf16, bf16, bf16>(u_bf16, u_f32, 1.0); }
  SECTION("bf16 x bf16 -> float") { check_all<bf16, bf16, float>(0.0, u_f32, 1.0); }
  SECTION("a model-sized call, each transpose") {
    for (auto ta : kOps)
      for (auto tb : kOps) check_gemm<bf16, bf16, float>(ta, tb, 300, 200, 130, 1.0, 0.0, u_f32, 9, 1.0);
  }
  SECTION("the same bits on every call") {
    std::mt19937_64 rng(3);
    auto a = random_vector<bf16>(257 * 130, rng), b = random_vector<bf16>(130 * 96, rng);
    std::vector<float> c1(257 * 96), c2(c1.size());
    for (auto* c : {&c1, &c2})
      gemm(transpose::no, transpose::yes, 257, 96, 130, 1.0f, a.data(), 130, b.data(), 130, 0.0f,
           c->data(), 96);
    CHECK(std::memcmp(c1.data(), c2.data(), c1.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("gemm with a double operand computes in double", "[kernels][gemm]") {
  static_assert(std::is_same_v<gemm_compute_t<float, double, double>, double>);
  static_assert(std::is_same_v<gemm_compute_t<bf16, bf16, float>, float>);
  check_all<float, double, double>(0.0, 1e-12 / 129);
  check_all<bf16, double, double>(0.0, 1e-12 / 129);
}

TEST_CASE("gemm rejects bad sizes and leading dimensions", "[kernels][gemm]") {
  std::vector<float> a(100), b(100), c(100);
  CHECK_THROWS_AS(gemm<float>(transpose::no, transpose::no, -1, 2, 2, 1, a.data(), 2, b.data(), 2,
                              0, c.data(), 2),
                  config_error);
  CHECK_THROWS_AS(gemm<float>(transpose::no, transpose::no, 3, 4, 5, 1, a.data(), 4, b.data(), 4, 0,
                              c.data(), 4),
                  config_error);  // lda=4 < K=5
  CHECK_THROWS_AS(gemm<float>(transpose::yes, transpose::no, 3, 4, 5, 1, a.data(), 2, b.data(), 4,
                              0, c.data(), 4),
                  config_error);  // A^T stored K x M: lda=2 < M=3
  CHECK_THROWS_AS(gemm<float>(transpose::no, transpose::no, 3, 4, 5, 1, a.data(), 5, b.data(), 4, 0,
                              c.data(), 3),
                  config_error);  // ldc=3 < N=4
  CHECK_THROWS_WITH(gemm<float>(transpose::no, transpose::no, 3, 4, 5, 1, a.data(), 4, b.data(), 4,
                                0, c.data(), 4),
                    Catch::Contains("lda=4"));
}

TEST_CASE("gemm_flops is 2MNK", "[kernels][gemm]") {
  CHECK(gemm_flops(3, 5, 7) == 210.0);
  CHECK(gemm_flops(4096, 11008, 4096) == 2.0 * 4096 * 11008 * 4096);
}

TEST_CASE("gemm workspace is reused and can be released", "[kernels][gemm]") {
  gemm_release_workspace();
  CHECK(gemm_workspace_bytes() == 0);
  std::mt19937_64 rng(7);
  // bf16 x float: converted on every build (bf16 x bf16 may run on oneDNN)
  auto a = random_vector<bf16>(20 * 30, rng);
  auto b = random_vector<float>(30 * 10, rng);
  std::vector<float> c(20 * 10);
  gemm(transpose::no, transpose::no, 20, 10, 30, 1.0f, a.data(), 30, b.data(), 10, 0.0f, c.data(),
       10);
  const auto bytes = gemm_workspace_bytes();
  CHECK(bytes == 20 * 30 * sizeof(float));
  gemm(transpose::no, transpose::no, 10, 10, 30, 1.0f, a.data(), 30, b.data(), 10, 0.0f, c.data(),
       10);
  CHECK(gemm_workspace_bytes() == bytes);  // smaller call: no growth
  gemm_release_workspace();
  CHECK(gemm_workspace_bytes() == 0);
}

// ---- linear layer ------------------------------------------------------------------------

template <class T>
void check_linear_forward(double rel_out, double rel_acc_per_k) {
  std::mt19937_64 rng(42);
  const std::int64_t M = 13, N = 21, K = 37;
  auto inp = random_vector<T>(M * K, rng), w = random_vector<T>(N * K, rng);
  std::vector<T> out(M * N);
  poison(out);
  linear_forward(ctx, out.data(), inp.data(), w.data(), M, N, K);
  CHECK(first_nan(out) == -1);
  const auto ref = reference(transpose::no, transpose::yes, M, N, K, 1.0, to_double(inp), K,
                             to_double(w), K, 0.0, std::vector<double>(M * N), N);
  for (std::size_t i = 0; i < out.size(); ++i) {
    const double tol =
        rel_out * std::fabs(ref.c[i]) + (1 + rel_out) * rel_acc_per_k * (K + 1) * ref.scale[i];
    REQUIRE(std::fabs(as_double(out[i]) - ref.c[i]) <= tol);
  }
}

TEST_CASE("linear_forward matches out = inp . W^T", "[kernels][gemm][linear]") {
  check_linear_forward<double>(0.0, 1e-12 / 40);
  check_linear_forward<float>(0.0, 1e-5 / 40);
  check_linear_forward<bf16>(u_bf16, u_f32);  // float32 accumulation, one bf16 rounding
}

TEST_CASE("linear backward matches float64 finite differences", "[kernels][gemm][linear]") {
  std::mt19937_64 rng(2024);
  const std::int64_t M = 5, N = 7, K = 9;
  auto inp = random_vector<double>(M * K, rng), w = random_vector<double>(N * K, rng);
  auto w_out = random_vector<double>(M * N, rng);
  std::vector<double> out(M * N);
  auto loss = [&] {
    linear_forward(ctx, out.data(), inp.data(), w.data(), M, N, K);
    return weighted_sum(out, w_out);
  };
  // dL/dout = w_out.
  std::vector<double> dinp(M * K);
  poison(dinp);
  linear_backward_input(ctx, dinp.data(), w_out.data(), w.data(), M, N, K);
  CHECK(first_nan(dinp) == -1);
  auto dw0 = random_vector<double>(N * K, rng);  // parameter gradients accumulate
  auto dw = dw0;
  linear_backward_weight(ctx, dw.data(), w_out.data(), inp.data(), M, N, K);
  std::vector<double> dw_only(N * K);
  for (std::size_t i = 0; i < dw.size(); ++i) dw_only[i] = dw[i] - dw0[i];
  CHECK(fd_max_error(inp, loss, dinp) < 1e-6);
  CHECK(fd_max_error(w, loss, dw_only) < 1e-6);

  SECTION("accumulate adds into dinp") {
    auto base = random_vector<double>(M * K, rng);
    auto acc = base;
    linear_backward_input(ctx, acc.data(), w_out.data(), w.data(), M, N, K, true);
    for (std::size_t i = 0; i < acc.size(); ++i)
      CHECK(acc[i] == Approx(base[i] + dinp[i]).epsilon(1e-13).margin(1e-14));
  }
}

TEST_CASE("linear backward with bf16 storage matches float64 of the rounded inputs",
          "[kernels][gemm][linear]") {
  std::mt19937_64 rng(77);
  const std::int64_t M = 11, N = 6, K = 15;
  auto inp = random_vector<bf16>(M * K, rng), w = random_vector<bf16>(N * K, rng);
  auto dout = random_vector<float>(M * N, rng);
  std::vector<float> dinp(M * K);
  poison(dinp);
  linear_backward_input(ctx, dinp.data(), dout.data(), w.data(), M, N, K);
  CHECK(first_nan(dinp) == -1);
  auto dw = random_vector<float>(N * K, rng);
  const auto dw0 = to_double(dw);
  linear_backward_weight(ctx, dw.data(), dout.data(), inp.data(), M, N, K);
  const auto rdinp = reference(transpose::no, transpose::no, M, K, N, 1.0, to_double(dout), N,
                               to_double(w), K, 0.0, std::vector<double>(M * K), K);
  const auto rdw = reference(transpose::yes, transpose::no, N, K, M, 1.0, to_double(dout), N,
                             to_double(inp), K, 1.0, dw0, K);
  // float32 accumulation of N (resp. M + 1) terms, relative to the |.|-sum.
  for (std::size_t i = 0; i < dinp.size(); ++i)
    REQUIRE(std::fabs(dinp[i] - rdinp.c[i]) <= (N + 2) * u_f32 * rdinp.scale[i]);
  for (std::size_t i = 0; i < dw.size(); ++i)
    REQUIRE(std::fabs(dw[i] - rdw.c[i]) <= (M + 2) * u_f32 * rdw.scale[i]);
}

}  // namespace test_kernels_gemm
