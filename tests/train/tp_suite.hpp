#pragma once
// Multi-rank bodies for train::trainer on a dp x tp mesh (tp fastest,
// Megatron order), written once and run under local_communicator
// (tests/train/tensor_parallel.cpp) and mpi_communicator
// (tests/mpi/tensor_parallel.cpp). Bodies throw zero_suite::suite_failure.
//
// Every rank trains five AdamW steps with gradient accumulation (G = 8
// sequences, B = 1) and is held against the single-rank trainer: the loss
// and the gradient norm of every step, then every parameter of its shards
// (its slice of the single-rank model's tensor), at `tol` relative, and
// every parameter's reduced gradient before clipping, gathered over dp to
// the full shard, after every step (padding rows hold zero). The
// norm gains, and key/value heads replicated over tp/nkv ranks, hold the
// same bits on every rank that holds them. The bytes the tp group and the
// key/value replica group send equal the planner's formulas exactly.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include <tessera/comm/device_mesh.hpp>
#include <tessera/nn/tensor_parallel.hpp>
#include <tessera/plan/step.hpp>

#include "trainer_suite.hpp"

namespace tp_suite {

using namespace tessera;
using zero_suite::check;

/// The run's settings: A = 8 / (dp B) micro-batches per rank.
inline train::train_config config(int dp, int tp, std::int64_t steps, bool sp) {
  train::train_config t = trainer_suite::config(dp);
  t.steps = steps;
  t.global_batch = 8;
  t.micro_batch = 1;
  t.tp = tp;
  t.sequence_parallel = sp;
  // AdamW's first update is lr g / (|g| + eps): a gradient near zero turns
  // float32 rounding (1e-7 of the largest entry) into an update difference
  // of up to lr 1e-7 max|g| / eps, which with eps = 1e-8 reaches 2e-5 of
  // the next step's gradients in any change of summation order, tp or not.
  // eps = 1e-6 keeps that amplification below the float32 tolerance.
  t.adamw.eps = 1e-6;
  return t;
}

/// The single-rank run every mesh is held against.
struct reference {
  std::vector<double> loss, norm;          // per step
  std::vector<double> params;              // after the last step
  std::vector<std::vector<double>> grads;  // per step: the gradient before clipping
  nn::param_layout layout;
};

/// `steps` train_steps of `one` recorded as a reference: the loss, the norm
/// and the gradient before clipping of every step, then the parameters.
template <class Trainer>
reference record_run(Trainer& one, std::int64_t steps) {
  reference r;
  for (std::int64_t s = 0; s < steps; ++s) {
    const auto m = one.train_step();
    r.loss.push_back(m.loss);
    r.norm.push_back(m.grad_norm);
    std::vector<double> g(static_cast<std::size_t>(one.model().flat_size()));
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = tessera::to<double>(one.model().grads()[i]);
    r.grads.push_back(std::move(g));
  }
  r.layout = one.model().layout();
  for (std::int64_t i = 0; i < one.model().flat_size(); ++i)
    r.params.push_back(tessera::to<double>(one.model().params()[i]));
  return r;
}

template <class P>
reference single_rank(const data::token_file& f, std::int64_t steps,
                      const nn::checkpoint_policy& ck = {}) {
  train::train_config cfg = config(1, 1, steps, false);
  cfg.checkpointing = ck;
  train::trainer<P> one(trainer_suite::model(), cfg, f);
  return record_run(one, steps);
}

/// One rank of the mesh (dp, tp) on `world` (dp * tp ranks): trains as the
/// reference did and checks everything the header lists.
template <class P, class S, class Comm>
void check_mesh(Comm& world, const reference& ref, const data::token_file& f, int dp, int tp,
                bool sp, double tol, const nn::checkpoint_policy& ck = {}) {
  using layers = nn::tensor_parallel_layers<Comm>;
  const auto steps = static_cast<std::int64_t>(ref.loss.size());
  const comm::device_mesh mesh(dp, tp, 1);
  auto g = comm::make_groups(world, mesh);
  train::train_config cfg = config(dp, tp, steps, sp);
  cfg.checkpointing = ck;
  train::trainer<P, host, optim::adamw, S, Comm, layers> tr(trainer_suite::model(), cfg, f,
                                                            parallel::layout{g.dp, layers{&g.tp}});
  check(tr.model().sequence_parallel() == sp, "sequence parallelism not as configured");
  const Comm* kv = tr.model().kv_replica_group();
  g.tp.reset_stats();
  const std::uint64_t kv0 = kv ? kv->stats().bytes_sent() : 0;
  const auto where = [&] {
    return tessera::detail::str("dp ", dp, " tp ", tp, sp ? " sp" : "", " ", S::name,
                                " world rank ", world.rank());
  };
  // Every tensor's gradient of step s (before clipping, gathered over dp)
  // against its slice of the single-rank gradient, each within `tol` of the
  // tensor's largest entry; padding rows exactly zero.
  std::vector<typename P::grad_type> fullg(static_cast<std::size_t>(tr.model().flat_size()));
  const auto check_grads = [&](std::int64_t s) {
    tr.engine().full_grads(fullg.data());
    const std::vector<double>& want = ref.grads[static_cast<std::size_t>(s)];
    for (const auto& e : tr.model().layout().entries()) {
      const auto& r = ref.layout.at(e.name);
      double worst = 0, scale = 0;
      for (std::int64_t j = 0; j < e.numel; ++j) {
        const double a = tessera::to<double>(fullg[static_cast<std::size_t>(e.offset + j)]);
        if (e.full_index(j) >= e.full.numel()) {
          check(a == 0, where(), " step ", s + 1, ": ", e.name, " padding gradient holds ", a);
          continue;
        }
        const double b = want[static_cast<std::size_t>(r.offset + e.full_index(j))];
        worst = std::max(worst, std::fabs(a - b));
        scale = std::max(scale, std::fabs(b));
      }
      check(worst <= tol * scale, where(), " step ", s + 1, ": the gradient of ", e.name,
            " differs from one rank's by ", worst, " of ", scale);
    }
  };
  // 16-bit weights: after the first update a weight one bf16 ulp apart
  // moves an attention gradient by several percent, so only the first
  // step's gradients are held to `tol`.
  const std::int64_t grad_steps = sizeof(typename P::param_type) == 2 ? 1 : steps;
  for (std::int64_t s = 0; s < steps; ++s) {
    const auto m = tr.train_step();
    const auto u = static_cast<std::size_t>(s);
    check(std::fabs(m.loss - ref.loss[u]) <= tol * ref.loss[u], where(), " step ", s + 1, ": loss ",
          m.loss, " vs one rank's ", ref.loss[u]);
    check(std::fabs(m.grad_norm - ref.norm[u]) <= tol * ref.norm[u], where(), " step ", s + 1,
          ": gradient norm ", m.grad_norm, " vs one rank's ", ref.norm[u]);
    if (s < grad_steps) check_grads(s);
  }
  // Traffic: the planner's formulas to the byte (16-bit tensors travel as
  // float on the host communicators).
  plan::tp_traffic t;
  t.act = std::max<std::size_t>(4, sizeof(typename P::param_type));
  t.act_grad = std::max<std::size_t>(4, sizeof(typename P::act_grad_type));
  t.accum = sizeof(typename P::accum_type);
  t.grad = sizeof(typename P::grad_type);
  t.ce_chunk = cfg.ce_chunk;
  t.checkpointing = ck;
  t.sequence_parallel = sp;
  const std::uint64_t planned = static_cast<std::uint64_t>(steps) *
                                plan::plan_tp_bytes(trainer_suite::model(), cfg.micro_batch,
                                                    cfg.seq, cfg.accum_steps(), tp, g.tp.rank(), t);
  const std::uint64_t sent = g.tp.stats().bytes_sent();
  check(sent == planned, where(), ": the tp group sent ", sent, " bytes, the plan says ", planned);
  const std::uint64_t kv_planned =
      static_cast<std::uint64_t>(steps) * plan::plan_kv_replica_bytes(trainer_suite::model(),
                                                                      cfg.accum_steps(), tp,
                                                                      g.tp.rank(), t.grad);
  const std::uint64_t kv_sent = kv ? kv->stats().bytes_sent() - kv0 : 0;
  check(kv_sent == kv_planned, where(), ": the key/value replica group sent ", kv_sent,
        " bytes, the plan says ", kv_planned);
  // Every parameter of this rank's shards against the single-rank model.
  std::vector<typename P::param_type> fullp(static_cast<std::size_t>(tr.model().flat_size()));
  tr.engine().full_params(fullp.data());
  double worst = 0, scale = 0;
  std::vector<double> gains, kv_weights;
  for (const auto& e : tr.model().layout().entries()) {
    const auto& r = ref.layout.at(e.name);
    for (std::int64_t j = 0; j < e.numel; ++j) {
      const double a = tessera::to<double>(fullp[static_cast<std::size_t>(e.offset + j)]);
      if (e.full_index(j) >= e.full.numel()) {
        check(a == 0, where(), ": ", e.name, " padding row holds ", a);
        continue;
      }
      const double b = ref.params[static_cast<std::size_t>(r.offset + e.full_index(j))];
      worst = std::max(worst, std::fabs(a - b));
      scale = std::max(scale, std::fabs(b));
      if (e.shp.rank == 1) gains.push_back(a);
      if (e.replicas > 1) kv_weights.push_back(a);
    }
  }
  check(worst <= tol * scale, where(), ": parameters differ from one rank's by ", worst, " of ",
        scale);
  // Replicated values, the same bits wherever they are held: the gains on
  // every rank, a key/value head on the ranks of its replica group (the
  // same tp_rank / replicas) in every dp group.
  const int n = world.size();
  std::vector<double> all_gains(gains.size() * static_cast<std::size_t>(n));
  world.all_gather(gains.data(), all_gains.data(), gains.size());
  for (int r = 1; r < n; ++r)
    check(std::memcmp(all_gains.data() + r * gains.size(), all_gains.data(),
                      gains.size() * sizeof(double)) == 0,
          where(), ": the norm gains of world rank ", r, " differ from rank 0's");
  const int rep = nn::kv_replicas(trainer_suite::model(), tp);
  if (rep > 1) {
    std::vector<double> all_kv(kv_weights.size() * static_cast<std::size_t>(n));
    world.all_gather(kv_weights.data(), all_kv.data(), kv_weights.size());
    const int head = g.tp.rank() / rep;
    for (int r = 0; r < n; ++r)
      if (mesh.coord(r).tp / rep == head)
        check(std::memcmp(all_kv.data() + r * kv_weights.size(), kv_weights.data(),
                          kv_weights.size() * sizeof(double)) == 0,
              where(), ": key/value head ", head, " differs on world rank ", r);
  }
}

}  // namespace tp_suite
