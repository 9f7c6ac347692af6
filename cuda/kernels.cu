// The CUDA kernels of include/tessera/kernels/cuda/, instantiated once for
// the types the library uses (kernels/cuda/kernels.hpp lists them), so that
// host code compiled by g++ links them from tessera::cuda_kernels and the
// build compiles each kernel once per architecture (sm_90a, sm_80). (An nvcc
// translation unit of a program compiles them from the headers instead,
// unless it defines TESSERA_CUDA_PRECOMPILED_KERNELS: kernels/cuda/linkage.hpp.)
#define TESSERA_CUDA_KERNELS_INSTANTIATING 1

#include "tessera/kernels/cuda/adafactor.cuh"
#include "tessera/kernels/cuda/adamw.cuh"
#include "tessera/kernels/cuda/elementwise.cuh"
#include "tessera/kernels/cuda/embedding.cuh"
#include "tessera/kernels/cuda/grad_norm.cuh"
#include "tessera/kernels/cuda/lion.cuh"
#include "tessera/kernels/cuda/muon.cuh"
#include "tessera/kernels/cuda/rmsnorm.cuh"
#include "tessera/kernels/cuda/rope.cuh"
#include "tessera/kernels/cuda/swiglu.cuh"

// (embedding.cuh also defines embedding_local_ids here, a strong symbol.)
namespace tessera::kernels::cuda {
TESSERA_CUDA_KERNEL_INSTANTIATIONS(template)
}  // namespace tessera::kernels::cuda
