// train_llama --backend cuda: the same trainers on one GPU, or one GPU per
// MPI process over NCCL (--comm nccl, dp x tp x pp processes under mpirun),
// in builds with the CUDA kernels (the cuda preset). The trainers of each
// precision are instantiated in run_cuda_<precision>.cpp.
#include "run_cuda.hpp"

namespace train_llama {

using namespace tessera;

#if defined(TESSERA_EXAMPLE_CUDA)
int run_cuda(train::job& o, const std::filesystem::path& tok, created_paths& created) {
  if (o.precision == "bf16_mixed_bf16_grads")
    return train::dispatch_job<cuda, precision::bf16_mixed_bf16_grads>(o, tok, created);
  if (o.precision == "bf16" || o.precision == "bf16_mixed")
    return train::dispatch_job<cuda, precision::bf16_mixed>(o, tok, created);
  if (o.precision == "fp16" || o.precision == "fp16_mixed")
    return train::dispatch_job<cuda, precision::fp16_mixed>(o, tok, created);
  if (o.precision == "fp8" || o.precision == "fp8_mixed")
    return train::dispatch_job<cuda, precision::fp8_mixed>(o, tok, created);
  throw config_error("--precision " + o.precision +
                     ": the cuda backend trains 16-bit weights (bf16_mixed_bf16_grads, the "
                     "default, bf16 or fp16); fp32, fp8 and fp64 run on the host");
}
#else
int run_cuda(train::job&, const std::filesystem::path&, created_paths&) {
  throw config_error(
      "--backend cuda: this build has no CUDA backend (configure with the cuda preset: cmake "
      "--preset cuda)");
}
#endif

}  // namespace train_llama
