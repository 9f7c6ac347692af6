// The FP8 scaling kernels (kernels/cuda/fp8.cuh): the types kernels.hpp
// lists under TESSERA_CUDA_FP8_INSTANTIATIONS and the non-template
// fp8_update_scale (a strong symbol here, inline in a header-only
// translation unit: kernels/cuda/linkage.hpp), compiled once into
// tessera::cuda_kernels for sm_90a and sm_80. A TU of its own
// (cuda/CMakeLists.txt globs kernels*.cu): small and quick to compile, and a
// change to the FP8 kernels recompiles only this.
#define TESSERA_CUDA_KERNELS_INSTANTIATING 1

#include "tessera/kernels/cuda/fp8.cuh"

namespace tessera::kernels::cuda {
TESSERA_CUDA_FP8_INSTANTIATIONS(template)
}  // namespace tessera::kernels::cuda
