#pragma once
/// \file optim/clip.hpp
/// Global-norm gradient clipping: the clip coefficient of a norm. The sum of
/// squares and the coefficient on a backend's memory are kernels
/// (kernels/optimizer.hpp: grad_sum_squares, clip_coefficient).

#include "tessera/kernels/optimizer.hpp"

namespace tessera::optim {

/// Clip coefficient for a global norm, as torch.nn.utils.clip_grad_norm_:
/// min(1, max_norm / (norm + 1e-6)). max_norm <= 0 disables clipping (returns 1).
/// A non-finite norm returns NaN so the caller can skip the step.
/// Source: Pascanu et al. 2013.
inline double clip_coefficient(double norm, double max_norm) {
  return kernels::clip_coefficient_of(norm, max_norm);
}

}  // namespace tessera::optim
