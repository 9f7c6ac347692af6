// The CUDA kernels of include/tessera/kernels/cuda/, instantiated once for
// the types the library uses (kernels/cuda/kernels.hpp lists them), so that
// host code compiled by g++ links them from tessera::cuda_kernels and the
// build compiles each kernel once per architecture (sm_90a, sm_80).
#define TESSERA_CUDA_KERNELS_INSTANTIATING 1

#include "tessera/kernels/cuda/adamw.cuh"
#include "tessera/kernels/cuda/elementwise.cuh"
#include "tessera/kernels/cuda/embedding.cuh"
#include "tessera/kernels/cuda/grad_norm.cuh"
#include "tessera/kernels/cuda/rmsnorm.cuh"
#include "tessera/kernels/cuda/rope.cuh"
#include "tessera/kernels/cuda/swiglu.cuh"

namespace tessera::kernels::cuda {
TESSERA_CUDA_KERNEL_INSTANTIATIONS(template)

void embedding_local_ids(std::int32_t* d_out, const std::int32_t* d_ids, std::int64_t N,
                         std::int64_t v_begin, std::int64_t Vl, std::int32_t ignore_index,
                         cudaStream_t stream) {
  embedding_local_ids_launch(d_out, d_ids, N, v_begin, Vl, ignore_index, stream);
}
}  // namespace tessera::kernels::cuda
