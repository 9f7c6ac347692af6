// train_llama's host trainers of precision::fp64 (one translation unit per
// precision: they compile in parallel).
#include "run_host.hpp"

namespace train_llama {
template int run_host_with<tessera::precision::fp64>(options&, const fs::path&, created_paths&);
}  // namespace train_llama
