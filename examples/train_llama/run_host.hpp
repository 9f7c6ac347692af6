// train_llama on the host: one CPU rank, thread ranks (--comm local) or MPI
// ranks (--comm mpi), for precision P (instantiated in run_host_<p>.cpp).
#pragma once

#include <omp.h>

#include <algorithm>
#include <string>
#include <type_traits>

#include "run.hpp"
#include "tessera/comm/device_mesh.hpp"
#include "tessera/comm/local.hpp"
#include "tessera/kernels/blas.hpp"
#include "tessera/kernels/peak.hpp"
#include "tessera/nn/tensor_parallel.hpp"
#include "tessera/optim/sgd.hpp"
#if defined(TESSERA_HAS_MPI) && TESSERA_HAS_MPI
#include "tessera/comm/mpi.hpp"
#endif

namespace train_llama {

// One rank's peak for MFU on `threads` threads, with the sgemm rate
// `blas` measured on that rank's share of the machine beside it.
inline kernels::peak_flops host_peak(const options& o, int threads, double blas) {
  auto p = kernels::host_peak(threads, blas, o.peak_tflops * 1e12);
  p.how += tessera::detail::str(", BLAS ", kernels::blas_core_name());
  return p;
}

// A run on a dp x tp x pp mesh under ZeRO stage S over --comm local or mpi:
// the world splits into tp groups (consecutive ranks), dp groups and
// pipeline groups (Megatron order). Layers: dense (tp 1) or tensor-parallel.
template <precision::policy P, class O, class S, bool TP>
int run_host_mesh(options& o, const fs::path& tok, created_paths& created,
                  const parallel::data_parallel_options& dpo) {
  const comm::device_mesh mesh(o.dp, o.tp, o.cfg.pp > 1 ? static_cast<int>(o.cfg.pp) : 1);
  // The trainer on this rank's groups: dense or tp layers, with or without a pipeline.
  auto run = [&](auto& world, auto& g, const data::token_file& data,
                 const kernels::peak_flops& peak) {
    using Comm = std::remove_reference_t<decltype(world)>;
    using layers = std::conditional_t<TP, nn::tensor_parallel_layers<Comm>, nn::dense_layers>;
    layers l{};
    if constexpr (TP) l.group = &g.tp;
    train::trainer<P, host, O, S, Comm, layers> tr(model_config(o), run_config(o), data,
                                                   parallel::layout{g.dp, l, g.pp}, dpo);
    return train_loop(o, tr, data, tok, created, peak);
  };
  if (o.comm == "local") {
    const int per_rank = std::max(1, omp_get_max_threads() / mesh.size());
    const auto peak = host_peak(o, per_rank, kernels::measure_sgemm_flops() / mesh.size());
    int rc = 0;
    comm::local_world::run(
        mesh.size(),
        [&](comm::local_communicator& world) {
          omp_set_num_threads(per_rank);
          auto g = comm::make_groups(world, mesh);
          data::token_file data(tok);
          const int r = run(world, g, data, peak);
          if (world.rank() == 0) rc = r;
        },
        comm_opts(o));
    return rc;
  }
#if defined(TESSERA_HAS_MPI) && TESSERA_HAS_MPI
  if (o.comm == "mpi") {
    comm::mpi_environment env;
    comm::mpi_communicator world(MPI_COMM_WORLD, comm_opts(o));
    return notify_peers_on_error(o, [&] {
      // Ranks launched with different options stop here, before any group
      // is split or collective issued, naming the option.
      auto reduce = train::world_reduction(world);
      train::agree_settings(reduce, world.rank(), o.config_json, "train_llama's options");
      double blas = world.rank() == 0 ? kernels::measure_sgemm_flops() : 0.0;
      world.broadcast(&blas, 1, 0);
      const auto peak = host_peak(o, omp_get_max_threads(), blas);
      TESSERA_THROW_IF(world.size() != mesh.size(), config_error, "--comm mpi: the mesh dp=", o.dp,
                       " x tp=", o.tp, " x pp=", mesh.pp(), " needs ", mesh.size(),
                       " MPI processes but the job has ", world.size(), " (start it as mpirun -np ",
                       mesh.size(), " ...)");
      auto g = comm::make_groups(world, mesh);
      data::token_file data(tok);
      return run(world, g, data, peak);
    });
  }
  throw config_error("--comm '" + o.comm + "' is not one of local, mpi (the host backend)");
#else
  throw config_error("--comm '" + o.comm + "': this build has no MPI (valid: local)");
#endif
}

// One data-parallel run under ZeRO stage S over --comm local or mpi.
template <precision::policy P, class O, class S>
int run_host_dp(options& o, const fs::path& tok, created_paths& created) {
  parallel::data_parallel_options dpo;
  dpo.bucket_bytes = static_cast<std::int64_t>(o.bucket_mb * 1e6);
  if (o.tp > 1) return run_host_mesh<P, O, S, true>(o, tok, created, dpo);
  if (o.cfg.pp > 1) {
    if constexpr (S::shards_parameters)
      throw config_error(
          "--zero 3 gathers each block's parameters per pass, which a pipeline "
          "does not schedule; use --zero 0, 1 or 2 with --pp");
    else
      return run_host_mesh<P, O, S, false>(o, tok, created, dpo);
  }
  if (o.comm == "local") {
    // Ranks are threads: each gets its share of the OpenMP threads.
    const int per_rank = std::max(1, omp_get_max_threads() / o.dp);
    const auto peak = host_peak(o, per_rank, kernels::measure_sgemm_flops() / o.dp);
    int rc = 0;
    comm::local_world::run(
        o.dp,
        [&](comm::local_communicator& c) {
          omp_set_num_threads(per_rank);
          data::token_file data(tok);
          train::trainer<P, host, O, S, comm::local_communicator> tr(
              model_config(o), run_config(o), data, parallel::layout{c}, dpo);
          const int r = train_loop(o, tr, data, tok, created, peak);
          if (c.rank() == 0) rc = r;
        },
        comm_opts(o));
    return rc;
  }
#if defined(TESSERA_HAS_MPI) && TESSERA_HAS_MPI
  if (o.comm == "mpi") {
    comm::mpi_environment env;
    comm::mpi_communicator c(MPI_COMM_WORLD, comm_opts(o));
    return notify_peers_on_error(o, [&] {
      auto reduce = train::world_reduction(c);
      train::agree_settings(reduce, c.rank(), o.config_json, "train_llama's options");
      double blas = c.rank() == 0 ? kernels::measure_sgemm_flops() : 0.0;
      c.broadcast(&blas, 1, 0);
      const auto peak = host_peak(o, omp_get_max_threads(), blas);
      data::token_file data(tok);
      train::trainer<P, host, O, S, comm::mpi_communicator> tr(model_config(o), run_config(o), data,
                                                               parallel::layout{c}, dpo);
      return train_loop(o, tr, data, tok, created, peak);
    });
  }
  throw config_error("--comm '" + o.comm + "' is not one of local, mpi (the host backend)");
#else
  throw config_error("--comm '" + o.comm + "': this build has no MPI (valid: local)");
#endif
}

template <precision::policy P, class O>
int run_host_opt(options& o, const fs::path& tok, created_paths& created) {
  if (!o.parallel) {
    data::token_file data(tok);
    // Validates everything before any output.
    train::trainer<P, host, O> tr(model_config(o), run_config(o), data);
    const auto peak = host_peak(o, omp_get_max_threads(), kernels::measure_sgemm_flops());
    return train_loop(o, tr, data, tok, created, peak);
  }
  switch (o.zero) {
    case 0:
      return run_host_dp<P, O, parallel::zero<0>>(o, tok, created);
    case 1:
      return run_host_dp<P, O, parallel::zero<1>>(o, tok, created);
    case 2:
      return run_host_dp<P, O, parallel::zero<2>>(o, tok, created);
    case 3:
      return run_host_dp<P, O, parallel::zero<3>>(o, tok, created);
  }
  throw config_error("--zero " + std::to_string(o.zero) +
                     " is not a ZeRO stage (valid: 0, 1, 2, 3)");
}

/// The host run of precision P: picks the optimizer.
template <precision::policy P>
int run_host_with(options& o, const fs::path& tok, created_paths& created) {
  if (o.optimizer == "adamw") return run_host_opt<P, optim::adamw>(o, tok, created);
  if (o.optimizer == "sgd") return run_host_opt<P, optim::sgd>(o, tok, created);
  throw config_error("unknown optimizer '" + o.optimizer + "' (valid: adamw, sgd)");
}

extern template int run_host_with<precision::fp32>(options&, const fs::path&, created_paths&);
extern template int run_host_with<precision::bf16_mixed>(options&, const fs::path&, created_paths&);
extern template int run_host_with<precision::bf16_mixed_bf16_grads>(options&, const fs::path&,
                                                                    created_paths&);
extern template int run_host_with<precision::fp64>(options&, const fs::path&, created_paths&);

}  // namespace train_llama
