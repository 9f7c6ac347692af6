// Tests of include/tessera/kernels/swiglu.hpp: forward against a float64
// reference (float64, float32, bf16 on the same rounded inputs), backward
// against float64 central finite differences and, for float, the float64
// analytic gradient; saturation far from 0.

#include "tessera/kernels/swiglu.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "kernel_testing.hpp"

namespace test_kernels_swiglu {

using namespace tessera;
using namespace tessera::kernels;
using namespace tessera::testing;

namespace {
long double silu_ref(long double g) {
  return g / (1.0L + std::exp(-g));
}

// expf (< 1 ulp in glibc), 1 + e, the division and the product with up: each
// one rounding of the accumulation type, and a relative error in exp(-g)
// reaches silu damped by e/(1+e) < 1. So 6 u relative, then one rounding to
// storage.
template <class T>
void check_forward(double rel_out, double u_acc) {
  std::mt19937_64 rng(2);
  const std::int64_t n = 1001;
  auto g = random_vector<T>(n, rng, -8, 8), u = random_vector<T>(n, rng, -2, 2);
  std::vector<T> out(n);
  poison(out);
  swiglu_forward(ctx, out.data(), g.data(), u.data(), n);
  CHECK(first_nan(out) == -1);
  for (std::int64_t i = 0; i < n; ++i) {
    const double ref = static_cast<double>(silu_ref(as_double(g[i])) * as_double(u[i]));
    REQUIRE(std::fabs(as_double(out[i]) - ref) <=
            (rel_out + (1 + rel_out) * 6 * u_acc) * std::fabs(ref));
  }
}
}  // namespace

TEST_CASE("swiglu_forward matches a float64 reference", "[kernels][swiglu]") {
  SECTION("double") {
    check_forward<double>(0.0, 1.1102230246251565e-16);
  }
  SECTION("float") {
    check_forward<float>(0.0, u_f32);
  }
  SECTION("bf16 on the same rounded inputs") {
    check_forward<bf16>(u_bf16, u_f32);
  }
}

TEST_CASE("swiglu_backward matches float64 finite differences", "[kernels][swiglu]") {
  std::mt19937_64 rng(23);
  const std::int64_t n = 257;
  auto g = random_vector<double>(n, rng, -6, 6), u = random_vector<double>(n, rng, -2, 2);
  auto w_out = random_vector<double>(n, rng);
  std::vector<double> out(n);
  auto loss = [&] {
    swiglu_forward(ctx, out.data(), g.data(), u.data(), n);
    return weighted_sum(out, w_out);
  };
  std::vector<double> dg(n), du(n);
  poison(dg);
  poison(du);
  swiglu_backward(ctx, dg.data(), du.data(), w_out.data(), g.data(), u.data(), n);
  CHECK(first_nan(dg) == -1);
  CHECK(first_nan(du) == -1);
  CHECK(fd_max_error(g, loss, dg) < 1e-6);
  CHECK(fd_max_error(u, loss, du) < 1e-6);
}

TEST_CASE("swiglu_backward in float and bf16 matches the float64 gradient", "[kernels][swiglu]") {
  std::mt19937_64 rng(29);
  const std::int64_t n = 513;
  auto gf = random_vector<bf16>(n, rng, -8, 8), uf = random_vector<bf16>(n, rng, -2, 2);
  auto dy = random_vector<float>(n, rng);
  std::vector<float> dg(n), du(n);
  poison(dg);
  poison(du);
  swiglu_backward(ctx, dg.data(), du.data(), dy.data(), gf.data(), uf.data(), n);
  for (std::int64_t i = 0; i < n; ++i) {
    const long double g = as_double(gf[i]), u = as_double(uf[i]), d = dy[i];
    const long double sig = 1.0L / (1.0L + std::exp(-g));
    const long double dg_ref = d * u * sig * (1 + g * (1 - sig));
    const long double du_ref = d * silu_ref(g);
    // float32: about 8 roundings, each relative to the |.| of the terms of
    // 1 + g (1 - sigma), which can cancel (near g = -1.28): scale by them.
    const long double dg_scale = std::fabs(d * u * sig) * (1 + std::fabs(g * (1 - sig)));
    REQUIRE(std::fabs(dg[i] - dg_ref) <= 12 * u_f32 * dg_scale);
    REQUIRE(std::fabs(du[i] - du_ref) <= 6 * u_f32 * std::fabs(du_ref));
  }
}

TEST_CASE("swiglu saturates without NaN far from 0", "[kernels][swiglu]") {
  std::vector<float> g = {-1000.f, -100.f, -88.f, 88.f, 100.f, 1000.f}, u(g.size(), 2.0f),
                     out(g.size()), dg(g.size()), du(g.size()), dy(g.size(), 1.0f);
  swiglu_forward(ctx, out.data(), g.data(), u.data(), static_cast<std::int64_t>(g.size()));
  swiglu_backward(ctx, dg.data(), du.data(), dy.data(), g.data(), u.data(),
                  static_cast<std::int64_t>(g.size()));
  for (std::size_t i = 0; i < g.size(); ++i) {
    INFO("g=" << g[i]);
    CHECK(std::isfinite(out[i]));
    CHECK(std::isfinite(dg[i]));
    CHECK(std::isfinite(du[i]));
    if (g[i] > 0) {
      CHECK(out[i] == 2 * g[i]);  // silu(g) = g for large g
      CHECK(dg[i] == 2.0f);
    } else {
      CHECK(std::fabs(out[i]) < 1e-30f);
      CHECK(std::fabs(dg[i]) < 1e-30f);
    }
  }
}

}  // namespace test_kernels_swiglu
