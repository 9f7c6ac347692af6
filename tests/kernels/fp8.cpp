// Tests the host FP8 scaling kernels (kernels/fp8.hpp) against independent
// computations: the amax against a float64 maximum (NaN and infinity
// included); the scaled cast against a nearest-even search over the 256
// values of the format, with saturation at the largest finite value; the
// dequantisation and the round trip against float64 products. The forms
// that keep the scale and the amax in memory (the ones a cuda_context has
// too): the pointer-form cast against the by-value one, byte for byte; the
// transposed cast against a transpose of that; the amax accumulation against
// fp8_amax and the NaN-keeping maximum; the scale update against
// fp8_scale_of, keeping the previous scale where the amax is 0 or not finite.
#include <algorithm>
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
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

TEMPLATE_TEST_CASE("fp8_amax is the float64 maximum of |x|, +inf for NaN and infinity",
                   "[kernels][fp8]", float, bf16, fp16, double) {
  kernels::host_context ctx;
  auto x = random_values<TestType>(1001, 7, 10);
  double want = 0;
  for (auto v : x) want = std::max(want, std::fabs(to<double>(v)));
  CHECK(kernels::fp8_amax(ctx, x.data(), 1001) == static_cast<float>(want));
  CHECK(kernels::fp8_amax(ctx, x.data(), 0) == 0.0f);
  x[500] = to<TestType>(-INFINITY);
  CHECK(kernels::fp8_amax(ctx, x.data(), 1001) == INFINITY);
  x[3] = to<TestType>(NAN);
  x[500] = to<TestType>(1.0f);
  CHECK(kernels::fp8_amax(ctx, x.data(), 1001) == INFINITY);  // the NaN alone
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
      const double v =
          static_cast<double>(x[static_cast<std::size_t>(i)] * scale);  // the float product
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

TEMPLATE_TEST_CASE("fp8_quantize with the scale in memory casts as the by-value form",
                   "[kernels][fp8]", float, bf16, fp16, double) {
  kernels::host_context ctx;
  const std::int64_t n = 1001;
  auto x = random_values<TestType>(n, 21, 24);
  x[7] = to<TestType>(NAN);
  x[8] = to<TestType>(INFINITY);
  x[9] = to<TestType>(-INFINITY);
  for (const float scale : {0.37f, 3.0f, 448.0f / 5.3f, 1e4f}) {
    INFO("scale " << scale);
    const auto bytes_equal = [&]<class F8>(F8) {
      std::vector<F8> want(static_cast<std::size_t>(n)), got(want.size());
      kernels::fp8_quantize(ctx, want.data(), x.data(), n, scale);
      std::fill(got.begin(), got.end(), F8::from_bits(0x55));
      float inv = NAN;
      kernels::fp8_quantize(ctx, got.data(), &inv, x.data(), n, &scale);
      CHECK(std::memcmp(got.data(), want.data(), got.size()) == 0);
      CHECK(inv == 1.0f / scale);
      // No inverse asked for: the cast alone.
      std::fill(got.begin(), got.end(), F8::from_bits(0x55));
      kernels::fp8_quantize(ctx, got.data(), nullptr, x.data(), n, &scale);
      CHECK(std::memcmp(got.data(), want.data(), got.size()) == 0);
    };
    bytes_equal(fp8_e4m3{});
    bytes_equal(fp8_e5m2{});
  }
  // n = 0 still writes the inverse; the scale's value is checked on the host.
  fp8_e4m3 q[1];
  float inv = NAN;
  const float two = 2.0f, zero = 0.0f, inf = INFINITY;
  kernels::fp8_quantize(ctx, q, &inv, x.data(), 0, &two);
  CHECK(inv == 0.5f);
  REQUIRE_THROWS_WITH(kernels::fp8_quantize(ctx, q, &inv, x.data(), 1, &zero),
                      Catch::Contains("scale 0 must be a finite value > 0"));
  REQUIRE_THROWS_WITH(kernels::fp8_quantize(ctx, q, &inv, x.data(), 1, &inf),
                      Catch::Contains("must be a finite value > 0"));
  REQUIRE_THROWS_WITH(kernels::fp8_quantize(ctx, q, &inv, x.data(), -1, &two),
                      Catch::Contains("n=-1 must be >= 0"));
  REQUIRE_THROWS_WITH(kernels::fp8_quantize(ctx, q, &inv, x.data(), 1, nullptr),
                      Catch::Contains("scale is null"));
}

TEMPLATE_TEST_CASE("fp8_quantize_transposed is the transpose of fp8_quantize", "[kernels][fp8]",
                   fp8_e4m3, fp8_e5m2) {
  using F8 = TestType;
  kernels::host_context ctx;
  const float scale = 448.0f / 7.3f;
  for (auto [rows, cols] : {std::pair<std::int64_t, std::int64_t>{1, 1},
                            {1, 77},
                            {77, 1},
                            {32, 32},
                            {33, 65},
                            {100, 37},
                            {0, 5},
                            {5, 0}}) {
    INFO("rows " << rows << " cols " << cols);
    const auto x = random_values<bf16>(rows * cols, 31 + static_cast<std::uint64_t>(rows), 20);
    std::vector<F8> q(x.size()), qt(x.size());
    kernels::fp8_quantize(ctx, q.data(), x.data(), rows * cols, scale);
    std::fill(qt.begin(), qt.end(), F8::from_bits(0x7f));  // NaN in both formats: unwritten shows
    float inv = NAN;
    kernels::fp8_quantize_transposed(ctx, qt.data(), &inv, x.data(), rows, cols, &scale);
    CHECK(inv == 1.0f / scale);
    std::int64_t wrong = 0;
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t j = 0; j < cols; ++j)
        wrong += qt[static_cast<std::size_t>(j * rows + i)].bits !=
                 q[static_cast<std::size_t>(i * cols + j)].bits;
    CHECK(wrong == 0);
  }
  std::vector<F8> qt(4);
  const std::vector<float> x(4, 1.0f);
  const float zero = 0.0f;
  REQUIRE_THROWS_WITH(kernels::fp8_quantize_transposed(ctx, qt.data(), nullptr, x.data(), -1, 4, &scale),
                      Catch::Contains("rows=-1 and cols=4 must be >= 0"));
  REQUIRE_THROWS_WITH(
      kernels::fp8_quantize_transposed(ctx, qt.data(), nullptr, x.data(), std::int64_t(1) << 32,
                                       std::int64_t(1) << 32, &scale),
      Catch::Contains("overflow a 64-bit size"));
  REQUIRE_THROWS_WITH(kernels::fp8_quantize_transposed(ctx, qt.data(), nullptr, x.data(), 2, 2, &zero),
                      Catch::Contains("scale 0 must be a finite value > 0"));
  REQUIRE_THROWS_WITH(kernels::fp8_quantize_transposed(ctx, qt.data(), nullptr, x.data(), 2, 2, nullptr),
                      Catch::Contains("scale is null"));
}

TEMPLATE_TEST_CASE("fp8_amax_accumulate folds a buffer's amax into a running one, NaN as +inf",
                   "[kernels][fp8]", float, bf16, fp16, double) {
  kernels::host_context ctx;
  auto a = random_values<TestType>(513, 41, 10);
  auto b = random_values<TestType>(300, 43, 14);
  const float amax_a = kernels::fp8_amax(ctx, a.data(), 513);
  const float amax_b = kernels::fp8_amax(ctx, b.data(), 300);
  float amax = 0.0f;
  kernels::fp8_amax_accumulate(ctx, &amax, a.data(), 513);
  CHECK(amax == amax_a);
  kernels::fp8_amax_accumulate(ctx, &amax, b.data(), 300);
  CHECK(amax == std::max(amax_a, amax_b));
  // A running amax above the buffer's stays; n = 0 leaves it as it is.
  amax = 1e30f;
  kernels::fp8_amax_accumulate(ctx, &amax, a.data(), 513);
  CHECK(amax == 1e30f);
  amax = -1.0f;
  kernels::fp8_amax_accumulate(ctx, &amax, a.data(), 0);
  CHECK(amax == -1.0f);
  // A NaN gives +inf (a finite running amax does not hide it), and a NaN
  // running amax becomes +inf: an amax is never NaN.
  amax = 1e30f;
  a[100] = to<TestType>(NAN);
  kernels::fp8_amax_accumulate(ctx, &amax, a.data(), 513);
  CHECK(amax == INFINITY);
  kernels::fp8_amax_accumulate(ctx, &amax, b.data(), 300);
  CHECK(amax == INFINITY);
  amax = NAN;
  kernels::fp8_amax_accumulate(ctx, &amax, b.data(), 300);
  CHECK(amax == INFINITY);
  // An infinity is the amax.
  amax = 0.0f;
  b[5] = to<TestType>(-INFINITY);
  kernels::fp8_amax_accumulate(ctx, &amax, b.data(), 300);
  CHECK(amax == INFINITY);
  REQUIRE_THROWS_WITH(kernels::fp8_amax_accumulate(ctx, &amax, b.data(), -3),
                      Catch::Contains("n=-3 must be >= 0"));
  REQUIRE_THROWS_WITH(kernels::fp8_amax_accumulate(ctx, nullptr, b.data(), 3),
                      Catch::Contains("amax is null"));
}

TEST_CASE(
    "fp8_update_scale is fp8_scale_of in memory, keeping the scale where amax is 0 or not "
    "finite",
    "[kernels][fp8]") {
  kernels::host_context ctx;
  const float previous = 0.75f;
  for (const float fmax : {448.0f, 57344.0f})
    for (const int margin : {0, 1, 3})
      for (const float amax : {1.0f, 3.7f, 1e-3f, 6e4f, 1e-41f}) {
        INFO("fp8_max " << fmax << " margin " << margin << " amax " << amax);
        float scale = previous;
        kernels::fp8_update_scale(ctx, &scale, &amax, fmax, margin);
        CHECK(scale == fp8_scale_of(amax, fmax, margin, previous));
        if (amax >= 1e-3f) CHECK(scale == fmax / amax / std::ldexp(1.0f, margin));
        if (amax < 1e-40f) CHECK(scale == previous);  // fp8_max / amax overflows: kept
      }
  for (const float amax : {0.0f, -0.0f, INFINITY, NAN}) {
    INFO("amax " << amax);
    float scale = previous;
    kernels::fp8_update_scale(ctx, &scale, &amax, 448.0f, 0);
    CHECK(scale == previous);
  }
  float scale = 1.0f;
  const float amax = 2.0f;
  REQUIRE_THROWS_WITH(kernels::fp8_update_scale(ctx, &scale, &amax, 0.0f, 0),
                      Catch::Contains("fp8_max 0 must be a finite value > 0"));
  REQUIRE_THROWS_WITH(kernels::fp8_update_scale(ctx, &scale, &amax, 448.0f, 65),
                      Catch::Contains("margin 65 must be in [0, 64]"));
  REQUIRE_THROWS_WITH(kernels::fp8_update_scale(ctx, nullptr, &amax, 448.0f, 0),
                      Catch::Contains("scale is null"));
  REQUIRE_THROWS_WITH(kernels::fp8_update_scale(ctx, &scale, nullptr, 448.0f, 0),
                      Catch::Contains("amax is null"));
  CHECK(scale == 1.0f);  // nothing written by a refused call
}

}  // namespace test_kernels_fp8
