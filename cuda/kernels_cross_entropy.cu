// The fused LM head and cross-entropy (kernels/cuda/cross_entropy.hpp) and
// the element-wise kernels of the CUDA model that kernels.hpp lists under
// TESSERA_CUDA_ELEMENTWISE_MODEL_INSTANTIATIONS (residual_add,
// count_nonfinite), compiled once into tessera::cuda_kernels for sm_90a and
// sm_80. A TU of its own (cuda/CMakeLists.txt globs kernels*.cu), so it
// builds beside cuda/kernels.cu and a change here recompiles only this.
// cross_entropy.cuh defines the non-template entry points (strong symbols
// here, inline in a header-only translation unit: kernels/cuda/linkage.hpp).
#define TESSERA_CUDA_KERNELS_INSTANTIATING 1

#include "tessera/kernels/cuda/cross_entropy.cuh"
#include "tessera/kernels/cuda/elementwise.cuh"

namespace tessera::kernels::cuda {
TESSERA_CUDA_ELEMENTWISE_MODEL_INSTANTIATIONS(template)
}  // namespace tessera::kernels::cuda
