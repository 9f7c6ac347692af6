// Tests of include/tessera/kernels/rope.hpp: table accuracy against long
// double at long positions, forward against a float64 reference (float64,
// float32, bf16 on the same rounded inputs), the rotate-half convention, and
// the backward against float64 central finite differences.

#include "tessera/kernels/rope.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kernel_testing.hpp"

namespace test_kernels_rope {

using namespace tessera;
using namespace tessera::kernels;
using namespace tessera::testing;

TEST_CASE("rope_table is accurate at long positions", "[kernels][rope]") {
  const std::int64_t T = 8192, hd = 128, half = hd / 2;
  std::vector<float> c(T * half), s(T * half);
  for (double theta : {10000.0, 500000.0}) {
    INFO("theta=" << theta);
    rope_table(c.data(), s.data(), T, hd, theta);
    double worst = 0;
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t i = 0; i < half; ++i) {
        const long double f =
            std::pow(static_cast<long double>(theta), -2.0L * static_cast<long double>(i) / hd);
        const long double a = static_cast<long double>(t) * f;
        worst = std::max(worst, static_cast<double>(std::fabs(c[t * half + i] - std::cos(a))));
        worst = std::max(worst, static_cast<double>(std::fabs(s[t * half + i] - std::sin(a))));
      }
    // Requirement after bf16 model conversion: 5e-4. Float32 storage of a
    // value in [-1, 1] is within 2^-25 ~ 3e-8; the double angle at t = 8191 is
    // within ~1e-12: so 1e-7 holds with room.
    CHECK(worst < 1e-7);
    // Position 0 is the identity; i = 0 rotates by t radians.
    CHECK(c[0] == 1.0f);
    CHECK(s[0] == 0.0f);
    CHECK(c[8191 * half] == static_cast<float>(std::cos(8191.0)));
  }
}

TEST_CASE("rope_table from inverse frequencies: theta's give the theta tables bit for bit",
          "[kernels][rope]") {
  const std::int64_t T = 300, hd = 16, half = hd / 2;
  std::vector<double> f(half);
  for (std::int64_t i = 0; i < half; ++i) f[i] = kernels::detail::rope_inv_freq(i, hd, 500000.0);
  for (int pass = 0; pass < 2; ++pass) {
    std::vector<double> c1(T * half), s1(T * half), c2(T * half, -7.0), s2(T * half, -7.0);
    rope_table(c1.data(), s1.data(), T, hd, 500000.0);
    rope_table(c2.data(), s2.data(), T, hd, f.data());
    CHECK(c1 == c2);
    CHECK(s1 == s2);
    std::vector<float> c3(T * half), s3(T * half), c4(T * half), s4(T * half);
    rope_table(c3.data(), s3.data(), T, hd, 500000.0);
    rope_table(c4.data(), s4.data(), T, hd, f.data());
    CHECK(c3 == c4);
    CHECK(s3 == s4);
  }
  // Any frequencies: cos and sin of t f_i, in double.
  const std::vector<double> g = {1.0, 0.25, 3e-3, 1e-6};
  std::vector<double> c(T * 4), s(T * 4);
  rope_table(c.data(), s.data(), T, 8, g.data());
  for (std::int64_t t : {0, 1, 299})
    for (int i = 0; i < 4; ++i) {
      CHECK(c[t * 4 + i] == std::cos(static_cast<double>(t) * g[i]));
      CHECK(s[t * 4 + i] == std::sin(static_cast<double>(t) * g[i]));
    }
  std::vector<double> bad = {1.0, 0.0};
  CHECK_THROWS_WITH(rope_table(c.data(), s.data(), 4, 4, bad.data()),
                    Catch::Contains("inverse frequency 1 is 0, not finite and positive"));
  bad[1] = std::numeric_limits<double>::quiet_NaN();
  CHECK_THROWS_AS(rope_table(c.data(), s.data(), 4, 4, bad.data()), config_error);
}

TEST_CASE("rope_table rejects odd head dims and bad theta", "[kernels][rope]") {
  std::vector<float> c(64), s(64);
  CHECK_THROWS_AS(rope_table(c.data(), s.data(), 4, 7, 10000.0), config_error);
  CHECK_THROWS_WITH(rope_table(c.data(), s.data(), 4, 7, 10000.0), Catch::Contains("hd=7"));
  CHECK_THROWS_AS(rope_table(c.data(), s.data(), 4, 0, 10000.0), config_error);
  CHECK_THROWS_AS(rope_table(c.data(), s.data(), 4, 8, 0.0), config_error);
  std::vector<float> x(64);
  CHECK_THROWS_AS(rope_forward(ctx, x.data(), c.data(), s.data(), 1, 2, 1, 5), config_error);
  CHECK_THROWS_AS(rope_backward(ctx, x.data(), c.data(), s.data(), 1, 2, 1, 5), config_error);
}

namespace {
// Rotate-half reference in float64 with the same float32 tables.
std::vector<double> reference(const std::vector<double>& x, const std::vector<float>& c,
                              const std::vector<float>& s, std::int64_t B, std::int64_t T,
                              std::int64_t nh, std::int64_t hd, std::vector<double>* scale) {
  const std::int64_t half = hd / 2;
  std::vector<double> y(x.size());
  if (scale) scale->assign(x.size(), 0.0);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t h = 0; h < nh; ++h) {
        const std::int64_t o = ((b * T + t) * nh + h) * hd;
        for (std::int64_t i = 0; i < half; ++i) {
          const double cc = c[t * half + i], ss = s[t * half + i];
          const double x1 = x[o + i], x2 = x[o + i + half];
          y[o + i] = x1 * cc - x2 * ss;
          y[o + i + half] = x2 * cc + x1 * ss;
          if (scale) {
            (*scale)[o + i] = std::fabs(x1 * cc) + std::fabs(x2 * ss);
            (*scale)[o + i + half] = std::fabs(x2 * cc) + std::fabs(x1 * ss);
          }
        }
      }
  return y;
}

// |y - ref| <= rel_out |ref| + (1 + rel_out) rel_acc scale: two products and
// one add in the accumulation type (2 u of |x1 c| + |x2 s|), then one rounding
// to storage.
template <class Storage>
void check_forward(double rel_out, double u_acc) {
  std::mt19937_64 rng(31);
  const std::int64_t B = 2, T = 7, nh = 3, hd = 10;
  std::vector<float> c(T * hd / 2), s(T * hd / 2);
  rope_table(c.data(), s.data(), T, hd, 10000.0);
  auto x = random_vector<Storage>(B * T * nh * hd, rng);
  std::vector<double> scale;
  const auto ref = reference(to_double(x), c, s, B, T, nh, hd, &scale);
  rope_forward(ctx, x.data(), c.data(), s.data(), B, T, nh, hd);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double tol = rel_out * std::fabs(ref[i]) + (1 + rel_out) * 2 * u_acc * scale[i];
    REQUIRE(std::fabs(as_double(x[i]) - ref[i]) <= tol);
  }
}
}  // namespace

TEST_CASE("rope_forward matches the rotate-half reference", "[kernels][rope]") {
  SECTION("double") {
    check_forward<double>(0.0, 1.1102230246251565e-16);
  }
  SECTION("float") {
    check_forward<float>(0.0, u_f32);
  }
  SECTION("bf16 on the same rounded inputs") {
    check_forward<bf16>(u_bf16, u_f32);
  }
  SECTION("pairs are (i, i + hd/2) and t = 0 is the identity") {
    const std::int64_t T = 2, hd = 4;
    std::vector<float> c(T * 2), s(T * 2);
    rope_table(c.data(), s.data(), T, hd, 10000.0);
    // t = 0 unchanged; t = 1: pair 0 rotated by 1 rad, pair 1 by 10000^-0.5 rad.
    std::vector<double> x = {1, 2, 3, 4, 1, 0, 0, 0};
    rope_forward(ctx, x.data(), c.data(), s.data(), 1, T, 1, hd);
    CHECK(x[0] == 1);
    CHECK(x[3] == 4);
    CHECK(x[4] == Approx(std::cos(1.0)).epsilon(1e-7));  // x1 cos - x2 sin, x2 = 0
    CHECK(x[6] == Approx(std::sin(1.0)).epsilon(1e-7));  // x2 cos + x1 sin: lands at i + hd/2
    CHECK(x[5] == 0);
    CHECK(x[7] == 0);
  }
}

TEST_CASE("rope_backward matches float64 finite differences", "[kernels][rope]") {
  std::mt19937_64 rng(17);
  const std::int64_t B = 2, T = 5, nh = 2, hd = 8;
  std::vector<float> c(T * hd / 2), s(T * hd / 2);
  rope_table(c.data(), s.data(), T, hd, 500000.0);
  auto x = random_vector<double>(B * T * nh * hd, rng);
  auto w_out = random_vector<double>(x.size(), rng);
  std::vector<double> y(x.size());
  auto loss = [&] {
    y = x;
    rope_forward(ctx, y.data(), c.data(), s.data(), B, T, nh, hd);
    return weighted_sum(y, w_out);
  };
  auto dx = w_out;  // dL/dy, overwritten in place by dL/dx
  rope_backward(ctx, dx.data(), c.data(), s.data(), B, T, nh, hd);
  CHECK(fd_max_error(x, loss, dx) < 1e-6);
}

}  // namespace test_kernels_rope
