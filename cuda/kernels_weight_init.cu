// kernels::weight_init on the device (kernels/cuda/weight_init.cuh): the
// Thrust algorithm instantiated for the types kernels.hpp lists under
// TESSERA_CUDA_WEIGHT_INIT_INSTANTIATIONS, compiled once into
// tessera::cuda_kernels for sm_90a and sm_80. A TU of its own
// (cuda/CMakeLists.txt globs kernels*.cu): the only one of the library that
// includes Thrust, so the other kernel TUs do not compile its headers.
#define TESSERA_CUDA_KERNELS_INSTANTIATING 1

#include "tessera/kernels/cuda/weight_init.cuh"

namespace tessera::kernels::cuda {
TESSERA_CUDA_WEIGHT_INIT_INSTANTIATIONS(template)
}  // namespace tessera::kernels::cuda
