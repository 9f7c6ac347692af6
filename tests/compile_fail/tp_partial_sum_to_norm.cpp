// Must not compile: a row-parallel layer's output (partial sums over the
// tp group) fed to a norm without its all_reduce.
// FIRST_ERROR: missing all_reduce
#include <tessera/nn/tensor_parallel.hpp>

void f(const tessera::kernels::host_context& ctx, float* y, float* out, float* rstd,
       const float* x, const float* w_r, const float* gains) {
  const tessera::nn::row_parallel_linear wo{8, 4, 0};
  tessera::partial_sum<float> p =
      wo.forward(ctx, y, tessera::feature_sharded<const float>{x, 2, 4}, w_r);
  tessera::nn::placed::rmsnorm_forward(ctx, tessera::replicated<float>{out, 2, 8}, rstd, p,
                                       gains, 1e-5);
}
