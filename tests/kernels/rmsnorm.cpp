// Tests of include/tessera/kernels/rmsnorm.hpp: forward against a float64
// reference (float64, float32, and bf16 on the same rounded inputs), backward
// against float64 central finite differences, the accumulate flags, and
// bit-for-bit independence of the thread count.

#include "tessera/kernels/rmsnorm.hpp"

#include <omp.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <cstring>
#include <random>
#include <vector>

#include "kernel_testing.hpp"

namespace test_kernels_rmsnorm {

using namespace tessera;
using namespace tessera::kernels;
using namespace tessera::testing;

namespace {
constexpr double kEps = 1e-5;

struct fwd_ref {
  std::vector<double> out, rstd;
};
fwd_ref reference(const std::vector<double>& x, const std::vector<double>& w, std::int64_t N,
                  std::int64_t H, double eps) {
  fwd_ref r{std::vector<double>(N * H), std::vector<double>(N)};
  for (std::int64_t n = 0; n < N; ++n) {
    long double ss = 0;
    for (std::int64_t h = 0; h < H; ++h)
      ss += static_cast<long double>(x[n * H + h]) * x[n * H + h];
    const double rstd = static_cast<double>(1.0L / std::sqrt(ss / H + eps));
    r.rstd[n] = rstd;
    for (std::int64_t h = 0; h < H; ++h) r.out[n * H + h] = w[h] * x[n * H + h] * rstd;
  }
  return r;
}

// Checks forward of T against the float64 reference on the same (rounded)
// inputs: |out - ref| <= (rel_out + (1 + rel_out) rel_acc) |ref|, same for rstd.
template <class T>
void check_forward(double rel_out, double rel_acc) {
  std::mt19937_64 rng(123);
  const std::int64_t N = 9, H = 131;
  auto x = random_vector<T>(N * H, rng, -2, 2);
  auto w = random_vector<T>(H, rng, 0.5, 1.5);
  std::vector<T> out(N * H);
  std::vector<accum_t<T>> rstd(N);
  poison(out);
  poison(rstd);
  rmsnorm_forward(ctx, out.data(), rstd.data(), x.data(), w.data(), N, H, kEps);
  CHECK(first_nan(out) == -1);
  CHECK(first_nan(rstd) == -1);
  const auto ref = reference(to_double(x), to_double(w), N, H, kEps);
  for (std::int64_t n = 0; n < N; ++n)
    REQUIRE(std::fabs(rstd[n] - ref.rstd[n]) <= rel_acc * ref.rstd[n]);
  for (std::size_t i = 0; i < out.size(); ++i) {
    const double tol = (rel_out + (1 + rel_out) * rel_acc) * std::fabs(ref.out[i]);
    REQUIRE(std::fabs(as_double(out[i]) - ref.out[i]) <= tol);
  }
}
}  // namespace

TEST_CASE("rmsnorm_forward matches a float64 reference", "[kernels][rmsnorm]") {
  // Accumulation-type error: the sum of H squares (positive terms, (H-1) u),
  // the mean, eps, sqrt and reciprocal (about H/2 + 3 u on rstd), then two
  // products: under (H + 8) u relative. H = 131.
  SECTION("double") {
    check_forward<double>(0.0, 139 * 1.1102230246251565e-16);
  }
  SECTION("float") {
    check_forward<float>(0.0, 139 * u_f32);
  }
  SECTION("bf16 on the same rounded inputs") {
    check_forward<bf16>(u_bf16, 139 * u_f32);  // + one bf16 rounding of out
  }
}

TEST_CASE("rmsnorm_backward matches float64 finite differences", "[kernels][rmsnorm]") {
  std::mt19937_64 rng(99);
  const std::int64_t N = 3, H = 70;  // H crosses the 64-column block of the dweight reduction
  auto x = random_vector<double>(N * H, rng, -2, 2);
  auto w = random_vector<double>(H, rng, 0.5, 1.5);
  auto w_out = random_vector<double>(N * H, rng);
  std::vector<double> out(N * H), rstd(N);
  auto loss = [&] {
    rmsnorm_forward(ctx, out.data(), rstd.data(), x.data(), w.data(), N, H, kEps);
    return weighted_sum(out, w_out);
  };
  loss();
  std::vector<double> dinp(N * H);
  poison(dinp);
  auto dw0 = random_vector<double>(H, rng);
  auto dw = dw0;
  rmsnorm_backward(ctx, dinp.data(), dw.data(), w_out.data(), x.data(), w.data(), rstd.data(), N, H);
  CHECK(first_nan(dinp) == -1);
  std::vector<double> dw_only(H);
  for (std::int64_t h = 0; h < H; ++h) dw_only[h] = dw[h] - dw0[h];
  CHECK(fd_max_error(x, loss, dinp) < 1e-6);
  CHECK(fd_max_error(w, loss, dw_only) < 1e-6);

  SECTION("accumulate_dinp adds into dinp") {
    auto base = random_vector<double>(N * H, rng);
    auto acc = base;
    std::vector<double> dw2(H, 0.0);
    rmsnorm_backward(ctx, acc.data(), dw2.data(), w_out.data(), x.data(), w.data(), rstd.data(), N, H,
                     true);
    // Equal up to one rounding: with -march=native the compiler may fuse the
    // kernel's final multiply and add (FMA), which the reference does not.
    for (std::size_t i = 0; i < acc.size(); ++i)
      CHECK(std::abs(acc[i] - (base[i] + dinp[i])) <=
            4 * std::numeric_limits<double>::epsilon() * (std::abs(base[i]) + std::abs(dinp[i])));
  }
}

TEST_CASE("rmsnorm_backward with bf16 storage matches float64 of the rounded inputs",
          "[kernels][rmsnorm]") {
  std::mt19937_64 rng(5);
  const std::int64_t N = 6, H = 96;
  auto x = random_vector<bf16>(N * H, rng, -2, 2);
  auto w = random_vector<bf16>(H, rng, 0.5, 1.5);
  auto dy = random_vector<float>(N * H, rng);
  std::vector<bf16> out(N * H);
  std::vector<float> rstd(N), dinp(N * H), dw(H, 0.0f);
  rmsnorm_forward(ctx, out.data(), rstd.data(), x.data(), w.data(), N, H, kEps);
  poison(dinp);
  rmsnorm_backward(ctx, dinp.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), N, H);
  CHECK(first_nan(dinp) == -1);
  // Float64 reference from the same bf16 inputs and float dout, using the
  // float64 rstd. Error scale: each term is float32 with (H + 8) u relative
  // error of the |.|-sums it is built from.
  const auto xd = to_double(x), wd = to_double(w);
  const auto ref = reference(xd, wd, N, H, kEps);
  std::vector<double> dw_ref(H, 0.0), dw_scale(H, 0.0);
  for (std::int64_t n = 0; n < N; ++n) {
    const double r = ref.rstd[n];
    double dot = 0, dot_abs = 0;
    for (std::int64_t h = 0; h < H; ++h) {
      const double t = wd[h] * dy[n * H + h] * xd[n * H + h] * r;
      dot += t;
      dot_abs += std::fabs(t);
    }
    for (std::int64_t h = 0; h < H; ++h) {
      const double xh = xd[n * H + h] * r;
      const double g = r * (wd[h] * dy[n * H + h] - xh * dot / H);
      const double scale = r * (std::fabs(wd[h] * dy[n * H + h]) + std::fabs(xh) * dot_abs / H);
      REQUIRE(std::fabs(dinp[n * H + h] - g) <= (2 * H + 16) * u_f32 * scale);
      dw_ref[h] += dy[n * H + h] * xh;
      dw_scale[h] += std::fabs(dy[n * H + h] * xh);
    }
  }
  for (std::int64_t h = 0; h < H; ++h)
    REQUIRE(std::fabs(dw[h] - dw_ref[h]) <= (H + N + 8) * u_f32 * dw_scale[h]);
}

TEST_CASE("rmsnorm is independent of the thread count", "[kernels][rmsnorm]") {
  std::mt19937_64 rng(8);
  const std::int64_t N = 50, H = 200;
  auto x = random_vector<float>(N * H, rng), w = random_vector<float>(H, rng);
  auto dy = random_vector<float>(N * H, rng);
  std::vector<std::vector<float>> outs, dinps, dws;
  const int saved = omp_get_max_threads();
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    std::vector<float> out(N * H), rstd(N), dinp(N * H), dw(H, 0.5f);
    rmsnorm_forward(ctx, out.data(), rstd.data(), x.data(), w.data(), N, H, kEps);
    rmsnorm_backward(ctx, dinp.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), N, H);
    outs.push_back(out);
    dinps.push_back(dinp);
    dws.push_back(dw);
  }
  omp_set_num_threads(saved);
  for (int i : {1, 2}) {
    CHECK(outs[0] == outs[i]);
    CHECK(dinps[0] == dinps[i]);
    CHECK(dws[0] == dws[i]);
  }
}

TEST_CASE("rmsnorm rejects bad sizes and eps", "[kernels][rmsnorm]") {
  std::vector<float> a(8), r(2);
  CHECK_THROWS_AS(rmsnorm_forward(ctx, a.data(), r.data(), a.data(), a.data(), 2, 0, 1e-5),
                  config_error);
  CHECK_THROWS_AS(rmsnorm_forward(ctx, a.data(), r.data(), a.data(), a.data(), 2, 4, -1.0),
                  config_error);
  CHECK_THROWS_AS(
      rmsnorm_backward(ctx, a.data(), a.data(), a.data(), a.data(), a.data(), r.data(), -1, 4),
      config_error);
}

}  // namespace test_kernels_rmsnorm
