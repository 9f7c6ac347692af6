#pragma once
// Helpers shared by the host kernel tests (tests/kernels/*.cpp): seeded random
// inputs, NaN poisoning, and the float64 central finite-difference check.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "tessera/core/cp_shard.hpp"
#include "../support/cp_rows.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/kernels/context.hpp"

/// The host context the kernel tests call the kernels with (the default
/// resource, the default attention tiles).
inline const tessera::kernels::host_context ctx{};

namespace tessera::testing {

/// Uniform random values in [lo, hi), rounded to T (so a bf16 test's float64
/// reference sees exactly the rounded inputs).
template <class T>
std::vector<T> random_vector(std::size_t n, std::mt19937_64& rng, double lo = -1.0,
                             double hi = 1.0) {
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<T> v(n);
  for (auto& x : v) x = to<T>(d(rng));
  return v;
}

/// Exact widening of any storage type to double.
template <class T>
double as_double(T x) {
  if constexpr (std::is_same_v<T, double>)
    return x;
  else
    return static_cast<double>(to<float>(x));
}
template <class T>
std::vector<double> to_double(const std::vector<T>& v) {
  std::vector<double> r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) r[i] = as_double(v[i]);
  return r;
}

template <class T>
T nan_value() {
  if constexpr (std::is_same_v<T, bf16>)
    return bf16::from_bits(0x7fc0);
  else if constexpr (std::is_same_v<T, fp16>)
    return fp16::from_bits(0x7e00);
  else
    return std::numeric_limits<T>::quiet_NaN();
}

/// Fills `v` with NaN so that an element the kernel forgets to write shows.
template <class T>
void poison(std::vector<T>& v) {
  std::fill(v.begin(), v.end(), nan_value<T>());
}

/// A vector of n NaNs (poison): an output a kernel must write in full.
template <class T>
std::vector<T> poisoned(std::size_t n) {
  std::vector<T> v(n);
  poison(v);
  return v;
}

/// Index of the first NaN in v, or -1 if every element was written.
template <class T>
std::int64_t first_nan(const std::vector<T>& v) {
  for (std::size_t i = 0; i < v.size(); ++i)
    if (std::isnan(as_double(v[i]))) return static_cast<std::int64_t>(i);
  return -1;
}

/// Float64 central finite differences of the scalar `loss()` with respect to
/// every element of `x` (modified in place and restored), compared with
/// `analytic`. Step h = 1e-6 * max(1, |x_i|). Error of element i is
/// |numeric - analytic| / max(|analytic|, rms(analytic)): relative, except that
/// an element far below the gradient's typical size is measured against that
/// size (its finite difference is limited by the loss's absolute rounding,
/// about 1e-16 |L| / h). Returns the largest error.
inline double fd_max_error(std::vector<double>& x, const std::function<double()>& loss,
                           const std::vector<double>& analytic) {
  REQUIRE(x.size() == analytic.size());
  double ss = 0;
  for (double g : analytic) ss += g * g;
  const double rms = std::sqrt(ss / std::max<std::size_t>(1, analytic.size()));
  double worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double xi = x[i];
    const double h = 1e-6 * std::max(1.0, std::fabs(xi));
    x[i] = xi + h;
    const double lp = loss();
    x[i] = xi - h;
    const double lm = loss();
    x[i] = xi;
    const double num = (lp - lm) / (2 * h);
    const double den = std::max({std::fabs(analytic[i]), rms, 1e-300});
    worst = std::max(worst, std::fabs(num - analytic[i]) / den);
  }
  return worst;
}

/// sum_i w[i] * out[i] in double.
template <class T>
double weighted_sum(const std::vector<T>& out, const std::vector<double>& w) {
  double s = 0;
  for (std::size_t i = 0; i < out.size(); ++i) s += w[i] * as_double(out[i]);
  return s;
}

/// Unit roundoff of float32 (2^-24) and bf16 (2^-8), for tolerances.
inline constexpr double u_f32 = 5.9604644775390625e-08;
inline constexpr double u_bf16 = 0.00390625;

/// Largest |got - want| / max(|want|, rms(want)) over the elements: relative,
/// except that elements far below the typical size are measured against
/// that size (their absolute error comes from the large terms they were
/// computed from). NaN anywhere gives +inf.
template <class A, class B>
double max_rel_error(const std::vector<A>& got, const std::vector<B>& want) {
  REQUIRE(got.size() == want.size());
  double ss = 0;
  for (const auto& w : want) ss += as_double(w) * as_double(w);
  const double rms = std::sqrt(ss / std::max<std::size_t>(1, want.size()));
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = as_double(got[i]), w = as_double(want[i]);
    if (std::isnan(g) || std::isnan(w)) return INFINITY;
    const double d = std::abs(g - w) / std::max({std::abs(w), rms, 1e-300});
    worst = std::max(worst, d);
  }
  return worst;
}

/// float32 results against the host's float32 (or a float64 reference):
/// both round each operation to 24 bits but in another order (block trees
/// against sequential loops, FMA contraction), a few 1e-7 relative on rows
/// of thousands; STYLE.md's 1e-5.
inline constexpr double f32_tol = 1e-5;
/// bf16 results against a float64 reference of the same rounded inputs: one
/// rounding to 8 significant bits (2^-9 relative) plus the float32 work
/// before it; 2^-8 allows the rounding to land on either neighbour.
inline constexpr double bf16_tol = 1.0 / 256;
/// fp16 results, as bf16_tol: one rounding to 11 significant bits (2^-12
/// relative) plus the float32 work before it; 2^-11.
inline constexpr double fp16_tol = 1.0 / 2048;
/// The tolerance of a result of type T: bf16_tol, fp16_tol, else f32_tol.
template <class T>
inline constexpr double tol_of = std::is_same_v<T, bf16>   ? bf16_tol
                                 : std::is_same_v<T, fp16> ? fp16_tol
                                                           : f32_tol;

/// True when a and b hold the same bytes, NaN payloads included (a bit-for-bit
/// comparison); empty ranges are equal.
template <class T>
bool same_bits(const T* a, const T* b, std::size_t n) {
  return n == 0 || std::memcmp(a, b, n * sizeof(T)) == 0;
}
template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && same_bits(a.data(), b.data(), a.size());
}

}  // namespace tessera::testing
