#pragma once
/// \file numeric.hpp
/// 16-bit floating-point storage types `bf16` and `fp16`.
///
/// Both are trivially copyable 2-byte structs holding the IEEE bit pattern.
/// Conversion from float rounds to nearest, ties to even (NaN stays a quiet
/// NaN with its sign, overflow rounds to infinity, subnormals are kept);
/// conversion to float is exact. The same functions run on host and device
/// (TESSERA_HOST_DEVICE), so a value has the same bits on both.
///
/// Sources: IEEE 754-2008 binary16; bfloat16 as in the TPU/Intel BF16 spec
/// (the top 16 bits of a binary32).

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

/// True for the 16-bit storage types.
template <class T>
inline constexpr bool is_half_v = std::is_same_v<T, bf16> || std::is_same_v<T, fp16>;

/// Accumulation type for a storage type: double for double, float otherwise.
template <class T>
using accum_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

/// Converts any supported numeric type to `To` (rounding to nearest even for
/// the 16-bit types). `to<float>(bf16)` is exact.
template <class To, class From>
TESSERA_HOST_DEVICE inline To to(From x) {
  if constexpr (std::is_same_v<To, From>) {
    return x;
  } else if constexpr (is_half_v<From>) {
    return static_cast<To>(static_cast<float>(x));
  } else if constexpr (is_half_v<To>) {
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
  else if constexpr (std::is_same_v<T, std::uint16_t>) return "uint16";
  else if constexpr (std::is_same_v<T, std::uint32_t>) return "uint32";
  else if constexpr (std::is_same_v<T, std::int32_t>) return "int32";
  else return "unknown";
}

}  // namespace tessera
