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

/// Small sequential generator over mix64 (state advances by one per draw).
struct rng {
  std::uint64_t state;
  explicit rng(std::uint64_t seed) : state(mix64(seed ^ 0x5eed5eed5eed5eedull)) {}
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

}  // namespace tessera
