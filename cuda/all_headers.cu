// Compiles every public tessera header with nvcc (sm_90a, sm_80) so that the
// shared TESSERA_HOST_DEVICE arithmetic and the host headers stay nvcc-clean.
#include <tessera/tessera.hpp>

namespace {
__global__ void tessera_bf16_roundtrip(const float* in, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = static_cast<float>(tessera::bf16(in[i]));
}
}  // namespace

void tessera_cuda_headers_check_launch(const float* d_in, float* d_out, int n) {
  tessera_bf16_roundtrip<<<(n + 255) / 256, 256>>>(d_in, d_out, n);
}
