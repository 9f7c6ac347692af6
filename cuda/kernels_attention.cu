// The flash attention launchers of kernels/cuda/attention.hpp, compiled
// once into tessera::cuda_kernels: attention.cuh defines them (strong symbols
// here, inline in a header-only translation unit: kernels/cuda/linkage.hpp),
// with its kernels instantiated once per supported head dimension (32, 64,
// 128) and architecture (sm_90a, sm_80). cuda/CMakeLists.txt globs
// kernels*.cu, with -Xptxas=-v so the build log lists each kernel's
// registers and spills.
#define TESSERA_CUDA_KERNELS_INSTANTIATING 1

#include "tessera/kernels/cuda/attention.cuh"
