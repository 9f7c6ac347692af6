#pragma once
/// \file kernels/elementwise.hpp
/// Element-wise host kernels: residual add and casts between storage types.
/// Arithmetic in accum_t; a 16-bit result is rounded once, at the store.

#include <cstdint>

#include "tessera/core/error.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/kernels/context.hpp"

namespace tessera::kernels {

/// out[i] = a[i] + b[i] for i < n, added in accum_t<T> and rounded once to
/// T. `out` may alias `a` or `b` (element for element). Throws config_error
/// for n < 0 (as the CUDA overload).
template <class T>
void residual_add(const host_context& ctx, T* out, const T* a, const T* b, std::int64_t n) {
  (void)ctx;
  TESSERA_THROW_IF(n < 0, config_error, "residual_add: n=", n, " must be >= 0");
  using A = accum_t<T>;
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < n; ++i) out[i] = to<T>(to<A>(a[i]) + to<A>(b[i]));
}

/// out[i] = To(in[i]) for i < n (round to nearest even for 16-bit types).
/// Throws config_error for n < 0.
template <class To, class From>
void cast(const host_context& ctx, To* out, const From* in, std::int64_t n) {
  (void)ctx;
  TESSERA_THROW_IF(n < 0, config_error, "cast: n=", n, " must be >= 0");
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < n; ++i) out[i] = to<To>(in[i]);
}

}  // namespace tessera::kernels
