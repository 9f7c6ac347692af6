// Tests of the 8-bit storage types of include/tessera/core/numeric.hpp,
// fp8_e4m3 and fp8_e5m2 (OCP OFP8 rev 1.0), against references written here
// from the specification's definitions, independently of the bit arithmetic
// under test:
//
// - to float: every one of the 256 patterns of each format against a float64
//   decoder of the sign, exponent and mantissa fields; NaN and infinity
//   patterns named and counted; float -> 8 bits -> float is the identity on
//   every non-NaN pattern.
// - from float: against a nearest-neighbour search over the 256 decoded
//   values with ties to even, in both saturation modes, on every exact
//   midpoint between neighbours and the floats next to it, on strided sweeps
//   of the whole float range, every float near the overflow thresholds,
//   fine sweeps of the subnormal ranges, and random bit patterns and values;
//   and at the named boundaries (overflow, the smallest subnormal's half,
//   NaN, inf, -0).
// - from double: the same search (a double that is not a midpoint must not be
//   rounded twice through float).

#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tessera/core/numeric.hpp"

namespace test_core_fp8 {

using namespace tessera;

namespace {

constexpr fp8_saturation sat = fp8_saturation::finite;
constexpr fp8_saturation nosat = fp8_saturation::none;

std::uint32_t fbits(float f) {
  return std::bit_cast<std::uint32_t>(f);
}
float bitsf(std::uint32_t u) {
  return std::bit_cast<float>(u);
}

// ---- the reference, from the OFP8 definitions -------------------------------------------------

// One format: its fields, its special patterns and its values.
//
// A pattern S.E.M is (-1)^S * 2^(1 - bias) * (0 + M / 2^m) for E = 0 and
// (-1)^S * 2^(E - bias) * (1 + M / 2^m) otherwise, except the special
// patterns: E4M3 has no infinity and one NaN magnitude, S.1111.111; E5M2
// follows IEEE 754 (E all ones: infinity for M = 0, NaN otherwise).
struct format {
  const char* name;
  int exp_bits, man_bits, bias;
  bool ieee_specials;  // E5M2: E all ones is inf/NaN; E4M3: only S.1111.111 is NaN
  std::uint8_t max_bits;
  std::vector<double> vals;  // vals[p] for p = 0 .. max_bits, then the next value (see below)

  format(const char* n, int e, int m, bool ieee) : name(n), exp_bits(e), man_bits(m) {
    bias = (1 << (e - 1)) - 1;
    ieee_specials = ieee;
    // The largest finite magnitude is the last pattern before the first special one.
    int p = 0;
    while (p + 1 < 128 && !is_special(static_cast<std::uint8_t>(p + 1))) ++p;
    max_bits = static_cast<std::uint8_t>(p);
    for (int q = 0; q <= p; ++q) vals.push_back(field_value(static_cast<std::uint8_t>(q)));
    // The value pattern max_bits + 1 would have with an unbounded exponent
    // (E4M3: 480, E5M2: 2^16): what IEEE 754's overflow rule rounds against
    // (IEEE 754-2008 sections 4.3.1 and 7.4: round as if the exponent range
    // were unbounded; overflow if the result exceeds the largest finite value).
    vals.push_back(field_value(static_cast<std::uint8_t>(p + 1)));
  }

  int exponent(std::uint8_t p) const { return (p & 0x7f) >> man_bits; }
  int mantissa(std::uint8_t p) const { return p & ((1 << man_bits) - 1); }
  bool is_special(std::uint8_t p) const {
    const int e_all = (1 << exp_bits) - 1, m_all = (1 << man_bits) - 1;
    if (ieee_specials) return exponent(p) == e_all;
    return exponent(p) == e_all && mantissa(p) == m_all;
  }
  bool is_nan(std::uint8_t p) const {
    return is_special(p) && (!ieee_specials || mantissa(p) != 0);
  }
  bool is_inf(std::uint8_t p) const { return is_special(p) && ieee_specials && mantissa(p) == 0; }
  // The field formula, ignoring the special patterns.
  double field_value(std::uint8_t p) const {
    const int e = exponent(p), m = mantissa(p);
    const double v =
        e == 0 ? std::ldexp(static_cast<double>(m), 1 - bias - man_bits)
               : std::ldexp(static_cast<double>((1 << man_bits) + m), e - bias - man_bits);
    return (p & 0x80) ? -v : v;
  }
  double decode(std::uint8_t p) const {
    if (is_nan(p)) return std::copysign(std::nan(""), (p & 0x80) ? -1.0 : 1.0);
    if (is_inf(p)) return (p & 0x80) ? -INFINITY : INFINITY;
    return field_value(p);
  }
  // What non-saturating overflow gives: infinity where the format has one, else NaN.
  std::uint8_t nosat_overflow() const {
    return static_cast<std::uint8_t>(ieee_specials ? (0x7f >> man_bits) << man_bits : 0x7f);
  }

  // Round-to-nearest-even by search over the non-negative finite values and
  // the next value past them: the index of the nearest value to |x|, which is
  // past max_bits on overflow. x must not be NaN. The differences are exact
  // (Sterbenz), or their comparison is decided by monotone rounding
  // (vals[lo] = 0).
  std::size_t nearest_index(double x) const {
    const double a = std::fabs(x);
    if (a >= vals.back()) return vals.size() - 1;
    const auto j =
        static_cast<std::size_t>(std::upper_bound(vals.begin(), vals.end(), a) - vals.begin());
    const std::size_t lo = j - 1;
    if (vals[lo] == a) return lo;
    const double dl = a - vals[lo], dh = vals[j] - a;
    return dl < dh ? lo : dh < dl ? j : (lo % 2 == 0 ? lo : j);  // even pattern = even mantissa
  }
  // The pattern for x given its nearest_index r: overflow saturates, or
  // becomes infinity (E5M2) or NaN (E4M3).
  std::uint8_t pattern(double x, std::size_t r, fp8_saturation s) const {
    if (r > max_bits) r = s == sat ? max_bits : nosat_overflow();
    return static_cast<std::uint8_t>((std::signbit(x) ? 0x80 : 0) | r);
  }
  std::uint8_t nearest_even(double x, fp8_saturation s) const {
    return pattern(x, nearest_index(x), s);
  }
};

const format& e4m3() {
  static const format f("e4m3", 4, 3, false);
  return f;
}
const format& e5m2() {
  static const format f("e5m2", 5, 2, true);
  return f;
}

std::uint8_t convert(const format& f, float x, fp8_saturation s) {
  return f.ieee_specials ? fp8_e5m2(x, s).bits : fp8_e4m3(x, s).bits;
}
std::uint8_t convert(const format& f, double x, fp8_saturation s) {
  return f.ieee_specials ? fp8_e5m2(x, s).bits : fp8_e4m3(x, s).bits;
}
float to_float(const format& f, std::uint8_t p) {
  return f.ieee_specials ? static_cast<float>(fp8_e5m2::from_bits(p))
                         : static_cast<float>(fp8_e4m3::from_bits(p));
}

// Checks one value (float or double) in both formats and both modes; counts
// the conversions checked and the mismatches, and reports the first few.
struct checker {
  long checked = 0;
  int bad = 0;
  template <class F>
  void report(const format& f, fp8_saturation s, F x, unsigned got, unsigned want) {
    if (bad++ < 8)
      FAIL_CHECK(f.name << (s == sat ? " saturating" : " non-saturating") << ": " << std::hexfloat
                        << x << std::defaultfloat << " (" << x << ") -> 0x" << std::hex << got
                        << ", reference 0x" << want);
  }
  template <class F>
  void check(F x) {
    const bool nan = std::isnan(x);
    for (const format* f : {&e4m3(), &e5m2()}) {
      const std::size_t r = nan ? 0 : f->nearest_index(static_cast<double>(x));
      for (fp8_saturation s : {sat, nosat}) {
        ++checked;
        const std::uint8_t got = convert(*f, x, s);
        // NaN -> S.1111111 (the E4M3 NaN, a quiet E5M2 NaN), sign kept.
        const unsigned want =
            nan ? (std::signbit(x) ? 0x80u : 0u) | 0x7fu : f->pattern(static_cast<double>(x), r, s);
        if (got != want) report(*f, s, x, got, want);
      }
    }
  }
};

}  // namespace

TEST_CASE("fp8 decodes every bit pattern exactly", "[core][numeric][fp8]") {
  for (const format* f : {&e4m3(), &e5m2()}) {
    INFO(f->name);
    int bad = 0, nans = 0, infs = 0;
    for (int q = 0; q < 256; ++q) {
      const auto p = static_cast<std::uint8_t>(q);
      const float v = to_float(*f, p);
      const double want = f->decode(p);
      if (std::isnan(want)) {
        ++nans;
        bad += !(std::isnan(v) && std::signbit(v) == std::signbit(want));
        // NaN converts back to S.1111111 in both modes.
        for (fp8_saturation s : {sat, nosat}) bad += convert(*f, v, s) != ((p & 0x80) | 0x7f);
      } else {
        infs += std::isinf(want);
        bad += !(static_cast<double>(v) == want && std::signbit(v) == std::signbit(want));
        // The round trip is the identity; saturation turns infinity into the largest value.
        bad += convert(*f, v, nosat) != p;
        bad += convert(*f, v, sat) != (std::isinf(want) ? (p & 0x80) | f->max_bits : p);
      }
      if (bad) {
        FAIL(f->name << " pattern 0x" << std::hex << q << std::dec << " -> " << v << " (reference "
                     << want << ")");
      }
    }
    CHECK(bad == 0);
    // OFP8: E4M3 has two NaN patterns and no infinity; E5M2 six NaNs and two infinities.
    CHECK(nans == (f->ieee_specials ? 6 : 2));
    CHECK(infs == (f->ieee_specials ? 2 : 0));
  }
  // The named values of the specification.
  CHECK(static_cast<float>(fp8_e4m3::from_bits(0x7e)) == 448.0f);
  CHECK(static_cast<float>(fp8_e4m3::from_bits(0xfe)) == -448.0f);
  CHECK(static_cast<float>(fp8_e4m3::from_bits(0x01)) == std::ldexp(1.0f, -9));
  CHECK(static_cast<float>(fp8_e4m3::from_bits(0x08)) == std::ldexp(1.0f, -6));
  CHECK(static_cast<float>(fp8_e4m3::from_bits(0x78)) == 256.0f);  // S.1111.000 is finite
  CHECK(static_cast<float>(fp8_e4m3::from_bits(0x38)) == 1.0f);
  CHECK(std::isnan(static_cast<float>(fp8_e4m3::from_bits(0x7f))));
  CHECK(std::isnan(static_cast<float>(fp8_e4m3::from_bits(0xff))));
  CHECK(static_cast<float>(fp8_e5m2::from_bits(0x7b)) == 57344.0f);
  CHECK(static_cast<float>(fp8_e5m2::from_bits(0x01)) == std::ldexp(1.0f, -16));
  CHECK(static_cast<float>(fp8_e5m2::from_bits(0x04)) == std::ldexp(1.0f, -14));
  CHECK(static_cast<float>(fp8_e5m2::from_bits(0x3c)) == 1.0f);
  CHECK(static_cast<float>(fp8_e5m2::from_bits(0x7c)) == INFINITY);
  CHECK(static_cast<float>(fp8_e5m2::from_bits(0xfc)) == -INFINITY);
  for (std::uint8_t p : {0x7d, 0x7e, 0x7f, 0xfd, 0xfe, 0xff})
    CHECK(std::isnan(static_cast<float>(fp8_e5m2::from_bits(p))));
  CHECK(std::signbit(static_cast<float>(fp8_e4m3::from_bits(0x80))));  // -0
  CHECK(std::signbit(static_cast<float>(fp8_e5m2::from_bits(0x80))));
  CHECK(fp8_e4m3::max_finite == static_cast<float>(fp8_e4m3::from_bits(0x7e)));
  CHECK(fp8_e5m2::max_finite == static_cast<float>(fp8_e5m2::from_bits(0x7b)));
  CHECK(e4m3().max_bits == 0x7e);
  CHECK(e5m2().max_bits == 0x7b);
}

TEST_CASE("float -> fp8 rounds to nearest even at every midpoint", "[core][numeric][fp8]") {
  // For adjacent non-negative patterns p, p+1 (p+1 up to the first value past
  // the largest finite one), the exact midpoint has at most 5 significant bits
  // and is a float; check it and the floats one ulp either side, both signs.
  checker c;
  int odd_ties = 0;
  for (const format* f : {&e4m3(), &e5m2()}) {
    for (std::size_t p = 0; p + 1 < f->vals.size(); ++p) {
      const double mid = 0.5 * (f->vals[p] + f->vals[p + 1]);
      const float m = static_cast<float>(mid);
      REQUIRE(static_cast<double>(m) == mid);
      for (float x : {m, std::nextafter(m, 0.0f), std::nextafter(m, INFINITY)}) {
        c.check(x);
        c.check(-x);
      }
      // Independently of the search: a tie between two finite values lands
      // on the one with the even mantissa.
      if (p + 1 <= f->max_bits)
        for (fp8_saturation s : {sat, nosat}) odd_ties += (convert(*f, m, s) & 1) != 0;
    }
  }
  CHECK(c.bad == 0);
  CHECK(odd_ties == 0);
  CHECK(c.checked == 4 * 6 * (static_cast<long>(e4m3().vals.size() + e5m2().vals.size()) - 2));
}

TEST_CASE("float -> fp8 matches the nearest-even search on millions of floats",
          "[core][numeric][fp8]") {
  checker c;
  struct window {
    float lo, hi;
    std::uint32_t stride;
  };
  auto sweep = [&](window w) {  // both signs
    for (std::uint32_t b = fbits(w.lo); b <= fbits(w.hi); b += w.stride) {
      c.check(bitsf(b));
      c.check(-bitsf(b));
    }
  };
  // The whole float range by a prime stride: NaNs, infinities, both signs,
  // huge and tiny values (1 million floats).
  for (std::uint64_t b = 0; b < (std::uint64_t{1} << 32); b += 4099)
    c.check(bitsf(static_cast<std::uint32_t>(b)));
  // Where overflow is decided: every 11th float of E4M3's [384, 600] and
  // E5M2's [49152, 73728], and every float within 4096 ulps of the largest
  // finite values, the ties past them (464, 61440) and the next values (480,
  // 2^16).
  sweep({384.0f, 600.0f, 11});
  sweep({49152.0f, 73728.0f, 11});
  for (float x : {448.0f, 464.0f, 480.0f, 57344.0f, 61440.0f, 65536.0f})
    sweep({bitsf(fbits(x) - 4096), bitsf(fbits(x) + 4096), 1});
  // Every 61st float of each format's subnormal range and the binade above
  // (E4M3 [2^-11, 2^-5], E5M2 [2^-18, 2^-13]), where a tie is at most half
  // the smallest subnormal.
  sweep({0x1p-11f, 0x1p-5f, 61});
  sweep({0x1p-18f, 0x1p-13f, 61});
  std::mt19937_64 rng(20261129);
  // Random bit patterns.
  std::uniform_int_distribution<std::uint32_t> any;
  for (int i = 0; i < 500'000; ++i) c.check(bitsf(any(rng)));
  // Random values across both formats' ranges, 2^-20 .. 2^17, random significands.
  std::uniform_int_distribution<std::uint32_t> exp(127 - 20, 127 + 17), man(0, 0x7fffff), sgn(0, 1);
  for (int i = 0; i < 500'000; ++i) c.check(bitsf(sgn(rng) << 31 | exp(rng) << 23 | man(rng)));
  CHECK(c.bad == 0);
  INFO("conversions checked: " << c.checked);
  CHECK(c.checked > 20'000'000);
}

TEST_CASE("fp8_e4m3 boundaries: overflow, saturation, subnormals, NaN, inf, zero",
          "[core][numeric][fp8]") {
  auto s = [](float x) { return fp8_e4m3(x, sat).bits; };
  auto n = [](float x) { return fp8_e4m3(x, nosat).bits; };
  // The default is saturating (as __nv_fp8_e4m3(float)).
  CHECK(fp8_e4m3(1000.0f).bits == 0x7e);
  CHECK(fp8_e4m3(-INFINITY).bits == 0xfe);
  // [448, 464) rounds to 448; 464 ties between 448 (mantissa 110) and the
  // 480 that 0x7f would be (111): even, 448. Past 464 is overflow.
  for (float x : {448.0f, 463.99f, 464.0f}) {
    CHECK(s(x) == 0x7e);
    CHECK(n(x) == 0x7e);
    CHECK(n(-x) == 0xfe);
  }
  const float above = std::nextafter(464.0f, INFINITY);
  CHECK(s(above) == 0x7e);
  CHECK(n(above) == 0x7f);  // no infinity: NaN
  CHECK(n(-above) == 0xff);
  for (float x : {480.0f, 1e30f, std::numeric_limits<float>::max(), INFINITY}) {
    CHECK(s(x) == 0x7e);
    CHECK(s(-x) == 0xfe);
    CHECK(n(x) == 0x7f);
    CHECK(n(-x) == 0xff);
  }
  CHECK(s(416.0f) == 0x7d);
  CHECK(s(432.0f) == 0x7e);  // tie between 416 (101) and 448 (110): even, 448
  CHECK(s(240.0f) == 0x77);
  CHECK(s(248.0f) == 0x78);  // tie between 240 (111) and 256: carries into the top binade
  // Subnormals: steps of 2^-9.
  CHECK(s(std::ldexp(1.0f, -9)) == 0x01);
  CHECK(s(std::ldexp(1.0f, -10)) == 0x00);  // half the smallest subnormal ties to 0 (even)
  CHECK(s(-std::ldexp(1.0f, -10)) == 0x80);
  CHECK(s(std::nextafter(std::ldexp(1.0f, -10), 1.0f)) == 0x01);
  CHECK(s(std::ldexp(3.0f, -10)) == 0x02);   // 1.5 steps ties to 2 (even)
  CHECK(s(std::ldexp(5.0f, -10)) == 0x02);   // 2.5 steps ties to 2 (even)
  CHECK(s(std::ldexp(15.0f, -10)) == 0x08);  // 7.5 steps ties up to the smallest normal, 2^-6
  CHECK(s(std::ldexp(1.0f, -6)) == 0x08);
  CHECK(s(std::numeric_limits<float>::denorm_min()) == 0x00);
  CHECK(s(-std::numeric_limits<float>::denorm_min()) == 0x80);
  CHECK(s(0.0f) == 0x00);
  CHECK(s(-0.0f) == 0x80);
  CHECK(s(1.0f) == 0x38);
  CHECK(s(-2.0f) == 0xc0);
  // NaN stays NaN with its sign, in both modes.
  for (float nan : {std::numeric_limits<float>::quiet_NaN(), bitsf(0x7f800001u), bitsf(0xff800001u),
                    bitsf(0x7fffffffu), bitsf(0xffc00000u)}) {
    const unsigned want = (fbits(nan) >> 24 & 0x80u) | 0x7fu;
    CHECK(s(nan) == want);
    CHECK(n(nan) == want);
  }
}

TEST_CASE("fp8_e5m2 boundaries: overflow, saturation, subnormals, NaN, inf, zero",
          "[core][numeric][fp8]") {
  auto s = [](float x) { return fp8_e5m2(x, sat).bits; };
  auto n = [](float x) { return fp8_e5m2(x, nosat).bits; };
  CHECK(fp8_e5m2(1e6f).bits == 0x7b);  // the default is saturating (as __nv_fp8_e5m2(float))
  // [57344, 61440) rounds to 57344; 61440 ties between 57344 (mantissa 11)
  // and 2^16 (the infinity pattern, 00): even, overflow, as fp16's 65520.
  for (float x : {57344.0f, 61439.99f, std::nextafter(61440.0f, 0.0f)}) {
    CHECK(s(x) == 0x7b);
    CHECK(n(x) == 0x7b);
  }
  for (float x : {61440.0f, 65536.0f, 1e30f, INFINITY}) {
    CHECK(s(x) == 0x7b);
    CHECK(s(-x) == 0xfb);
    CHECK(n(x) == 0x7c);
    CHECK(n(-x) == 0xfc);
  }
  CHECK(s(std::ldexp(1.0f, -16)) == 0x01);
  CHECK(s(std::ldexp(1.0f, -17)) == 0x00);  // half the smallest subnormal ties to 0 (even)
  CHECK(s(std::nextafter(std::ldexp(1.0f, -17), 1.0f)) == 0x01);
  CHECK(s(std::ldexp(3.0f, -17)) == 0x02);  // 1.5 steps ties to 2 (even)
  CHECK(s(std::ldexp(7.0f, -17)) == 0x04);  // 3.5 steps ties up to the smallest normal, 2^-14
  CHECK(s(-0.0f) == 0x80);
  CHECK(s(1.0f) == 0x3c);
  CHECK(s(1.125f) == 0x3c);  // tie between 1 (00) and 1.25 (01): 1
  CHECK(s(1.375f) == 0x3e);  // tie between 1.25 (01) and 1.5 (10): 1.5
  for (float nan : {std::numeric_limits<float>::quiet_NaN(), bitsf(0x7f800001u), bitsf(0xff800001u),
                    -std::numeric_limits<float>::quiet_NaN()}) {
    const unsigned want = (fbits(nan) >> 24 & 0x80u) | 0x7fu;
    CHECK(s(nan) == want);
    CHECK(n(nan) == want);
  }
}

TEST_CASE("double -> fp8 rounds once, to nearest even", "[core][numeric][fp8]") {
  // A double just above (or below) a midpoint rounds to float exactly at the
  // midpoint; rounding that float again would tie to even in the wrong
  // direction. Check every midpoint +- a tiny offset and +- one double ulp,
  // random doubles, and doubles beyond float's range.
  checker c;
  int to_bad = 0;
  auto check = [&](double d) {
    c.check(d);
    // to<> rounds doubles the same way, saturating as the constructors do.
    to_bad += to<fp8_e4m3>(d).bits != fp8_e4m3(d).bits;
    to_bad += to<fp8_e5m2>(d).bits != fp8_e5m2(d).bits;
  };
  for (const format* f : {&e4m3(), &e5m2()}) {
    for (std::size_t p = 0; p + 1 < f->vals.size(); ++p) {
      const double mid = 0.5 * (f->vals[p] + f->vals[p + 1]);
      for (double d : {mid, std::nextafter(mid, 0.0), std::nextafter(mid, INFINITY),
                       mid * (1 + 1e-12), mid * (1 - 1e-12), mid * (1 + 1e-9), mid * (1 - 1e-9)}) {
        check(d);
        check(-d);
      }
    }
  }
  std::mt19937_64 rng(99);
  std::uniform_real_distribution<double> mant(1.0, 2.0);
  std::uniform_int_distribution<int> e(-20, 17);
  for (int i = 0; i < 300'000; ++i) check(std::ldexp(mant(rng), e(rng)));
  for (double d : {std::numeric_limits<double>::max(), 1e39, 1e300, 1e-300, 1e-46,
                   std::numeric_limits<double>::denorm_min(), 0.0, -0.0,
                   std::numeric_limits<double>::infinity()}) {
    check(d);
    check(-d);
  }
  check(std::nan(""));
  check(-std::nan(""));
  CHECK(c.bad == 0);
  CHECK(to_bad == 0);
  // A double past float's range saturates, or overflows, like a float.
  CHECK(fp8_e4m3(1e300).bits == 0x7e);
  CHECK(fp8_e4m3(-1e300, nosat).bits == 0xff);
  CHECK(fp8_e5m2(1e300, nosat).bits == 0x7c);
  // 464 + 2^-40 is just above the E4M3 overflow tie: through float it would
  // become 464 and round to 448.
  CHECK(fp8_e4m3(464.0 + std::ldexp(1.0, -40), nosat).bits == 0x7f);
  CHECK(fp8_e4m3(464.0 - std::ldexp(1.0, -40), nosat).bits == 0x7e);
  // 2^-10 + 2^-60 is just above the smallest subnormal's half.
  CHECK(fp8_e4m3(std::ldexp(1.0, -10) + std::ldexp(1.0, -60)).bits == 0x01);
}

TEST_CASE("to<> and dtype_name know the fp8 types", "[core][numeric][fp8]") {
  // example-begin fp8
  const fp8_e4m3 w(1000.0f);                           // saturates: 448 (0x7e)
  const fp8_e4m3 n(1000.0f, fp8_saturation::none);     // NaN (0x7f): E4M3 has no infinity
  const fp8_e5m2 g(-1e6f, fp8_saturation::none);       // -inf (0xfc)
  const float x = static_cast<float>(w);               // exact: 448
  const bf16 b = to<bf16>(fp8_e5m2::from_bits(0x3d));  // 1.25, through float
  // example-end fp8
  CHECK(w.bits == 0x7e);
  CHECK(n.bits == 0x7f);
  CHECK(g.bits == 0xfc);
  CHECK(x == 448.0f);
  CHECK(static_cast<float>(b) == 1.25f);
  CHECK(to<float>(fp8_e4m3::from_bits(0x38)) == 1.0f);
  CHECK(to<double>(fp8_e5m2::from_bits(0x7b)) == 57344.0);
  CHECK(to<double>(fp8_e5m2::from_bits(0xfc)) == -INFINITY);
  CHECK(to<fp8_e4m3>(3.14159f).bits == 0x45);  // 3.25 (0x45) is nearer than 3.0 (0x44)
  CHECK(to<fp8_e5m2>(3.14159).bits == 0x42);   // 3.0
  CHECK(to<fp8_e4m3>(1000).bits == 0x7e);      // an int, through double, saturating
  CHECK(to<fp8_e5m2>(-100000).bits == 0xfb);
  // Between the narrow types, through float (exact from bf16, fp16 and fp8).
  CHECK(to<fp8_e4m3>(bf16(448.0f)).bits == 0x7e);
  CHECK(to<fp8_e5m2>(fp16(-0.5f)).bits == 0xb8);
  CHECK(to<bf16>(fp8_e4m3::from_bits(0x7e)).bits == bf16(448.0f).bits);
  CHECK(to<fp16>(fp8_e5m2::from_bits(0x7c)).bits == 0x7c00);    // inf stays inf
  CHECK(to<fp8_e5m2>(fp8_e4m3::from_bits(0x7e)).bits == 0x5f);  // 448 is exact in E5M2
  CHECK(to<fp8_e4m3>(fp8_e5m2::from_bits(0x7b)).bits == 0x7e);  // 57344 saturates
  CHECK(std::string(dtype_name<fp8_e4m3>()) == "fp8_e4m3");
  CHECK(std::string(dtype_name<fp8_e5m2>()) == "fp8_e5m2");
  static_assert(is_fp8_v<fp8_e4m3> && is_fp8_v<fp8_e5m2> && !is_fp8_v<bf16>);
  static_assert(!is_half_v<fp8_e4m3> && !is_half_v<fp8_e5m2>);
  static_assert(is_narrow_float_v<fp8_e4m3> && is_narrow_float_v<bf16> &&
                !is_narrow_float_v<float>);
  static_assert(std::is_same_v<accum_t<fp8_e4m3>, float>);
}

}  // namespace test_core_fp8
