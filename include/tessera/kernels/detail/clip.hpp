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

}  // namespace tessera::kernels
