#pragma once
/// \file detail/exp.hpp
/// The exponential of the softmax, SiLU and cross-entropy kernels.
///
/// On the host, `kernels::detail::exp(float)` returns exactly what glibc's
/// expf returns (every float, checked exhaustively in
/// tests/kernels/exp.cpp), but is written so that a loop of it vectorises:
/// no call, no branch, no table lookup that depends on a branch. A call to
/// expf keeps the loop around it scalar (GCC vectorises libm only under
/// -ffast-math), which left the attention and SwiGLU kernels' other
/// arithmetic scalar as well. Matching libm bit for bit keeps the
/// trajectories of runs made with it. double uses std::exp; device code uses
/// CUDA's exp.
///
/// The algorithm is the one glibc's expf has used since 2.28 (Szabolcs
/// Nagy's, from Arm's optimized-routines, math/expf.c, MIT): with N = 32,
/// x N / ln 2 = k + r, |r| <= 1/2, exp(x) = 2^(k/N) 2^(r/N), 2^(k/N) from a
/// 32-entry table and the exponent bits, 2^(r/N) by a cubic, all in double,
/// rounded once to float. Error 0.502 ulp. The coefficients are that
/// routine's (a minimax fit); the table is 2^(i/32) rounded to double.
/// Every multiply-add is an explicit fma, as in glibc's FMA build that x86-64
/// machines with FMA select, so the result does not depend on -ffp-contract;
/// compiled without FMA instructions (no -mfma or -march with it) it calls
/// std::exp instead. The bit-for-bit match is with glibc (2.28 or later) on
/// a CPU with FMA; another libm may round some inputs differently, and this
/// function's results stay the same. Not for -ffast-math builds (the range
/// clamps assume NaN is not folded away).
///
/// The coefficients and the table's layout are those of Arm's
/// optimized-routines (Copyright (c) 2017-2018, Arm Limited; MIT licence,
/// SPDX-License-Identifier: MIT).

#include <bit>
#include <cmath>
#include <cstdint>

#include "tessera/core/config.hpp"

namespace tessera::kernels::detail {

/// 2^(i/32) rounded to the nearest double, as bits, minus i << 47 (the
/// exponent bits that k adds back), i = 0..31.
alignas(64) inline constexpr std::uint64_t exp2_32_table[32] = {
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51,
    0x3fef72b83c7d517b, 0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715, 0x3feef1a7373aa9cb, 0x3feedea64c123422, 0x3feece086061892d,
    0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429, 0x3feea47eb03a5585,
    0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d,
    0x3feee89f995ad3ad, 0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069,
    0x3fef5818dcfba487, 0x3fef7c97337b9b5f, 0x3fefa4afa2a490da, 0x3fefd0765b6e4540};

/// e^x for a float, bit for bit glibc's expf on every input but NaN's
/// payload (a NaN in gives a NaN out); -inf gives 0, +inf gives +inf, below
/// ln 2^-150 (about -103.97) 0, above ln 2^128 (about 88.72) +inf. Sets no
/// errno. Vectorises inside `omp simd` loops (the range clamps are quiet
/// comparisons, so -ftrapping-math does not keep them as branches).
TESSERA_HOST_DEVICE inline float exp(float x) {
#if defined(__CUDA_ARCH__)
  return expf(x);
#elif !defined(__FMA__) && !defined(__ARM_FEATURE_FMA)
  // Without FMA instructions std::fma is a library call, slower than expf
  // itself; glibc's expf then gives the same bits (its FMA build on a CPU
  // with FMA, which is what this path reproduces).
  return std::exp(x);
#else
  constexpr double n = 32;
  constexpr double inv_ln2_n = 0x1.71547652b82fep+0 * n;
  constexpr double shift = 0x1.8p+52;  // adding it rounds to an integer in the low bits
  constexpr double c0 = 0x1.c6af84b912394p-5 / n / n / n;
  constexpr double c1 = 0x1.ebfce50fac4f3p-3 / n / n;
  constexpr double c2 = 0x1.62e42ff0c52d6p-1 / n;
  // Outside [-104, 89] the result is 0 or +inf anyway: clamping there lets
  // the arithmetic below run unconditionally (89 overflows to +inf and -104
  // rounds to 0 at the final conversion). NaN passes both comparisons.
  double xd = x;
  xd = std::isless(xd, -104.0) ? -104.0 : xd;
  xd = std::isgreater(xd, 89.0) ? 89.0 : xd;
  double kd = std::fma(inv_ln2_n, xd, shift);
  const std::uint64_t ki = std::bit_cast<std::uint64_t>(kd);
  kd -= shift;
  const double r = std::fma(inv_ln2_n, xd, -kd);  // x N / ln 2 - k, |r| <= 1/2
  const double s = std::bit_cast<double>(exp2_32_table[ki % 32] + (ki << 47));  // 2^(k/N)
  const double z = std::fma(c0, r, c1);
  const double r2 = r * r;
  double y = std::fma(c2, r, 1.0);
  y = std::fma(z, r2, y);
  return static_cast<float>(y * s);
#endif
}

/// e^x for a double: std::exp (the float64 reference runs keep libm's).
TESSERA_HOST_DEVICE inline double exp(double x) { return std::exp(x); }

}  // namespace tessera::kernels::detail
