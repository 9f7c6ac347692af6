#pragma once
/// \file checked.hpp
/// Size arithmetic that cannot wrap: products and sums of element counts,
/// byte counts, token counts and parameter counts, checked with the
/// compiler's overflow builtins (__builtin_mul_overflow, GCC and Clang), so
/// a configuration whose sizes pass 64 bits is refused by name before any
/// allocation instead of wrapping into a small, wrong size.

#include <cstdint>
#include <string>

#include "tessera/core/error.hpp"

namespace tessera {

/// a * b for non-negative int64 sizes. Throws config_error naming `what`,
/// both factors and the limit 2^63 - 1 when the product does not fit, or a
/// factor is negative.
inline std::int64_t checked_mul(std::int64_t a, std::int64_t b, const char* what) {
  std::int64_t r = 0;
  TESSERA_THROW_IF(a < 0 || b < 0, config_error, what, ": negative size ", a < 0 ? a : b,
                   " (sizes are >= 0)");
  TESSERA_THROW_IF(__builtin_mul_overflow(a, b, &r), config_error, what, " overflows 64 bits: ",
                   a, " x ", b, " > 9223372036854775807; reduce the sizes");
  return r;
}

/// a + b for non-negative int64 sizes; throws config_error as checked_mul.
inline std::int64_t checked_add(std::int64_t a, std::int64_t b, const char* what) {
  std::int64_t r = 0;
  TESSERA_THROW_IF(a < 0 || b < 0, config_error, what, ": negative size ", a < 0 ? a : b,
                   " (sizes are >= 0)");
  TESSERA_THROW_IF(__builtin_add_overflow(a, b, &r), config_error, what, " overflows 64 bits: ",
                   a, " + ", b, " > 9223372036854775807; reduce the sizes");
  return r;
}

/// a * b for unsigned byte counts; throws config_error naming `what` when
/// the product passes 2^64 - 1.
inline std::uint64_t checked_mul_u64(std::uint64_t a, std::uint64_t b, const char* what) {
  std::uint64_t r = 0;
  TESSERA_THROW_IF(__builtin_mul_overflow(a, b, &r), config_error, what, " overflows 64 bits: ",
                   a, " x ", b, " > 18446744073709551615; reduce the sizes");
  return r;
}

}  // namespace tessera
