#pragma once
/// \file kernels/elementwise.hpp
/// Element-wise host kernels: residual add and casts between storage types.
/// Arithmetic in accum_t; a 16-bit result is rounded once, at the store.

#include <cstdint>

#include "tessera/core/numeric.hpp"

namespace tessera::kernels {

/// out[i] = a[i] + b[i] for i < n. `out` may alias `a` or `b`.
template <class T>
void residual_add(T* out, const T* a, const T* b, std::int64_t n) {
  using A = accum_t<T>;
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < n; ++i) out[i] = to<T>(to<A>(a[i]) + to<A>(b[i]));
}

/// out[i] = To(in[i]) for i < n (round to nearest even for 16-bit types).
template <class To, class From>
void cast(To* out, const From* in, std::int64_t n) {
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < n; ++i) out[i] = to<To>(in[i]);
}

}  // namespace tessera::kernels
