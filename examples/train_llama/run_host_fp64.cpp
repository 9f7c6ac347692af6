// train_llama's host trainers of precision::fp64 (one translation unit per
// precision: they compile in parallel).
#include "run.hpp"

namespace train_llama {
template int run_precision<host, precision::fp64>(options&, const fs::path&, created_paths&);
}  // namespace train_llama
