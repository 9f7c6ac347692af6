#pragma once
/// \file core/random.hpp
/// Counter-based, portable random numbers: the same bits on every compiler
/// and standard library (std::normal_distribution is implementation-defined,
/// so it is not used where runs must replay bit for bit).

#include <cmath>
#include <cstdint>

#include "tessera/core/config.hpp"

namespace tessera {

/// splitmix64 finaliser (Steele, Lea & Flood 2014): a bijective 64-bit mix.
TESSERA_HOST_DEVICE inline std::uint64_t mix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// The counter rng(seed) starts from: its draw d is mix64(rng_start(seed) + d).
TESSERA_HOST_DEVICE inline std::uint64_t rng_start(std::uint64_t seed) {
  return mix64(seed ^ 0x5eed5eed5eed5eedull);
}

/// Small sequential generator over mix64 (state advances by one per draw).
struct rng {
  std::uint64_t state;
  explicit rng(std::uint64_t seed) : state(rng_start(seed)) {}
  std::uint64_t next_u64() { return mix64(state++); }
  /// Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }
  /// Standard normal by Box-Muller (one value per call; portable).
  double normal() {
    double u1 = uniform(), u2 = uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586476925 * u2);
  }
};

/// The k-th value of rng::normal() of a generator that started at counter
/// `start` (rng_start(seed)), computed from the counter alone (draws 2k and
/// 2k + 1), so element k of a stream needs no draw before it: the same
/// expression, operation for operation, as normal(). No addition follows a
/// multiplication, so no compiler may contract one into an FMA: on the host
/// the bits equal normal()'s (glibc's log and cos; tests/kernels/
/// weight_init.cpp). In device code log and cos are CUDA's (at most 1 and 2
/// units in the last place of double; CUDA C++ Programming Guide, "Mathematical
/// Functions"), so a value may differ from the host's in its last bits.
TESSERA_HOST_DEVICE inline double normal_at(std::uint64_t start, std::uint64_t k) {
  double u1 = static_cast<double>(mix64(start + 2 * k) >> 11) * 0x1.0p-53;
  const double u2 = static_cast<double>(mix64(start + 2 * k + 1) >> 11) * 0x1.0p-53;
  if (u1 < 1e-300) u1 = 1e-300;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586476925 * u2);
}

}  // namespace tessera
