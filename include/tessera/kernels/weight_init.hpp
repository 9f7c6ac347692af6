#pragma once
/// \file kernels/weight_init.hpp
/// Initial weights written in place, in the context's memory: on a GPU a
/// 7B model's parameters are drawn on the device, with no host copy of the
/// buffer. Each element is a function of its flat index alone
/// (kernels/detail/weight_init.hpp: a counter-based normal, core/random.hpp
/// normal_at), so the host overload here (OpenMP) and the CUDA overload
/// (kernels/cuda/ops.hpp: one Thrust call per tensor on the context's
/// stream, kernels/cuda/weight_init.cuh) compute the same values (up to the
/// device's log and cos: the tolerance below); the host tests run that
/// Thrust code on Thrust's OpenMP and serial backends.

#include <cstdint>
#include <span>

#include "tessera/core/numeric.hpp"
#include "tessera/kernels/context.hpp"
#include "tessera/kernels/detail/weight_init.hpp"

namespace tessera::kernels {

/// Writes flat elements [lo, hi) of a parameter buffer: out[i - lo] =
/// Param(scale * normal_at(start, w)) for element w of a normal tensor's
/// whole tensor, 1 in a ones tensor, 0 on padding rows, in the alignment
/// padding between tensors and after the last one (weight_init_tensor).
/// - `tensors`: host memory, sorted by offset, disjoint.
/// - `out`: hi - lo elements of Param (float, double, bf16) in `ctx`'s memory.
/// - Each value is rounded once from double. Element-wise: any range, any
///   thread count give the same bits, run after run. On the host they are
///   the bits of a sequential rng (nn::init_llama_weights_range draws the
///   same values; tests/kernels/weight_init.cpp, also through Thrust's host
///   backends).
/// - Device tolerance (the CUDA overload): its log and cos are CUDA's (at
///   most 1 and 2 units in the last place of double, against glibc's below
///   1), so the double scale * z can differ from the host's by a few units
///   in the last place of double, and the rounded value changes only where
///   a rounding boundary of Param falls between the two: one unit in the
///   last place of Param, with a probability below about 4 / 2^29 = 7e-9
///   per element in float32 (some tens of the 6.7e9 elements of a 7B model)
///   and 4 / 2^45 = 1e-13 in bf16 (below 10^-3 elements of a 7B model in
///   expectation). tests/cuda/weight_init.cpp checks the one-unit rule and
///   a rate below 10^-5 on a GPU.
/// - Throws config_error for a bad range or tensor table
///   (detail::for_each_weight_init_segment).
template <class Param>
void weight_init(const host_context& ctx, std::span<const weight_init_tensor> tensors,
                 std::int64_t lo, std::int64_t hi, Param* out) {
  (void)ctx;
  detail::for_each_weight_init_segment(
      tensors, lo, hi, [&](const weight_init_tensor& t, std::int64_t b, std::int64_t e) {
#pragma omp parallel for schedule(static)
        for (std::int64_t i = b; i < e; ++i) out[i - lo] = detail::weight_init_value<Param>(t, i);
      });
}

}  // namespace tessera::kernels
