// Must not compile: context-parallel attention on a host context over a
// communicator whose buffers are in device memory. The layer's
// static_assert names both.
// EXPECT: the communicator's buffer space and the context's memory differ
#include <tessera/comm/self.hpp>
#include <tessera/nn/context_parallel.hpp>

// A communicator that claims device memory (as nccl_communicator does).
struct device_memory_context : tessera::kernels::host_context {
  static constexpr bool host_accessible = false;
};
using device_comm = tessera::comm::self_communicator<device_memory_context>;

void run(device_comm& c, const float* q, float* out, float* lse) {
  const tessera::nn::context_parallel_attention<device_comm> cpa{&c};
  cpa.forward(tessera::kernels::host_context{}, out, lse, q, q, q, 1, 4, 1, 1, 4);
}
