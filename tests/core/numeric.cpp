// Tests of include/tessera/core/numeric.hpp: bf16 and fp16 conversions against
// independent references.
//
// - to float: every one of the 65,536 bit patterns against a decoder written
//   from the IEEE definition with std::ldexp, and (fp16) against the compiler's
//   _Float16 conversion; float -> 16 bits -> float is the identity on every
//   non-NaN pattern.
// - from float: against the compiler's _Float16 (fp16) and against a
//   nearest-neighbour search in double with ties to even (both formats), on
//   every exact midpoint between adjacent values and the floats next to it, on
//   millions of random bit patterns and random values in range, and at the
//   boundaries named in the IEEE rules (overflow, subnormals, NaN, inf, -0).
// - from double: the same neighbour search (a double that is not a midpoint
//   must not be rounded twice through float).

#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "tessera/core/numeric.hpp"

#if defined(__clang__) && __clang_major__ < 15
#include <immintrin.h>
#endif

namespace test_core_numeric {

using namespace tessera;

namespace {

std::uint32_t fbits(float f) {
  return std::bit_cast<std::uint32_t>(f);
}
float bitsf(std::uint32_t u) {
  return std::bit_cast<float>(u);
}

// ---- independent references ---------------------------------------------------------------

// Decoders from the IEEE 754 definition: (-1)^s * 2^(e - bias) * 1.m, or
// 2^(1 - bias) * 0.m for e = 0; e all ones is inf (m = 0) or NaN.
double decode(std::uint16_t p, int exp_bits, int man_bits) {
  const int bias = (1 << (exp_bits - 1)) - 1;
  const bool neg = p >> 15;
  const int e = (p >> man_bits) & ((1 << exp_bits) - 1);
  const int m = p & ((1 << man_bits) - 1);
  double v;
  if (e == (1 << exp_bits) - 1)
    v = m == 0 ? std::numeric_limits<double>::infinity() : std::nan("");
  else if (e == 0)
    v = std::ldexp(static_cast<double>(m), 1 - bias - man_bits);
  else
    v = std::ldexp(static_cast<double>((1 << man_bits) + m), e - bias - man_bits);
  return std::copysign(v, neg ? -1.0 : 1.0);
}
double decode_bf16(std::uint16_t p) {
  return decode(p, 8, 7);
}
double decode_fp16(std::uint16_t p) {
  return decode(p, 5, 10);
}

// Round-to-nearest-even by search: the magnitudes of the non-negative
// patterns 0 .. inf are increasing; the inf pattern stands for 2^(emax+1), the
// value the next pattern would have with an unbounded exponent, so that
// |x| >= max + ulp/2 rounds to inf as IEEE 754 requires (section 4.3.1).
struct nearest_even {
  std::vector<double> vals;  // vals[p] = value of pattern p, p = 0 .. inf pattern
  std::uint16_t inf_pattern;
  nearest_even(int exp_bits, int man_bits) {
    inf_pattern = static_cast<std::uint16_t>(((1u << exp_bits) - 1u) << man_bits);
    for (std::uint32_t p = 0; p < inf_pattern; ++p)
      vals.push_back(decode(static_cast<std::uint16_t>(p), exp_bits, man_bits));
    const int bias = (1 << (exp_bits - 1)) - 1;
    vals.push_back(std::ldexp(1.0, bias + 1));
  }
  // x must not be NaN. Differences below are exact (Sterbenz), or their
  // comparison is decided by monotone rounding (lo = 0).
  std::uint16_t operator()(double x) const {
    const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
    const double a = std::fabs(x);
    if (a >= vals.back()) return sign | inf_pattern;
    const auto j =
        static_cast<std::size_t>(std::upper_bound(vals.begin(), vals.end(), a) - vals.begin());
    const std::size_t lo = j - 1;
    std::size_t r;
    if (vals[lo] == a)
      r = lo;
    else {
      const double dl = a - vals[lo], dh = vals[j] - a;
      r = dl < dh ? lo : dh < dl ? j : (lo % 2 == 0 ? lo : j);
    }
    return static_cast<std::uint16_t>(sign | r);
  }
};

const nearest_even& ref_bf16() {
  static const nearest_even r(8, 7);
  return r;
}
const nearest_even& ref_fp16() {
  static const nearest_even r(5, 10);
  return r;
}

// The compiler's conversion, written independently of ours: _Float16 (GCC
// 12, x86-64: F16C or libgcc soft-fp); clang 14 has no _Float16 on x86-64
// (the asan preset), so there the F16C instructions (vcvtps2ph, round to
// nearest even, and vcvtph2ps), which every x86-64 machine since 2012 has.
#if defined(__clang__) && __clang_major__ < 15
__attribute__((target("f16c"))) std::uint16_t compiler_fp16(float f) {
  return static_cast<std::uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}
__attribute__((target("f16c"))) float compiler_fp16_to_float(std::uint16_t p) {
  return _cvtsh_ss(p);
}
#else
std::uint16_t compiler_fp16(float f) {
  return std::bit_cast<std::uint16_t>(static_cast<_Float16>(f));
}
float compiler_fp16_to_float(std::uint16_t p) {
  return static_cast<float>(std::bit_cast<_Float16>(p));
}
#endif

bool is_nan16(std::uint16_t p, int man_bits) {
  const std::uint16_t e_mask = static_cast<std::uint16_t>(0x7fffu >> man_bits << man_bits);
  return (p & e_mask) == e_mask && (p & ((1u << man_bits) - 1u)) != 0;
}

// Checks one float against both references; counts mismatches, reports the
// first few.
struct checker {
  int bad = 0;
  void report(const char* what, float f, unsigned got, unsigned want) {
    if (bad++ < 8)
      FAIL_CHECK(what << ": float bits 0x" << std::hex << fbits(f) << " (" << std::dec << f
                      << ") -> 0x" << std::hex << got << ", reference 0x" << want);
  }
  void check(float f) {
    const std::uint16_t b = bf16(f).bits, h = fp16(f).bits;
    if (std::isnan(f)) {
      if (!is_nan16(b, 7) || (b >> 15) != (fbits(f) >> 31)) report("bf16 NaN", f, b, 0);
      if (!is_nan16(h, 10) || (h >> 15) != (fbits(f) >> 31)) report("fp16 NaN", f, h, 0);
      return;
    }
    const auto rb = ref_bf16()(f);
    if (b != rb) report("bf16", f, b, rb);
    const auto rh = compiler_fp16(f);
    if (h != rh) report("fp16 vs _Float16", f, h, rh);
    const auto rh2 = ref_fp16()(f);
    if (h != rh2) report("fp16 vs search", f, h, rh2);
  }
};

}  // namespace

TEST_CASE("bf16 and fp16 decode every bit pattern exactly", "[core][numeric]") {
  int bad = 0;
  for (std::uint32_t p = 0; p < 65536; ++p) {
    const auto q = static_cast<std::uint16_t>(p);
    const float b = static_cast<float>(bf16::from_bits(q)),
                h = static_cast<float>(fp16::from_bits(q));
    const double rb = decode_bf16(q), rh = decode_fp16(q);
    const float ch = compiler_fp16_to_float(q);
    if (std::isnan(rb)) {
      bad += !(std::isnan(b) && std::signbit(b) == std::signbit(rb));
    } else {
      bad += !(static_cast<double>(b) == rb && std::signbit(b) == std::signbit(rb));
      bad += bf16(b).bits != q;  // round trip is the identity
    }
    if (std::isnan(rh)) {
      bad += !(std::isnan(h) && std::isnan(ch) && std::signbit(h) == std::signbit(rh));
      bad += !is_nan16(fp16(h).bits, 10) || (fp16(h).bits >> 15) != (q >> 15);
    } else {
      bad += !(static_cast<double>(h) == rh && std::signbit(h) == std::signbit(rh));
      bad += fbits(h) != fbits(ch);
      bad += fp16(h).bits != q;
    }
    if (bad) {
      FAIL("pattern 0x" << std::hex << p << ": bf16 -> " << b << " (ref " << rb << "), fp16 -> "
                        << h << " (ref " << rh << ", _Float16 " << ch << ")");
    }
  }
  CHECK(bad == 0);
  // bf16 is the top half of a binary32.
  CHECK(static_cast<float>(bf16::from_bits(0x3f80)) == 1.0f);
  CHECK(static_cast<float>(fp16::from_bits(0x3c00)) == 1.0f);
}

TEST_CASE("float -> bf16/fp16 rounds to nearest even at every midpoint", "[core][numeric]") {
  // For adjacent non-negative patterns p, p+1 (p+1 up to inf), the exact
  // midpoint is representable in float (at most 12 significant bits for fp16,
  // 9 for bf16, all above float's subnormal resolution 2^-149); check it and
  // the floats one ulp either side, with both signs.
  checker c;
  for (const auto* ref : {&ref_bf16(), &ref_fp16()}) {
    for (std::size_t p = 0; p + 1 < ref->vals.size(); ++p) {
      const double mid = 0.5 * (ref->vals[p] + ref->vals[p + 1]);
      const float m = static_cast<float>(mid);
      REQUIRE(static_cast<double>(m) == mid);
      for (float f : {m, std::nextafter(m, 0.0f), std::nextafter(m, INFINITY)}) {
        c.check(f);
        c.check(-f);
      }
    }
  }
  CHECK(c.bad == 0);
}

TEST_CASE("float -> bf16/fp16 matches the references on millions of floats", "[core][numeric]") {
  std::mt19937_64 rng(20261129);
  checker c;
  // Any bit pattern: NaNs, infinities, huge and tiny values, both signs.
  std::uniform_int_distribution<std::uint32_t> any;
  for (int i = 0; i < 3'000'000; ++i) c.check(bitsf(any(rng)));
  // Values where fp16 is interesting: exponents 2^-27 .. 2^17 (subnormals to
  // overflow), random significands.
  std::uniform_int_distribution<std::uint32_t> exp(127 - 27, 127 + 17), man(0, 0x7fffff), sgn(0, 1);
  for (int i = 0; i < 3'000'000; ++i) c.check(bitsf(sgn(rng) << 31 | exp(rng) << 23 | man(rng)));
  CHECK(c.bad == 0);
}

TEST_CASE("fp16 boundaries: overflow, subnormals, NaN, inf, zero", "[core][numeric]") {
  auto h = [](float f) { return fp16(f).bits; };
  CHECK(h(65504.0f) == 0x7bff);
  CHECK(h(65519.99f) == 0x7bff);
  CHECK(h(std::nextafter(65520.0f, 0.0f)) == 0x7bff);
  CHECK(h(65520.0f) == 0x7c00);  // the midpoint to 2^16 ties to the even pattern: inf
  CHECK(h(-65520.0f) == 0xfc00);
  CHECK(h(1e30f) == 0x7c00);
  CHECK(h(INFINITY) == 0x7c00);
  CHECK(h(-INFINITY) == 0xfc00);
  CHECK(h(std::ldexp(1.0f, -24)) == 0x0001);  // smallest subnormal
  CHECK(h(std::ldexp(1.0f, -25)) == 0x0000);  // tie to 0 (even)
  CHECK(h(-std::ldexp(1.0f, -25)) == 0x8000);
  CHECK(h(std::nextafter(std::ldexp(1.0f, -25), 1.0f)) == 0x0001);
  CHECK(h(std::ldexp(3.0f, -25)) == 0x0002);     // 1.5 * 2^-24 ties to 2 (even)
  CHECK(h(std::ldexp(1.0f, -14)) == 0x0400);     // smallest normal
  CHECK(h(std::ldexp(1023.5f, -24)) == 0x0400);  // largest subnormal + 1/2 rounds up to normal
  CHECK(h(0.0f) == 0x0000);
  CHECK(h(-0.0f) == 0x8000);
  CHECK(h(1.0f) == 0x3c00);
  const std::uint16_t qn = h(std::numeric_limits<float>::quiet_NaN());
  CHECK(is_nan16(qn, 10));
  CHECK((qn >> 15) == 0);
  const std::uint16_t nqn = h(-std::numeric_limits<float>::quiet_NaN());
  CHECK(is_nan16(nqn, 10));
  CHECK((nqn >> 15) == 1);
  CHECK(is_nan16(h(bitsf(0x7f800001u)), 10));  // signalling NaN with a low payload stays NaN
  CHECK(is_nan16(h(bitsf(0xff800001u)), 10));
}

TEST_CASE("bf16 boundaries: overflow, subnormals, NaN, inf, zero", "[core][numeric]") {
  auto b = [](float f) { return bf16(f).bits; };
  CHECK(b(1.0f) == 0x3f80);
  CHECK(b(bitsf(0x3f808000u)) == 0x3f80);  // 1 + 2^-8: tie to even (down)
  CHECK(b(bitsf(0x3f818000u)) == 0x3f82);  // 1 + 3 * 2^-8: tie to even (up)
  CHECK(b(bitsf(0x3f808001u)) == 0x3f81);
  CHECK(b(std::numeric_limits<float>::max()) == 0x7f80);  // above max + ulp/2: inf
  CHECK(b(bitsf(0x7f7f7fffu)) == 0x7f7f);                 // just below the midpoint
  CHECK(b(bitsf(0x7f7f8000u)) == 0x7f80);                 // the midpoint: ties to inf (even)
  CHECK(b(-std::numeric_limits<float>::max()) == 0xff80);
  CHECK(b(INFINITY) == 0x7f80);
  CHECK(b(std::numeric_limits<float>::denorm_min()) == 0x0000);
  CHECK(b(bitsf(0x00008000u)) == 0x0000);  // subnormal tie to 0
  CHECK(b(bitsf(0x00018000u)) == 0x0002);  // subnormal tie up to even
  CHECK(b(bitsf(0x00008001u)) == 0x0001);
  CHECK(b(-0.0f) == 0x8000);
  for (float nan : {std::numeric_limits<float>::quiet_NaN(), bitsf(0x7f800001u), bitsf(0xff800001u),
                    bitsf(0x7fffffffu)}) {
    const auto p = b(nan);
    CHECK(is_nan16(p, 7));
    CHECK((p >> 15) == (fbits(nan) >> 31));
  }
}

TEST_CASE("double -> bf16/fp16 rounds once, to nearest even", "[core][numeric]") {
  // A double just above (or below) a midpoint rounds to float exactly at the
  // midpoint; rounding that float again would tie to even in the wrong
  // direction. Check every midpoint +- a tiny offset, and random doubles.
  std::mt19937_64 rng(99);
  int bad = 0;
  auto check = [&](double d) {
    const std::uint16_t b = bf16(d).bits, h = fp16(d).bits, tb = to<bf16>(d).bits,
                        th = to<fp16>(d).bits;
    const auto rb = ref_bf16()(d), rh = ref_fp16()(d);
    if (b != rb || h != rh || tb != rb || th != rh) {
      if (bad++ < 8)
        FAIL_CHECK("double " << d << " (" << std::hexfloat << d << std::defaultfloat << "): bf16 0x"
                             << std::hex << b << " to<> 0x" << tb << " ref 0x" << rb << ", fp16 0x"
                             << h << " to<> 0x" << th << " ref 0x" << rh);
    }
  };
  for (const auto* ref : {&ref_bf16(), &ref_fp16()}) {
    for (std::size_t p = 0; p + 1 < ref->vals.size(); p += 1) {
      const double mid = 0.5 * (ref->vals[p] + ref->vals[p + 1]);
      for (double rel : {0.0, 1e-12, -1e-12, 1e-9, -1e-9}) {
        const double d = mid + rel * mid;
        check(d);
        check(-d);
      }
    }
  }
  std::uniform_real_distribution<double> mant(1.0, 2.0);
  std::uniform_int_distribution<int> e(-30, 20);
  for (int i = 0; i < 1'000'000; ++i) check(std::ldexp(mant(rng), e(rng)));
  check(std::numeric_limits<double>::max());
  check(1e-300);
  check(-1e-300);
  CHECK(bad == 0);
  CHECK(std::isnan(static_cast<float>(bf16(std::nan("")))));
  CHECK(std::isnan(static_cast<float>(fp16(-std::nan("")))));
  CHECK(std::signbit(static_cast<float>(fp16(-std::nan("")))));
}

TEST_CASE("to<> converts between all numeric types", "[core][numeric]") {
  CHECK(to<float>(bf16::from_bits(0x4049)) == 3.140625f);
  CHECK(to<double>(fp16::from_bits(0x4248)) == 3.140625);
  CHECK(to<bf16>(3.14159f).bits == 0x4049);
  CHECK(to<fp16>(3.14159).bits == 0x4248);
  CHECK(to<bf16>(fp16::from_bits(0x3c00)).bits == 0x3f80);
  CHECK(to<fp16>(bf16::from_bits(0x3f80)).bits == 0x3c00);
  // 2^24 + 2^16 + 1 lies just above the bf16 midpoint 2^24 + 2^16; through
  // float it would first round onto the midpoint and then tie down to 2^24.
  CHECK(to<bf16>(16842753).bits == bf16(16908288.0f).bits);
  static_assert(std::is_same_v<accum_t<bf16>, float> && std::is_same_v<accum_t<double>, double>);
  CHECK(std::string(dtype_name<bf16>()) == "bf16");
}

}  // namespace test_core_numeric
