// train_llama's CUDA trainers of precision::fp16_mixed (one translation unit per
// precision: they compile in parallel).
#include "run_cuda.hpp"

#if defined(TESSERA_EXAMPLE_CUDA)
template int tessera::train::dispatch_job<tessera::cuda, tessera::precision::fp16_mixed>(
    tessera::train::job&, const std::filesystem::path&, tessera::created_paths&);
#endif
