// Compiles every public tessera header with nvcc (sm_90a, sm_80) so that the
// shared TESSERA_HOST_DEVICE arithmetic and the host headers stay nvcc-clean.
// In the precompiled mode (kernels/cuda/linkage.hpp): the declarations and
// `extern template` lists a program linking tessera::cuda_kernels sees, with
// no kernel instantiated here. The header-only mode, which compiles every
// kernel a trainer uses, is checked by tessera_cuda_consumer
// (tests/consumer_cuda/main.cu).
#if !defined(TESSERA_CUDA_PRECOMPILED_KERNELS)
#define TESSERA_CUDA_PRECOMPILED_KERNELS 1
#endif

#include <tessera/tessera.hpp>

// The CUDA-only headers (not in the umbrella header): the backend, the
// cuBLASLt wrapper and the kernels (cuda/kernels.cu instantiates those).
#include <tessera/core/cuda.hpp>
#include <tessera/core/nvtx.hpp>
#include <tessera/data/device_loader.hpp>
#include <tessera/kernels/cuda/attention.hpp>
#include <tessera/kernels/cuda/attention_launch.hpp>
#include <tessera/kernels/cuda/cross_entropy.hpp>
#include <tessera/cuda.hpp>
#include <tessera/kernels/cuda/context.hpp>
#include <tessera/kernels/cuda/ops.hpp>
#include <tessera/plan/cuda_step.hpp>
#include <tessera/kernels/cuda/adafactor.cuh>
#include <tessera/kernels/cuda/adamw.cuh>
#include <tessera/kernels/cuda/attention_merge.cuh>
#include <tessera/kernels/cuda/elementwise.cuh>
#include <tessera/kernels/cuda/embedding.cuh>
#include <tessera/kernels/cuda/fp8.cuh>
#include <tessera/kernels/cuda/gemm.cuh>
#include <tessera/kernels/cuda/lion.cuh>
#include <tessera/kernels/cuda/muon.cuh>
#include <tessera/kernels/cuda/grad_norm.cuh>
#include <tessera/kernels/cuda/rmsnorm.cuh>
#include <tessera/kernels/cuda/rope.cuh>
#include <tessera/kernels/cuda/swiglu.cuh>
#include <tessera/kernels/cuda/weight_init.cuh>

namespace {
__global__ void tessera_bf16_roundtrip(const float* in, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = static_cast<float>(tessera::bf16(in[i]));
}
}  // namespace

void tessera_cuda_headers_check_launch(const float* d_in, float* d_out, int n) {
  tessera_bf16_roundtrip<<<(n + 255) / 256, 256>>>(d_in, d_out, n);
}
