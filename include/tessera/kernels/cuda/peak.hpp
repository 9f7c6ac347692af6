#pragma once
/// \file kernels/cuda/peak.hpp
/// The peak FLOP/s of one GPU for MFU (kernels/peak.hpp's peak_flops): a
/// rate the user gives, or the datasheet's dense bf16 tensor-core rate of
/// the current device (tessera::cuda::datasheet_bf16_flops). MFU is taken
/// against a fixed peak, never a measured one. Plain C++ with the CUDA
/// runtime headers.

#include <cuda_runtime_api.h>

#include "tessera/core/cuda.hpp"
#include "tessera/core/error.hpp"
#include "tessera/kernels/peak.hpp"

namespace tessera::kernels {

/// The current device's peak: `given_flops` when > 0 (described as given),
/// else its datasheet's dense bf16 rate. Throws config_error for a GPU not
/// in the datasheet table without a given rate (naming the GPU), and
/// cuda_error.
inline peak_flops device_peak(double given_flops = 0) {
  const int dev = tessera::cuda::current_device();
  cudaDeviceProp p{};
  TESSERA_CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
  peak_flops k;
  if (given_flops > 0) {
    k.flops = given_flops;
    k.how = tessera::detail::str("GPU ", p.name, " (sm_", p.major, p.minor, "), given (--peak-tflops)");
    return k;
  }
  k.flops = tessera::cuda::datasheet_bf16_flops(dev);
  TESSERA_THROW_IF(!(k.flops > 0), config_error, "GPU ", p.name,
                   " is not in the table of datasheet bf16 rates: pass --peak-tflops");
  k.how = tessera::detail::str("GPU ", p.name, " (sm_", p.major, p.minor,
                               "), the datasheet's dense bf16 rate");
  return k;
}

}  // namespace tessera::kernels
