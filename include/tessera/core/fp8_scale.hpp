#pragma once
/// \file core/fp8_scale.hpp
/// The arithmetic of a per-tensor FP8 scale (q = fp8(x * s), s = fp8_max /
/// amax / 2^margin), shared by the recipes of precision/fp8_scaling.hpp and
/// the kernels of kernels/fp8.hpp and kernels/cuda/fp8.cuh, which set a
/// scale from an amax on the device without the host reading it. Here, in
/// core, because kernels/ and precision/ are one layer and may not include
/// each other (DESIGN.md, "Layer order"); precision:: names them too.
/// Sources: Micikevicius et al. 2022, "FP8 Formats for Deep Learning",
/// section 4; Transformer Engine's pytorch/fp8.py (_default_sf_compute).

#include <math.h>

#include "tessera/core/config.hpp"

namespace tessera {

/// The larger of two amaxes. An amax lies in [0, +inf]: a tensor holding
/// a NaN or an infinity has amax +inf, and a NaN on either side counts as
/// +inf here, so an overflowed use never looks finite once reduced, and
/// every maximum is exact and NaN-free in any order and under any
/// communicator's max-reduce (which need not keep a NaN; fmaxf drops it).
TESSERA_HOST_DEVICE inline float fp8_amax_max(float a, float b) {
  return isnan(a) || isnan(b) ? INFINITY : (a > b ? a : b);
}

/// s = fp8_max / amax / 2^margin, or `previous` where amax is 0 or not
/// finite (an all-zero tensor or an overflowing step does not poison the
/// scale), or where s itself is not finite (a subnormal amax). float
/// arithmetic, as the device computes it (IEEE division on both).
TESSERA_HOST_DEVICE inline float fp8_scale_of(float amax, float fp8_max, int margin,
                                              float previous) {
  if (!(amax > 0.0f) || !isfinite(amax)) return previous;
  const float s = fp8_max / amax / ldexpf(1.0f, margin);
  return isfinite(s) ? s : previous;
}

}  // namespace tessera
