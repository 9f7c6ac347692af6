// train_llama --backend cuda: the same trainer on one GPU, or one GPU per
// MPI process over NCCL (--comm nccl --dp N --tp T --pp P --zero K under mpirun,
// dp x tp x pp processes), in builds with the CUDA kernels (the cuda preset).
#include "run.hpp"

#if defined(TESSERA_EXAMPLE_CUDA)
#include <cstdlib>

#include "tessera/cuda.hpp"
#include "tessera/optim/sgd.hpp"
#if defined(TESSERA_EXAMPLE_NCCL)
#include "tessera/comm/device_mesh.hpp"
#include "tessera/comm/nccl.hpp"
#include "tessera/nn/tensor_parallel.hpp"
#endif

namespace train_llama {
namespace {

// The GPU's peak for MFU: --peak-tflops, else its datasheet's dense bf16 rate.
kernels::peak_flops gpu_peak(const options& o) {
  const int dev = tessera::cuda::current_device();
  cudaDeviceProp p{};
  TESSERA_CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
  kernels::peak_flops k;
  if (o.peak_tflops > 0) {
    k.flops = o.peak_tflops * 1e12;
    k.how =
        tessera::detail::str("GPU ", p.name, " (sm_", p.major, p.minor, "), given (--peak-tflops)");
  } else {
    k.flops = tessera::cuda::datasheet_bf16_flops(dev);
    TESSERA_THROW_IF(!(k.flops > 0), config_error, "GPU ", p.name,
                     " is not in the table of datasheet bf16 rates: pass --peak-tflops");
    k.how = tessera::detail::str("GPU ", p.name, " (sm_", p.major, p.minor,
                                 "), the datasheet's dense bf16 rate");
  }
  return k;
}

#if defined(TESSERA_EXAMPLE_NCCL)
// The ranks of a run over NCCL, bootstrapped over `boot`.
template <precision::policy P, class O, class S>
int run_cuda_nccl_ranks(options& o, const fs::path& tok, created_paths& created,
                        comm::mpi_communicator& boot) {
  const int n_dev = tessera::cuda::device_count();
  TESSERA_THROW_IF(n_dev < 1, config_error, "--comm nccl: no CUDA device is visible");
  const char* lr = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  const int device = (lr ? std::atoi(lr) : boot.rank()) % n_dev;
  TESSERA_CUDA_CHECK(cudaSetDevice(device));
  comm::nccl_communicator c(boot, device, nullptr, comm_opts(o));
  parallel::data_parallel_options dpo;
  dpo.bucket_bytes = static_cast<std::int64_t>(o.bucket_mb * 1e6);
  data::token_file data(tok);
  const int pp = o.cfg.pp > 1 ? static_cast<int>(o.cfg.pp) : 1;
  if (o.tp > 1 || pp > 1) {
    // The dp x tp x pp mesh (tp fastest: a tp group is consecutive ranks,
    // one node's GPUs); the model puts the tp group, the trainer the pp
    // group, on the trainer's stream.
    const comm::device_mesh mesh(o.dp, o.tp, pp);
    auto g = comm::make_groups(c, mesh);
    auto run = [&](auto l) {
      train::trainer<P, tessera::cuda, O, S, comm::nccl_communicator, decltype(l)> tr(
          model_config(o), run_config(o), data, parallel::layout{g.dp, l, g.pp}, dpo);
      return train_loop(o, tr, data, tok, created, gpu_peak(o));
    };
    if (o.tp > 1) return run(nn::tensor_parallel_layers<comm::nccl_communicator>{&g.tp});
    return run(nn::dense_layers{});
  }
  train::trainer<P, tessera::cuda, O, S, comm::nccl_communicator> tr(
      model_config(o), run_config(o), data, parallel::layout{c}, dpo);
  return train_loop(o, tr, data, tok, created, gpu_peak(o));
}

// One process per GPU: the device is the process's local rank.
template <precision::policy P, class O, class S>
int run_cuda_nccl(options& o, const fs::path& tok, created_paths& created) {
  comm::mpi_environment env;
  comm::mpi_communicator boot(MPI_COMM_WORLD, comm_opts(o));
  return notify_peers_on_error(o, [&] {
    auto reduce = train::world_reduction(boot);
    train::agree_settings(reduce, boot.rank(), o.config_json, "train_llama's options");
    return run_cuda_nccl_ranks<P, O, S>(o, tok, created, boot);
  });
}
#endif

template <precision::policy P, class O>
int run_cuda_opt(options& o, const fs::path& tok, created_paths& created) {
  check_before_ranks(o, tok);  // before asking for the device
  data::token_file data(tok);
  if (o.parallel) {
#if defined(TESSERA_EXAMPLE_NCCL)
    TESSERA_THROW_IF(o.comm != "nccl", config_error, "--backend cuda --comm ", o.comm,
                     ": GPUs reduce over --comm nccl (one MPI process per GPU)");
    switch (o.zero) {
      case 0:
        return run_cuda_nccl<P, O, parallel::zero<0>>(o, tok, created);
      case 1:
        return run_cuda_nccl<P, O, parallel::zero<1>>(o, tok, created);
      case 2:
        return run_cuda_nccl<P, O, parallel::zero<2>>(o, tok, created);
      case 3:
        return run_cuda_nccl<P, O, parallel::zero<3>>(o, tok, created);
    }
    throw config_error("--zero " + std::to_string(o.zero) + " is not a ZeRO stage");
#else
    throw config_error(
        "--backend cuda: this build has no NCCL (data parallelism on GPUs needs "
        "tessera::nccl: NCCL and MPI)");
#endif
  }
  TESSERA_THROW_IF(tessera::cuda::device_count() < 1, config_error,
                   "--backend cuda: no CUDA device is visible");
  train::trainer<P, tessera::cuda, O> tr(model_config(o), run_config(o), data);
  return train_loop(o, tr, data, tok, created, gpu_peak(o));
}

template <precision::policy P>
int run_cuda_with(options& o, const fs::path& tok, created_paths& created) {
  if (o.optimizer == "adamw") return run_cuda_opt<P, optim::adamw>(o, tok, created);
  if (o.optimizer == "sgd") return run_cuda_opt<P, optim::sgd>(o, tok, created);
  throw config_error("unknown optimizer '" + o.optimizer + "' (valid: adamw, sgd)");
}

}  // namespace

int run_cuda(options& o, const fs::path& tok, created_paths& created) {
  if (o.precision == "bf16_mixed_bf16_grads")
    return run_cuda_with<precision::bf16_mixed_bf16_grads>(o, tok, created);
  if (o.precision == "bf16" || o.precision == "bf16_mixed")
    return run_cuda_with<precision::bf16_mixed>(o, tok, created);
  throw config_error("--precision " + o.precision +
                     ": the cuda backend trains bf16 weights (bf16_mixed_bf16_grads, the "
                     "default, or bf16); fp32 and fp64 run on the host");
}

}  // namespace train_llama

#else

namespace train_llama {
int run_cuda(options&, const fs::path&, created_paths&) {
  throw tessera::config_error(
      "--backend cuda: this build has no CUDA backend (configure with the cuda preset: cmake "
      "--preset cuda)");
}
}  // namespace train_llama

#endif
