#pragma once
// Helpers of the GPU tests (tests/cuda/*.cpp): device tensors filled from
// host vectors, NaN poisoning (every byte 0xFF is a NaN in float and bf16),
// and the named tolerances.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include <tessera/core/cuda.hpp>
#include <tessera/core/tensor.hpp>

#include "../kernels/kernel_testing.hpp"

namespace tessera::testing {

/// A device tensor holding `h` (allocated from the caching allocator).
template <class T>
tensor<T, cuda> to_device(const std::vector<T>& h) {
  tensor<T, cuda> d(shape{static_cast<std::int64_t>(h.size())});
  cuda::copy_from_host(d.data(), h.data(), h.size() * sizeof(T));
  return d;
}
/// A device tensor of n elements, every byte 0xFF (NaN for float and bf16).
template <class T>
tensor<T, cuda> poisoned_device(std::size_t n) {
  tensor<T, cuda> d(shape{static_cast<std::int64_t>(n)});
  TESSERA_CUDA_CHECK(cudaMemset(d.data(), 0xFF, n * sizeof(T)));
  // cudaMemset is asynchronous and on the legacy stream, which kernels on a
  // non-blocking stream do not wait for.
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  return d;
}
/// Copies a device tensor back.
template <class T>
std::vector<T> to_host(const tensor<T, cuda>& d) {
  std::vector<T> h(static_cast<std::size_t>(d.numel()));
  cuda::copy_to_host(h.data(), d.data(), h.size() * sizeof(T));
  return h;
}

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

}  // namespace tessera::testing
