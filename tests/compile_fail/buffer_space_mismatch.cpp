// Must not compile: a host model with a communicator whose buffers are in
// device memory. The data-parallel engine's static_assert names both.
// EXPECT: the communicator's buffer space and the model's backend memory differ
#include <tessera/comm/self.hpp>
#include <tessera/parallel/zero.hpp>
#include <tessera/nn/llama.hpp>
#include <tessera/optim/adamw.hpp>

// A context that claims device memory (as kernels::cuda_context does).
struct device_memory_context : tessera::kernels::host_context {
  static constexpr bool host_accessible = false;
};

using engine = tessera::parallel::data_parallel<
    tessera::nn::llama<tessera::precision::fp32>, tessera::optim::adamw, tessera::parallel::zero<0>,
    tessera::comm::self_communicator<device_memory_context>>;
static_assert(sizeof(engine) > 0);
