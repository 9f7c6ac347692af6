// Must not compile: partial sums fed to a column-parallel layer, which
// needs the complete input on every rank.
// FIRST_ERROR: missing all_reduce
#include <tessera/nn/tensor_parallel.hpp>

void f(const tessera::kernels::host_context& ctx, float* y, float* q, const float* x,
       const float* wo_r, const float* wq_r) {
  const tessera::nn::row_parallel_linear wo{8, 4, 0};
  const tessera::nn::column_parallel_linear wq{4, 8, 0};
  tessera::partial_sum<float> p =
      wo.forward(ctx, y, tessera::feature_sharded<const float>{x, 2, 4}, wo_r);
  wq.forward(ctx, q, p, wq_r);
}
