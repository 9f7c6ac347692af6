// train_llama's typed half: the library's dispatch (tessera/train/run_job.hpp)
// instantiated once per (backend, precision) in run_host_<p>.cpp and
// run_cuda.cpp, so the trainers compile in parallel.
#pragma once

#include <filesystem>

#include "tessera/train/run_job.hpp"

namespace tessera::train {
extern template int dispatch_job<host, precision::fp32>(job&, const std::filesystem::path&,
                                                        created_paths&);
extern template int dispatch_job<host, precision::bf16_mixed>(job&, const std::filesystem::path&,
                                                              created_paths&);
extern template int dispatch_job<host, precision::bf16_mixed_bf16_grads>(
    job&, const std::filesystem::path&, created_paths&);
extern template int dispatch_job<host, precision::fp16_mixed>(job&, const std::filesystem::path&,
                                                              created_paths&);
extern template int dispatch_job<host, precision::fp8_mixed>(job&, const std::filesystem::path&,
                                                             created_paths&);
extern template int dispatch_job<host, precision::fp64>(job&, const std::filesystem::path&,
                                                        created_paths&);
}  // namespace tessera::train

namespace train_llama {
/// --backend cuda (run_cuda.cpp): the precision's dispatch on the CUDA
/// backend, or a config_error in builds without it.
int run_cuda(tessera::train::job& j, const std::filesystem::path& tok,
             tessera::created_paths& created);
}  // namespace train_llama
