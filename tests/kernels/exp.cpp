// Tests include/tessera/kernels/detail/exp.hpp: the kernels' float exp is
// libm's expf bit for bit, on every float where the result is neither
// 0, 1 nor +inf without computation, and on a stride through the rest; its
// table is 2^(i/32); a vectorised loop of it gives the scalar results.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <vector>

#include "tessera/kernels/detail/exp.hpp"

namespace test_kernels_exp {

namespace {

using tessera::kernels::detail::exp;

std::uint32_t bits(float x) { return std::bit_cast<std::uint32_t>(x); }

/// Counts the floats of [lo_bits, hi_bits] (as unsigned bit patterns, every
/// `stride`-th) where kernels::detail::exp differs from std::exp; prints the
/// first few.
std::int64_t mismatches(std::uint32_t lo_bits, std::uint32_t hi_bits, std::uint32_t stride) {
  std::int64_t bad = 0;
  const std::int64_t n = (static_cast<std::int64_t>(hi_bits) - lo_bits) / stride + 1;
#pragma omp parallel for reduction(+ : bad) schedule(static)
  for (std::int64_t i = 0; i < n; ++i) {
    const float x = std::bit_cast<float>(static_cast<std::uint32_t>(lo_bits + i * stride));
    const float want = std::exp(x), got = exp(x);
    if (std::isnan(want) ? !std::isnan(got) : bits(got) != bits(want)) {
      if (bad < 3) std::printf("exp(%a): libm %a, kernels %a\n", x, want, got);
      ++bad;
    }
  }
  return bad;
}

}  // namespace

TEST_CASE("kernels' float exp is libm's expf, every float of (-104, -2^-25] and [2^-25, 89)",
          "[kernels][exp]") {
  // Below 2^-25 in magnitude e^x rounds to 1 (or 1 - 2^-24); beyond the
  // range it is 0 or +inf: those are covered by a stride below.
  CHECK(mismatches(bits(0x1p-25f), bits(89.0f), 1) == 0);
  CHECK(mismatches(bits(-0x1p-25f), bits(-104.0f), 1) == 0);
}

TEST_CASE("kernels' float exp is libm's on a stride through every other float, and the specials",
          "[kernels][exp]") {
  CHECK(mismatches(0, bits(0x1p-25f), 4099) == 0);                     // +0 .. 2^-25
  CHECK(mismatches(bits(89.0f), 0x7fffffffu, 4099) == 0);              // 89 .. +inf, NaNs
  CHECK(mismatches(0x80000000u, bits(-0x1p-25f), 4099) == 0);          // -0 .. -2^-25
  CHECK(mismatches(bits(-104.0f), 0xffffffffu, 4099) == 0);            // -104 .. -inf, NaNs
  constexpr float inf = std::numeric_limits<float>::infinity();
  CHECK(exp(-inf) == 0.0f);
  CHECK(exp(inf) == inf);
  CHECK(exp(0.0f) == 1.0f);
  CHECK(exp(-0.0f) == 1.0f);
  CHECK(std::isnan(exp(std::numeric_limits<float>::quiet_NaN())));
  CHECK(exp(0x1.62e42ep6f) == std::exp(0x1.62e42ep6f));  // the largest finite result
  CHECK(std::isfinite(exp(0x1.62e42ep6f)));
  CHECK(exp(0x1.62e430p6f) == inf);
  CHECK(exp(-0x1.9fe368p6f) == std::exp(-0x1.9fe368p6f));  // the smallest subnormal
  CHECK(exp(-0x1.9fe368p6f) > 0.0f);
  CHECK(exp(-0x1.9fe36ap6f) == 0.0f);
}

TEST_CASE("the table is 2^(i/32) rounded to double, less the exponent bits i << 47",
          "[kernels][exp]") {
  for (std::uint64_t i = 0; i < 32; ++i) {
    const long double want = std::exp2(static_cast<long double>(i) / 32);
    const double entry =
        std::bit_cast<double>(tessera::kernels::detail::exp2_32_table[i] + (i << 47));
    INFO("i = " << i);
    CHECK(entry == static_cast<double>(want));
  }
}

TEST_CASE("a vectorised loop of the float exp gives the scalar results", "[kernels][exp]") {
  std::vector<float> x(4096), y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = -100.0f + 190.0f * static_cast<float>(i) / 4096;
  x[7] = -std::numeric_limits<float>::infinity();
  x[9] = std::numeric_limits<float>::quiet_NaN();
#pragma omp simd
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = exp(x[i]);
  for (std::size_t i = 0; i < x.size(); ++i) {
    INFO("x = " << x[i]);
    if (std::isnan(x[i]))
      CHECK(std::isnan(y[i]));
    else
      CHECK(bits(y[i]) == bits(std::exp(x[i])));
  }
}

}  // namespace test_kernels_exp
