// The fused LM head and cross-entropy (kernels/cuda/cross_entropy.hpp) and
// the element-wise kernels of the CUDA model that kernels.hpp lists under
// TESSERA_CUDA_ELEMENTWISE_MODEL_INSTANTIATIONS (residual_add,
// count_nonfinite), compiled once into tessera::cuda_kernels for sm_90a and
// sm_80. A TU of its own (cuda/CMakeLists.txt globs kernels*.cu), so it
// builds beside cuda/kernels.cu and a change here recompiles only this.
#define TESSERA_CUDA_KERNELS_INSTANTIATING 1

#include "tessera/kernels/cuda/cross_entropy.cuh"
#include "tessera/kernels/cuda/elementwise.cuh"

namespace tessera::kernels::cuda {

void lm_head_cross_entropy(cublaslt_context& ctx, double* d_loss_sum, const bf16* d_x,
                           const bf16* d_wlm, const std::int32_t* d_targets, std::int64_t N,
                           std::int64_t V, std::int64_t H, std::int32_t ignore_index,
                           float grad_scale, bf16* d_dx, float* d_dwlm, std::int64_t chunk,
                           void* d_scratch, std::size_t scratch_bytes, cudaStream_t stream) {
  detail::lm_head_cross_entropy_impl(ctx, d_loss_sum, d_x, d_wlm, d_targets, N, V, H, ignore_index,
                                     grad_scale, d_dx, d_dwlm, chunk, d_scratch, scratch_bytes,
                                     stream);
}

TESSERA_CUDA_ELEMENTWISE_MODEL_INSTANTIATIONS(template)

}  // namespace tessera::kernels::cuda
