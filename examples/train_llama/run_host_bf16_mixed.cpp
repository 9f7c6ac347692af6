// train_llama's host trainers of precision::bf16_mixed (one translation unit per
// precision: they compile in parallel).
#include "run.hpp"

namespace train_llama {
template int run_precision<host, precision::bf16_mixed>(options&, const fs::path&, created_paths&);
}  // namespace train_llama
