// train_llama --backend cuda's typed half: the job's world on GPUs
// (job_world<cuda>), included by run_cuda_<precision>.cpp, each of which
// instantiates one precision's trainers (they compile in parallel), and by
// run_cuda.cpp, which picks the precision.
#pragma once

#if defined(TESSERA_EXAMPLE_CUDA)
#include "tessera/cuda.hpp"
#if defined(TESSERA_EXAMPLE_NCCL)
#include "tessera/comm/nccl.hpp"
#endif
#endif
#include "run.hpp"

#if defined(TESSERA_EXAMPLE_CUDA)
namespace tessera::train {

/// A job's world on GPUs: this process's GPU (one rank, no --comm), or one
/// GPU per MPI process over NCCL (--comm nccl, dp x tp x pp processes).
template <>
struct job_world<cuda> {
  static constexpr bool one_device = true;  // without --comm nccl: this process's GPU
  template <class P, class O>
  static int run_one(job& o, const std::filesystem::path& tok, created_paths& created) {
    TESSERA_THROW_IF(tessera::cuda::device_count() < 1, config_error,
                     "--backend cuda: no CUDA device is visible");
    const data::token_file data(tok);
    trainer<P, cuda, O> tr(model_config(o), run_config(o), data);
    return fit_job(o, tr, data, tok, created, kernels::device_peak(o.peak_tflops * 1e12));
  }
  template <class Ranks>
  static int run(job& o, Ranks&& ranks) {
#if defined(TESSERA_EXAMPLE_NCCL)
    comm::mpi_environment env;
    comm::mpi_communicator boot(MPI_COMM_WORLD, comm_options_of(o));
    return comm::mpi_run_notifying(
        [&] {
          auto reduce = world_reduction(boot);
          agree_settings(reduce, boot.rank(), o.config_json, o.program + "'s options");
          const int n_dev = tessera::cuda::device_count();
          TESSERA_THROW_IF(n_dev < 1, config_error, "--comm nccl: no CUDA device is visible");
          const int local = comm::launched_world().local_rank;  // one GPU per process of a node
          TESSERA_CUDA_CHECK(cudaSetDevice((local >= 0 ? local : boot.rank()) % n_dev));
          comm::nccl_communicator w(boot, tessera::cuda::current_device(), nullptr,
                                    comm_options_of(o));
          return ranks(w, kernels::device_peak(o.peak_tflops * 1e12));
        },
        [&] { return report_failure(o); });
#else
    (void)ranks;
    throw config_error("--backend cuda --comm " + o.comm +
                       ": this build has no NCCL (data parallelism on GPUs needs tessera::nccl: "
                       "NCCL and MPI)");
#endif
  }
};

extern template int dispatch_job<cuda, precision::bf16_mixed>(job&, const std::filesystem::path&,
                                                              created_paths&);
extern template int dispatch_job<cuda, precision::bf16_mixed_bf16_grads>(
    job&, const std::filesystem::path&, created_paths&);
extern template int dispatch_job<cuda, precision::fp16_mixed>(job&, const std::filesystem::path&,
                                                              created_paths&);
extern template int dispatch_job<cuda, precision::fp8_mixed>(job&, const std::filesystem::path&,
                                                             created_paths&);

}  // namespace tessera::train
#endif
