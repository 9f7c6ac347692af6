// Compiles the one code path's CUDA instantiations (g++ with the CUDA
// headers, warnings as errors), so CI checks them on a machine without a
// GPU: the model, the optimizers and the trainer on one GPU for both bf16
// policies, fp16_mixed and fp8_mixed, the data-parallel trainer over NCCL under every ZeRO
// stage, and the tensor-parallel model and trainer over NCCL (dp x tp), fp8_mixed's too;
// context-parallel attention (ring and Ulysses) over NCCL with bf16 storage.
// Nothing here runs; the GPU tests (tests/cuda/) run them.
#include <tessera/comm/nccl.hpp>
#include <tessera/cuda.hpp>
#include <tessera/nn/context_parallel.hpp>
#include <tessera/nn/tensor_parallel.hpp>

namespace tessera {

template class nn::llama<precision::bf16_mixed, cuda>;
template class nn::llama<precision::bf16_mixed_bf16_grads, cuda>;
template class nn::llama<precision::fp16_mixed, cuda>;
template class nn::llama<precision::fp8_mixed, cuda>;
template class optim::adamw_optimizer<bf16, float, float, kernels::cuda_context>;
template class optim::sgd_optimizer<bf16, float, float, kernels::cuda_context>;
template class optim::adamw_optimizer<fp16, float, float, kernels::cuda_context>;
template class optim::sgd_optimizer<fp16, float, float, kernels::cuda_context>;
template class optim::lion_optimizer<bf16, float, float, kernels::cuda_context>;
template class optim::lion_optimizer<bf16, bf16, float, kernels::cuda_context>;
template class optim::lion_optimizer<fp16, float, float, kernels::cuda_context>;
template class optim::adafactor_optimizer<bf16, float, float, kernels::cuda_context>;
template class optim::adafactor_optimizer<bf16, bf16, float, kernels::cuda_context>;
template class optim::adafactor_optimizer<fp16, float, float, kernels::cuda_context>;
template class optim::muon_optimizer<bf16, float, float, kernels::cuda_context>;
template class optim::muon_optimizer<bf16, bf16, float, kernels::cuda_context>;
template class optim::muon_optimizer<fp16, float, float, kernels::cuda_context>;

template class train::trainer<precision::bf16_mixed, cuda>;
template class train::trainer<precision::bf16_mixed_bf16_grads, cuda>;
template class train::trainer<precision::bf16_mixed_bf16_grads, cuda, optim::sgd>;
template class train::trainer<precision::bf16_mixed_bf16_grads, cuda, optim::lion>;
template class train::trainer<precision::bf16_mixed_bf16_grads, cuda, optim::adafactor>;
template class train::trainer<precision::bf16_mixed, cuda, optim::muon>;
// Muon under ZeRO over NCCL: the buckets' pieces of each matrix gathered over dp.
template class train::trainer<precision::bf16_mixed, cuda, optim::muon, parallel::zero<1>,
                              comm::nccl_communicator>;
template class train::trainer<precision::bf16_mixed, cuda, optim::adafactor, parallel::zero<0>,
                              comm::nccl_communicator>;
template class train::trainer<precision::fp16_mixed, cuda>;
template class train::trainer<precision::fp16_mixed, cuda, optim::sgd>;
template class train::trainer<precision::fp8_mixed, cuda>;
template class train::trainer<precision::fp8_mixed, cuda, optim::adamw, parallel::zero<1>,
                              comm::nccl_communicator>;
template class train::trainer<precision::bf16_mixed, cuda, optim::adamw, parallel::zero<0>,
                              comm::nccl_communicator>;
template class train::trainer<precision::bf16_mixed, cuda, optim::adamw, parallel::zero<1>,
                              comm::nccl_communicator>;
template class train::trainer<precision::bf16_mixed, cuda, optim::adamw, parallel::zero<2>,
                              comm::nccl_communicator>;
template class train::trainer<precision::bf16_mixed, cuda, optim::adamw, parallel::zero<3>,
                              comm::nccl_communicator>;
template class train::trainer<precision::bf16_mixed_bf16_grads, cuda, optim::sgd, parallel::zero<2>,
                              comm::nccl_communicator>;

using nccl_tp = nn::tensor_parallel_layers<comm::nccl_communicator>;
template class nn::llama<precision::bf16_mixed, cuda, nccl_tp>;
template class nn::llama<precision::bf16_mixed_bf16_grads, cuda, nccl_tp>;
template class nn::llama<precision::fp8_mixed, cuda, nccl_tp>;
template class train::trainer<precision::fp8_mixed, cuda, optim::adamw, parallel::zero<0>,
                              comm::nccl_communicator, nccl_tp>;
template class train::trainer<precision::bf16_mixed, cuda, optim::adamw, parallel::zero<0>,
                              comm::nccl_communicator, nccl_tp>;
// Muon over tp on NCCL: the split matrices' momentum gathered over the tp group.
template class train::trainer<precision::bf16_mixed, cuda, optim::muon, parallel::zero<0>,
                              comm::nccl_communicator, nccl_tp>;
template class train::trainer<precision::bf16_mixed_bf16_grads, cuda, optim::adamw,
                              parallel::zero<1>, comm::nccl_communicator, nccl_tp>;
template class train::trainer<precision::bf16_mixed_bf16_grads, cuda, optim::adamw,
                              parallel::zero<2>, comm::nccl_communicator, nccl_tp>;

// Context-parallel attention over NCCL (the kind is a run-time value: one
// instantiation compiles both), float32 and bf16 gradients.
using nccl_cp = nn::context_parallel_attention<comm::nccl_communicator>;
template void nccl_cp::forward(const kernels::cuda_context&, bf16*, float*, const bf16*,
                               const bf16*, const bf16*, std::int64_t, std::int64_t, std::int64_t,
                               std::int64_t, std::int64_t, kernels::attention_mask) const;
template void nccl_cp::backward(const kernels::cuda_context&, float*, float*, float*, const float*,
                                const bf16*, const bf16*, const bf16*, const bf16*, const float*,
                                std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                                std::int64_t, kernels::attention_mask) const;
template void nccl_cp::backward(const kernels::cuda_context&, bf16*, bf16*, bf16*, const bf16*,
                                const bf16*, const bf16*, const bf16*, const bf16*, const float*,
                                std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                                std::int64_t, kernels::attention_mask) const;

}  // namespace tessera
