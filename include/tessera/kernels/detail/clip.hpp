#pragma once
/// \file kernels/detail/clip.hpp
/// The clip coefficient of gradient-norm clipping, shared by the host
/// (kernels/optimizer.hpp) and the CUDA kernel (kernels/cuda/grad_norm.cuh).

#include <math.h>

#include "tessera/core/config.hpp"

namespace tessera::kernels {

/// Clip coefficient for a global norm, as torch.nn.utils.clip_grad_norm_:
/// min(1, max_norm / (norm + 1e-6)). max_norm <= 0 disables clipping
/// (returns 1). A non-finite norm returns NaN so the caller skips the step.
/// Source: Pascanu et al. 2013, "On the difficulty of training RNNs".
TESSERA_HOST_DEVICE inline double clip_coefficient_of(double norm, double max_norm) {
  if (!isfinite(norm)) return nan("");
  if (max_norm <= 0) return 1.0;
  const double c = max_norm / (norm + 1e-6);
  return c < 1.0 ? c : 1.0;
}

/// The multiplier of gradients computed under a loss scale S, from their
/// global sum of squares (of the scaled gradients) and inv_scale = 1/S:
/// clip_coefficient_of(sqrt(sum_squares) / S, max_norm) / S, so the norm
/// and the clip see the true gradients and the optimizer, which multiplies
/// each gradient by this once, unscales them exactly once. NaN for a
/// non-finite sum (an overflow anywhere: the step is skipped). With
/// inv_scale = 1 it is clip_coefficient_of(sqrt(sum_squares), max_norm)
/// bit for bit; with a power-of-two S the unscaling is exact.
/// Source: Micikevicius et al. 2018, "Mixed Precision Training", section 3.2.
TESSERA_HOST_DEVICE inline double unscaled_clip_coefficient_of(double sum_squares, double max_norm,
                                                               double inv_scale) {
  return clip_coefficient_of(sqrt(sum_squares) * inv_scale, max_norm) * inv_scale;
}

}  // namespace tessera::kernels
