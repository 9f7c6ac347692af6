#pragma once
/// \file optim/clip.hpp
/// Global L2 gradient norm and the clipping coefficient.
///
/// The sum of squares is reduced in float64 over fixed blocks of 4096
/// elements whose partial sums are added in block order, so the result is the
/// same bits whatever the OpenMP thread count.

#include <cmath>
#include <cstdint>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/core/numeric.hpp"

namespace tessera::optim {

/// Sum of squares of g[0, n) in float64 (deterministic, thread-count independent).
/// `G` is float, double or bf16.
template <class G>
double grad_sum_squares(const G* g, std::int64_t n) {
  constexpr std::int64_t block = 4096;
  const std::int64_t nb = (n + block - 1) / block;
  std::vector<double> partial(static_cast<std::size_t>(nb), 0.0);
#pragma omp parallel for schedule(static)
  for (std::int64_t b = 0; b < nb; ++b) {
    double s = 0.0;
    const std::int64_t e = std::min(n, (b + 1) * block);
    for (std::int64_t i = b * block; i < e; ++i) {
      double x = to<double>(g[i]);
      s += x * x;
    }
    partial[static_cast<std::size_t>(b)] = s;
  }
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

/// Clip coefficient for a global norm, as torch.nn.utils.clip_grad_norm_:
/// min(1, max_norm / (norm + 1e-6)). max_norm <= 0 disables clipping (returns 1).
/// A non-finite norm returns NaN so the caller can skip the step.
inline double clip_coefficient(double norm, double max_norm) {
  if (!std::isfinite(norm)) return std::nan("");
  if (max_norm <= 0) return 1.0;
  double c = max_norm / (norm + 1e-6);
  return c < 1.0 ? c : 1.0;
}

}  // namespace tessera::optim
