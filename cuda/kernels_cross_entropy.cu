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

void vocab_parallel_ce_row_max(float* d_max, const float* d_logits, std::int64_t rows,
                               std::int64_t Vl, std::int64_t real, cudaStream_t stream) {
  detail::vocab_parallel_ce_row_max_impl(d_max, d_logits, rows, Vl, real, stream);
}

void vocab_parallel_ce_row_sums(float* d_sums, const float* d_logits, const float* d_max,
                                const std::int32_t* d_targets, std::int64_t rows, std::int64_t V,
                                std::int64_t v_begin, std::int64_t Vl, std::int64_t real,
                                std::int32_t ignore_index, cudaStream_t stream) {
  detail::vocab_parallel_ce_row_sums_impl(d_sums, d_logits, d_max, d_targets, rows, V, v_begin,
                                          Vl, real, ignore_index, stream);
}

void vocab_parallel_ce_row_grad(double* d_row_loss, bf16* d_dlogits, const float* d_logits,
                                const float* d_max, const float* d_sums,
                                const std::int32_t* d_targets, std::int64_t rows,
                                std::int64_t v_begin, std::int64_t Vl, std::int64_t real,
                                std::int32_t ignore_index, float grad_scale,
                                cudaStream_t stream) {
  detail::vocab_parallel_ce_row_grad_impl(d_row_loss, d_dlogits, d_logits, d_max, d_sums,
                                          d_targets, rows, v_begin, Vl, real, ignore_index,
                                          grad_scale, stream);
}

void lm_head_ce_finish(double* d_loss_sum, const double* d_row_loss, bf16* d_dx,
                       const std::int32_t* d_targets, std::int64_t N, std::int64_t H,
                       std::int32_t ignore_index, cudaStream_t stream) {
  detail::lm_head_ce_finish_impl(d_loss_sum, d_row_loss, d_dx, d_targets, N, H, ignore_index,
                                 stream);
}

TESSERA_CUDA_ELEMENTWISE_MODEL_INSTANTIATIONS(template)

}  // namespace tessera::kernels::cuda
