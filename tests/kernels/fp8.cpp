// Tests the host FP8 scaling kernels (kernels/fp8.hpp) against independent
// computations: the amax against a float64 maximum (NaN and infinity
// included); the scaled cast against a nearest-even search over the 256
// values of the format, with saturation at the largest finite value; the
// dequantisation and the round trip against float64 products.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <tessera/core/random.hpp>
#include <tessera/kernels/fp8.hpp>

namespace test_kernels_fp8 {

using namespace tessera;

namespace {
// The nearest finite value of F8 to v (ties to the even bit pattern), or
// +-max beyond it: the saturating cast, found by search.
template <class F8>
double nearest(double v) {
  double best = 0, best_d = std::numeric_limits<double>::infinity();
  std::uint8_t best_b = 0;
  for (int b = 0; b < 256; ++b) {
    const double f = static_cast<float>(F8::from_bits(static_cast<std::uint8_t>(b)));
    if (!std::isfinite(f)) continue;
    const double d = std::fabs(f - v);
    if (d < best_d || (d == best_d && (b & 1) == 0 && (best_b & 1) == 1)) {
      best = f;
      best_d = d;
      best_b = static_cast<std::uint8_t>(b);
    }
  }
  return best;  // beyond +-max the nearest finite value is +-max: saturation
}
template <class T>
std::vector<T> random_values(std::int64_t n, std::uint64_t seed, double spread) {
  std::vector<T> x(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    seed = mix64(seed);
    const double u = static_cast<double>(seed >> 11) * 0x1p-53;  // [0, 1)
    const double mag = std::exp((u - 0.5) * spread);
    x[static_cast<std::size_t>(i)] = to<T>(((seed & 1) ? -1.0 : 1.0) * mag);
  }
  return x;
}
}  // namespace

TEMPLATE_TEST_CASE("fp8_amax is the float64 maximum of |x|, NaN and infinity kept", "[kernels][fp8]",
                   float, bf16, fp16, double) {
  kernels::host_context ctx;
  auto x = random_values<TestType>(1001, 7, 10);
  double want = 0;
  for (auto v : x) want = std::max(want, std::fabs(to<double>(v)));
  CHECK(kernels::fp8_amax(ctx, x.data(), 1001) == static_cast<float>(want));
  CHECK(kernels::fp8_amax(ctx, x.data(), 0) == 0.0f);
  x[500] = to<TestType>(-INFINITY);
  CHECK(kernels::fp8_amax(ctx, x.data(), 1001) == INFINITY);
  x[3] = to<TestType>(NAN);
  CHECK(std::isnan(kernels::fp8_amax(ctx, x.data(), 1001)));
  REQUIRE_THROWS_AS(kernels::fp8_amax(ctx, x.data(), -1), config_error);
}

TEMPLATE_TEST_CASE("fp8_quantize rounds x * scale to the nearest FP8 value and saturates",
                   "[kernels][fp8]", fp8_e4m3, fp8_e5m2) {
  using F8 = TestType;
  kernels::host_context ctx;
  const std::int64_t n = 4000;
  const auto x = random_values<float>(n, 11, 30);
  for (float scale : {1.0f, 0.37f, 448.0f / 3.1f, 1e-3f, 1e4f}) {
    INFO("scale " << scale);
    std::vector<F8> q(static_cast<std::size_t>(n));
    kernels::fp8_quantize(ctx, q.data(), x.data(), n, scale);
    std::int64_t wrong = 0, saturated = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const double v = static_cast<double>(x[static_cast<std::size_t>(i)] * scale);  // the float product
      const double got = static_cast<float>(q[static_cast<std::size_t>(i)]);
      wrong += got != nearest<F8>(v);
      saturated += std::fabs(v) > F8::max_finite;
    }
    CHECK(wrong == 0);
    if (scale == 1e4f) CHECK(saturated > 0);  // the saturation was exercised
    // Back again: float(q) * (1/scale), as a float64 product rounded once.
    std::vector<float> back(static_cast<std::size_t>(n)), trip(static_cast<std::size_t>(n));
    const float inv = 1.0f / scale;
    kernels::fp8_dequantize(ctx, back.data(), q.data(), n, inv);
    kernels::fp8_round_trip<F8>(ctx, trip.data(), x.data(), n, scale);
    for (std::int64_t i = 0; i < n; ++i) {
      const auto k = static_cast<std::size_t>(i);
      const float want = static_cast<float>(static_cast<double>(static_cast<float>(q[k])) * inv);
      wrong += back[k] != want || trip[k] != want;
    }
    CHECK(wrong == 0);
  }
  // A non-finite input stays non-finite (an overflow is never cast away).
  std::vector<F8> q(3);
  const float bad[3] = {NAN, INFINITY, -INFINITY};
  kernels::fp8_quantize(ctx, q.data(), bad, 3, 2.0f);
  for (const F8& v : q) CHECK(!std::isfinite(static_cast<float>(v)));
  float trip[3];
  kernels::fp8_round_trip<F8>(ctx, trip, bad, 3, 2.0f);
  for (float v : trip) CHECK(!std::isfinite(v));
  REQUIRE_THROWS_WITH(kernels::fp8_quantize(ctx, q.data(), x.data(), 1, 0.0f),
                      Catch::Contains("scale 0 must be a finite value > 0"));
}

}  // namespace test_kernels_fp8
