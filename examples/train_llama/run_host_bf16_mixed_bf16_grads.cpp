// train_llama's host trainers of precision::bf16_mixed_bf16_grads (one translation unit per
// precision: they compile in parallel).
#include "run.hpp"

template int tessera::train::dispatch_job<tessera::host, tessera::precision::bf16_mixed_bf16_grads>(
    tessera::train::job&, const std::filesystem::path&, tessera::created_paths&);
