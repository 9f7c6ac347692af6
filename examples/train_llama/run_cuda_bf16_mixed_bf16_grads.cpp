// train_llama's CUDA trainers of precision::bf16_mixed_bf16_grads (one translation unit per
// precision: they compile in parallel).
#include "run_cuda.hpp"

#if defined(TESSERA_EXAMPLE_CUDA)
template int tessera::train::dispatch_job<tessera::cuda, tessera::precision::bf16_mixed_bf16_grads>(
    tessera::train::job&, const std::filesystem::path&, tessera::created_paths&);
#endif
