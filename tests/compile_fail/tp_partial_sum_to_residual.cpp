// Must not compile: a row-parallel layer's output added to the residual
// stream without its all_reduce.
// FIRST_ERROR: missing all_reduce
#include <tessera/nn/tensor_parallel.hpp>

void f(const tessera::kernels::host_context& ctx, float* y, float* out, const float* x_in,
       const float* x, const float* w_r) {
  const tessera::nn::row_parallel_linear wo{8, 4, 0};
  tessera::partial_sum<float> p =
      wo.forward(ctx, y, tessera::feature_sharded<const float>{x, 2, 4}, w_r);
  tessera::nn::placed::residual_add(ctx, tessera::replicated<float>{out, 2, 8},
                                    tessera::replicated<const float>{x_in, 2, 8}, p);
}
