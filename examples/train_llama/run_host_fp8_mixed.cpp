// train_llama's host trainers of precision::fp8_mixed (one translation unit per
// precision: they compile in parallel).
#include "run.hpp"

template int tessera::train::dispatch_job<tessera::host, tessera::precision::fp8_mixed>(
    tessera::train::job&, const std::filesystem::path&, tessera::created_paths&);
