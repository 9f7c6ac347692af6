#pragma once
/// \file numeric.hpp
/// Floating-point storage types: 16-bit `bf16` and `fp16`, 8-bit `fp8_e4m3`
/// and `fp8_e5m2`.
///
/// Each is a trivially copyable struct holding the bit pattern. Conversion
/// from float rounds to nearest, ties to even, subnormals kept (NaN stays NaN
/// with its sign); conversion to float is exact. The same functions run on
/// host and device (TESSERA_HOST_DEVICE), so a value has the same bits on
/// both. What overflow gives differs: the 16-bit types round to infinity;
/// the 8-bit types clamp to their largest finite value unless asked not to
/// (fp8_saturation).
///
/// Sources: IEEE 754-2008 binary16; bfloat16 as in the TPU/Intel BF16 spec
/// (the top 16 bits of a binary32); OCP 8-bit Floating Point Specification
/// (OFP8), revision 1.0 (2023), for E4M3 and E5M2.

#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "tessera/core/config.hpp"

namespace tessera {

namespace detail {

TESSERA_HOST_DEVICE inline std::uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

TESSERA_HOST_DEVICE inline float bits_float(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

/// double -> float rounded to odd: truncate toward zero, then set the last
/// bit if anything was cut off. Rounding that float once more to nearest even
/// in a format with at most 22 significant bits (bf16: 8, fp16: 11) gives the
/// correctly rounded result of the double (Boldo and Melquiond, "Emulation of
/// FMA and correctly rounded sums: proved algorithms using rounding to odd",
/// IEEE TC 2008, Theorem 1), where rounding to nearest twice would not (a
/// double just above a midpoint would land on it and tie to even). NaN and
/// infinities pass through.
TESSERA_HOST_DEVICE inline float double_to_float_round_odd(double d) {
#if defined(__CUDA_ARCH__)
  float f = __double2float_rz(d);
  if (static_cast<double>(f) != d && d == d) f = __uint_as_float(__float_as_uint(f) | 1u);
  return f;
#else
  const float f = static_cast<float>(d);  // nearest even
  const double back = static_cast<double>(f);
  if (back == d || d != d) return f;  // exact (incl. +-inf, +-0), or NaN
  std::uint32_t u = float_bits(f);
  if (d > 0 ? back > d : back < d) --u;  // rounded away from zero: one step back (inf -> max)
  return bits_float(u | 1u);             // inexact: sticky bit
#endif
}

/// float -> bf16 bits, round to nearest even. NaN -> quiet NaN, sign kept.
TESSERA_HOST_DEVICE inline std::uint16_t float_to_bf16_bits(float f) {
  std::uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep sign and top payload, force quiet bit
    return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  }
  std::uint32_t lsb = (u >> 16) & 1u;
  u += 0x7fffu + lsb;  // carries into the exponent give the correct overflow to inf
  return static_cast<std::uint16_t>(u >> 16);
}

TESSERA_HOST_DEVICE inline float bf16_bits_to_float(std::uint16_t b) {
  return bits_float(static_cast<std::uint32_t>(b) << 16);
}

/// float -> IEEE binary16 bits, round to nearest even, subnormals kept,
/// overflow to +-inf, NaN -> quiet NaN with the sign kept.
TESSERA_HOST_DEVICE inline std::uint16_t float_to_fp16_bits(float f) {
  std::uint32_t u = float_bits(f);
  std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) {
    // >= 65520 rounds to infinity (65504 is the largest finite, 65520 the midpoint).
    return static_cast<std::uint16_t>(sign | 0x7c00u);
  }
  if (a < 0x38800000u) {
    // Result is subnormal or zero: value = a * 2^24 in units of the fp16 subnormal step.
    if (a < 0x33000000u) return sign;  // < 2^-25: rounds to zero (2^-25 exactly ties to 0, even)
    std::uint32_t e = a >> 23;                      // biased float exponent, 102..112
    std::uint32_t m = (a & 0x7fffffu) | 0x800000u;  // 24-bit significand
    std::uint32_t shift = 126u - e;                 // so that result = m >> shift (14..24)
    std::uint32_t q = m >> shift;
    std::uint32_t rem = m & ((1u << shift) - 1u);
    std::uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<std::uint16_t>(sign | q);
  }
  // Normal: rebias exponent (127 -> 15) and round the 13 dropped bits.
  std::uint32_t r = a - 0x38000000u;  // exponent -112
  std::uint32_t lsb = (r >> 13) & 1u;
  r += 0xfffu + lsb;
  return static_cast<std::uint16_t>(sign | (r >> 13));
}

TESSERA_HOST_DEVICE inline float fp16_bits_to_float(std::uint16_t h) {
  std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t e = (h >> 10) & 0x1fu;
  std::uint32_t m = h & 0x3ffu;
  if (e == 0x1fu) return bits_float(sign | 0x7f800000u | (m << 13));
  if (e == 0) {
    if (m == 0) return bits_float(sign);
    // subnormal: m * 2^-24, exact in float
    float v = static_cast<float>(m) * 5.9604644775390625e-08f;
    return sign ? -v : v;
  }
  return bits_float(sign | ((e + 112u) << 23) | (m << 13));
}

}  // namespace detail

/// bfloat16 storage type: 1 sign, 8 exponent, 7 mantissa bits. Arithmetic is
/// done in float (convert, compute, round back).
struct bf16 {
  std::uint16_t bits;
  bf16() = default;
  TESSERA_HOST_DEVICE explicit bf16(float f) : bits(detail::float_to_bf16_bits(f)) {}
  /// Rounds once, to nearest even (not twice through float).
  TESSERA_HOST_DEVICE explicit bf16(double d) : bf16(detail::double_to_float_round_odd(d)) {}
  TESSERA_HOST_DEVICE explicit operator float() const { return detail::bf16_bits_to_float(bits); }
  TESSERA_HOST_DEVICE static bf16 from_bits(std::uint16_t b) {
    bf16 r;
    r.bits = b;
    return r;
  }
};

/// IEEE binary16 storage type: 1 sign, 5 exponent, 10 mantissa bits.
struct fp16 {
  std::uint16_t bits;
  fp16() = default;
  TESSERA_HOST_DEVICE explicit fp16(float f) : bits(detail::float_to_fp16_bits(f)) {}
  /// Rounds once, to nearest even (not twice through float).
  TESSERA_HOST_DEVICE explicit fp16(double d) : fp16(detail::double_to_float_round_odd(d)) {}
  TESSERA_HOST_DEVICE explicit operator float() const { return detail::fp16_bits_to_float(bits); }
  TESSERA_HOST_DEVICE static fp16 from_bits(std::uint16_t b) {
    fp16 r;
    r.bits = b;
    return r;
  }
};

static_assert(sizeof(bf16) == 2 && std::is_trivially_copyable_v<bf16>);
static_assert(sizeof(fp16) == 2 && std::is_trivially_copyable_v<fp16>);

/// What a float -> FP8 conversion does with a magnitude that rounds past the
/// largest finite value (OCP OFP8 rev 1.0, conversion from wider formats:
/// saturating and non-saturating modes). NaN converts to NaN in both modes.
enum class fp8_saturation {
  /// Clamp to the largest finite value with the sign kept, infinities too
  /// (NVIDIA's __NV_SATFINITE, what cuBLASLt and Transformer Engine use when
  /// they cast scaled values). The default of the fp8 constructors.
  finite,
  /// E5M2: +-infinity. E4M3, which has no infinity: NaN (NVIDIA's
  /// __NV_NOSAT; PyTorch's cast to float8_e4m3fn and float8_e5m2).
  none,
};

namespace detail {

/// float -> FP8 bits with `ManBits` mantissa bits and exponent bias `Bias`:
/// round to nearest, ties to even, subnormals kept. The rounding is IEEE 754's
/// with an unbounded exponent; a result above `MaxBits` (the largest finite
/// magnitude's pattern) overflows, to `MaxBits` under fp8_saturation::finite
/// and to `NosatBits` (infinity or NaN) under fp8_saturation::none. NaN ->
/// S.1111111 (the only E4M3 NaN; a quiet NaN in E5M2), sign kept.
template <int ManBits, int Bias, std::uint32_t MaxBits, std::uint32_t NosatBits>
TESSERA_HOST_DEVICE inline std::uint8_t float_to_fp8_bits(float f, fp8_saturation s) {
  const std::uint32_t u = float_bits(f);
  const std::uint32_t sign = (u >> 24) & 0x80u;
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<std::uint8_t>(sign | 0x7fu);
  constexpr std::uint32_t drop = 23u - ManBits;              // float mantissa bits cut off
  constexpr std::uint32_t min_normal = (128u - Bias) << 23;  // 2^(1 - Bias)
  if (a >= min_normal) {
    // Rebias the exponent (127 -> Bias) and round the dropped bits; a carry
    // into the exponent is the correct next binade (+inf lands far above MaxBits).
    std::uint32_t r = a - ((127u - Bias) << 23);
    r += (1u << (drop - 1u)) - 1u + ((r >> drop) & 1u);
    r >>= drop;
    if (r > MaxBits) r = s == fp8_saturation::finite ? MaxBits : NosatBits;
    return static_cast<std::uint8_t>(sign | r);
  }
  // Subnormal or zero: the result counts steps of the smallest subnormal,
  // 2^(1 - Bias - ManBits); the float is m * 2^(e - 150), so the count is
  // m >> shift with the remainder rounded.
  const std::uint32_t e = a >> 23;
  const std::uint32_t shift = (151u - Bias - ManBits) - e;  // >= 21 here
  if (shift > 24u) return static_cast<std::uint8_t>(sign);  // below half a step, float subnormals
  const std::uint32_t m = (a & 0x7fffffu) | 0x800000u;
  std::uint32_t q = m >> shift;
  const std::uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) ++q;  // may carry into the smallest normal
  return static_cast<std::uint8_t>(sign | q);
}

/// float -> E4M3 bits (fp8_e4m3).
TESSERA_HOST_DEVICE inline std::uint8_t float_to_e4m3_bits(float f, fp8_saturation s) {
  return float_to_fp8_bits<3, 7, 0x7eu, 0x7fu>(f, s);
}

/// float -> E5M2 bits (fp8_e5m2).
TESSERA_HOST_DEVICE inline std::uint8_t float_to_e5m2_bits(float f, fp8_saturation s) {
  return float_to_fp8_bits<2, 15, 0x7bu, 0x7cu>(f, s);
}

/// E4M3 bits -> float, exact. S.1111.111 -> a quiet NaN with the sign.
TESSERA_HOST_DEVICE inline float e4m3_bits_to_float(std::uint8_t b) {
  const std::uint32_t sign = static_cast<std::uint32_t>(b & 0x80u) << 24;
  const std::uint32_t e = (b >> 3) & 0xfu, m = b & 0x7u;
  if ((b & 0x7fu) == 0x7fu) return bits_float(sign | 0x7fc00000u);
  if (e == 0) {
    if (m == 0) return bits_float(sign);
    const float v = static_cast<float>(m) * 0.001953125f;  // m * 2^-9, exact
    return sign ? -v : v;
  }
  return bits_float(sign | ((e + 120u) << 23) | (m << 20));
}

/// E5M2 bits -> float, exact: E5M2 is the top byte of a binary16.
TESSERA_HOST_DEVICE inline float e5m2_bits_to_float(std::uint8_t b) {
  return fp16_bits_to_float(static_cast<std::uint16_t>(b << 8));
}

}  // namespace detail

/// OCP OFP8 E4M3 storage type (NVIDIA's __nv_fp8_e4m3, PyTorch's
/// float8_e4m3fn): 1 sign, 4 exponent (bias 7), 3 mantissa bits. No
/// infinities; S.1111.111 (0x7f, 0xff) is NaN, the rest of S.1111.xxx is
/// finite. Largest finite 448 (0x7e), smallest normal 2^-6, smallest
/// subnormal 2^-9.
///
/// From float or double: round to nearest, ties to even, saturating by
/// default (fp8_saturation). A magnitude above 464, the midpoint between 448
/// and the 480 that 0x7f would be, overflows; 464 itself ties to 448 (even).
/// NaN -> NaN with its sign (0x7f, 0xff).
struct fp8_e4m3 {
  std::uint8_t bits;
  /// The largest finite value (0x7e).
  static constexpr float max_finite = 448.0f;
  fp8_e4m3() = default;
  /// Rounds to nearest even; `s` says what a magnitude past the largest
  /// finite value becomes.
  TESSERA_HOST_DEVICE explicit fp8_e4m3(float f, fp8_saturation s = fp8_saturation::finite)
      : bits(detail::float_to_e4m3_bits(f, s)) {}
  /// Rounds once, to nearest even (not twice through float).
  TESSERA_HOST_DEVICE explicit fp8_e4m3(double d, fp8_saturation s = fp8_saturation::finite)
      : fp8_e4m3(detail::double_to_float_round_odd(d), s) {}
  /// Exact; NaN for 0x7f and 0xff.
  TESSERA_HOST_DEVICE explicit operator float() const { return detail::e4m3_bits_to_float(bits); }
  /// The value whose bit pattern is `b`.
  TESSERA_HOST_DEVICE static fp8_e4m3 from_bits(std::uint8_t b) {
    fp8_e4m3 r;
    r.bits = b;
    return r;
  }
};

/// OCP OFP8 E5M2 storage type (NVIDIA's __nv_fp8_e5m2, PyTorch's
/// float8_e5m2): 1 sign, 5 exponent (bias 15), 2 mantissa bits, IEEE 754
/// rules (the top byte of a binary16): S.11111.00 is +-infinity (0x7c, 0xfc),
/// S.11111.xx otherwise NaN. Largest finite 57344 (0x7b), smallest normal
/// 2^-14, smallest subnormal 2^-16.
///
/// From float or double: round to nearest, ties to even, saturating by
/// default (fp8_saturation; non-saturating gives +-infinity). A magnitude of
/// 61440, the midpoint between 57344 and 2^16, or more overflows (the tie
/// goes to the even 2^16). NaN -> 0x7f or 0xff (a quiet NaN, sign kept).
struct fp8_e5m2 {
  std::uint8_t bits;
  /// The largest finite value (0x7b).
  static constexpr float max_finite = 57344.0f;
  fp8_e5m2() = default;
  /// Rounds to nearest even; `s` says what a magnitude past the largest
  /// finite value becomes.
  TESSERA_HOST_DEVICE explicit fp8_e5m2(float f, fp8_saturation s = fp8_saturation::finite)
      : bits(detail::float_to_e5m2_bits(f, s)) {}
  /// Rounds once, to nearest even (not twice through float).
  TESSERA_HOST_DEVICE explicit fp8_e5m2(double d, fp8_saturation s = fp8_saturation::finite)
      : fp8_e5m2(detail::double_to_float_round_odd(d), s) {}
  /// Exact; +-inf for 0x7c and 0xfc, NaN for the other S.11111.xx.
  TESSERA_HOST_DEVICE explicit operator float() const { return detail::e5m2_bits_to_float(bits); }
  /// The value whose bit pattern is `b`.
  TESSERA_HOST_DEVICE static fp8_e5m2 from_bits(std::uint8_t b) {
    fp8_e5m2 r;
    r.bits = b;
    return r;
  }
};

static_assert(sizeof(fp8_e4m3) == 1 && std::is_trivially_copyable_v<fp8_e4m3>);
static_assert(sizeof(fp8_e5m2) == 1 && std::is_trivially_copyable_v<fp8_e5m2>);

/// True for the 16-bit storage types.
template <class T>
inline constexpr bool is_half_v = std::is_same_v<T, bf16> || std::is_same_v<T, fp16>;

/// True for the 8-bit storage types.
template <class T>
inline constexpr bool is_fp8_v = std::is_same_v<T, fp8_e4m3> || std::is_same_v<T, fp8_e5m2>;

/// True for the storage types narrower than float (16- and 8-bit), which
/// convert through float.
template <class T>
inline constexpr bool is_narrow_float_v = is_half_v<T> || is_fp8_v<T>;

/// Accumulation type for a storage type: double for double, float otherwise.
template <class T>
using accum_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

/// Converts any supported numeric type to `To` (rounding once to nearest
/// even for the 16- and 8-bit types; the 8-bit types saturate, as their
/// constructors do). `to<float>(bf16)` and `to<float>(fp8_e4m3)` are exact.
template <class To, class From>
TESSERA_HOST_DEVICE inline To to(From x) {
  if constexpr (std::is_same_v<To, From>) {
    return x;
  } else if constexpr (is_narrow_float_v<From>) {
    return static_cast<To>(static_cast<float>(x));
  } else if constexpr (is_narrow_float_v<To>) {
    // A float rounds once; any other source goes through double (exact for
    // double and for integers up to 2^53) and the single-rounding double path.
    if constexpr (std::is_same_v<From, float>)
      return To(x);
    else
      return To(static_cast<double>(x));
  } else {
    return static_cast<To>(x);
  }
}

/// Short name of a numeric type, for logs and file headers.
template <class T>
constexpr const char* dtype_name() {
  if constexpr (std::is_same_v<T, float>) return "float32";
  else if constexpr (std::is_same_v<T, double>) return "float64";
  else if constexpr (std::is_same_v<T, bf16>) return "bf16";
  else if constexpr (std::is_same_v<T, fp16>) return "fp16";
  else if constexpr (std::is_same_v<T, fp8_e4m3>) return "fp8_e4m3";
  else if constexpr (std::is_same_v<T, fp8_e5m2>) return "fp8_e5m2";
  else if constexpr (std::is_same_v<T, std::uint16_t>) return "uint16";
  else if constexpr (std::is_same_v<T, std::uint32_t>) return "uint32";
  else if constexpr (std::is_same_v<T, std::int32_t>) return "int32";
  else return "unknown";
}

}  // namespace tessera
