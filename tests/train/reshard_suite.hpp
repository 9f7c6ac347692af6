#pragma once
// Checkpoints across layouts (resharding), written once and run on thread
// ranks (tests/train/checkpoint_folder.cpp) and on MPI processes
// (tests/mpi/checkpoint.cpp) through train::trainer's save_checkpoint and
// load_checkpoint (include/tessera/train/checkpoint_folder.hpp).
//
// For one pair (A, B) of (dp, tp, pp, schedule, V, ZeRO stage) meshes on a
// world of max(|A|, |B|) ranks: A's ranks train two float64 steps and save;
// B's ranks load that folder and at once save it again, then train three
// more steps and save. Held against:
//   - A's folder: B's immediate save holds every tensor of every role
//     (parameters, master weights, both AdamW moments) bit for bit, and the
//     same run state (step, data position, optimizer steps, settings) less
//     the layout's own keys;
//   - the uninterrupted single-rank run: B's losses and gradient norms of
//     steps 3 to 5, and the parameters B saves after step 5, within 1e-10
//     (the layouts' own tolerance against one rank, tests/train/pipeline.cpp).
// Ranks outside A (or B) wait at a barrier while the others run; the
// ranks share one node's temporary folder. check_resave repeats the
// bit-for-bit check under bf16_mixed, whose float32 master weights float64
// does not keep (master_pairs).
//
// The matrix: every ordered pair of (1,1,1), (2,1,1) zero<3>, (4,1,1)
// zero<2> and (1,2,1) with sequence parallelism; (1,1,2) 1f1b, (1,1,4)
// interleaved V 2 and (2,2,2) zero<1> each to and from several others;
// zero<3> through pipelines (ZB-H1, interleaved, GPipe) to and from others;
// (2,2,2) with each degree changed down to 1 and up to 4 (16 ranks: thread
// ranks only). The model has 8 blocks and 4 key/value heads so that pp 4
// with V 2, and tp 4, split it.

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <tessera/comm/device_mesh.hpp>
#include <tessera/comm/local.hpp>
#include <tessera/nn/tensor_parallel.hpp>
#include <tessera/train/checkpoint_folder.hpp>

#include "pp_suite.hpp"

namespace reshard_suite {

using namespace tessera;
namespace fs = std::filesystem;
using P = precision::fp64;
using parallel::schedule_kind;

/// Global batch (sequences per step), steps in all, the step A saves at, blocks.
constexpr std::int64_t G = 8, steps = 5, saved_at = 2, layers = 8;

/// pp_suite's model with 8 blocks and as many key/value heads as query heads (4),
/// its embeddings tied if `tied`.
inline nn::llama_config model(bool tied = false) {
  auto c = pp_suite::model(layers, tied);
  c.n_kv_heads = c.n_heads;
  return c;
}

/// One mesh of the matrix: a layout (pp_suite::layout) and a ZeRO stage.
struct mesh_run {
  pp_suite::layout l;
  int zero = 0;
  int ranks() const { return l.dp * l.tp * l.pp; }
  std::string name() const { return l.name() + " zero<" + std::to_string(zero) + ">"; }
};

inline mesh_run mesh(int dp, int tp, int pp, int zero, schedule_kind s = schedule_kind::one_f_one_b,
                     int V = 1, bool sp = false, bool tied = false) {
  mesh_run m;
  m.l.dp = dp;
  m.l.tp = tp;
  m.l.pp = pp;
  m.l.schedule = s;
  m.l.virtual_stages = V;
  m.l.micro_batches = G / dp;
  m.l.sequence_parallel = sp;
  m.l.layers = layers;
  m.l.tied = tied;
  m.zero = zero;
  return m;
}

/// The pairs (A saves, B loads) of the file comment.
inline std::vector<std::pair<mesh_run, mesh_run>> matrix() {
  const mesh_run one = mesh(1, 1, 1, 0), dp2 = mesh(2, 1, 1, 3), dp4 = mesh(4, 1, 1, 2),
                 tp2 = mesh(1, 2, 1, 0, schedule_kind::one_f_one_b, 1, true),
                 pp2 = mesh(1, 1, 2, 0), pp4 = mesh(1, 1, 4, 0, schedule_kind::interleaved, 2),
                 cube = mesh(2, 2, 2, 1);
  std::vector<std::pair<mesh_run, mesh_run>> p;
  const mesh_run first[] = {one, dp2, dp4, tp2};
  for (const auto& a : first)
    for (const auto& b : first)
      if (&a != &b) p.emplace_back(a, b);
  const std::pair<mesh_run, mesh_run> others[] = {
      {pp2, one},
      {one, pp2},
      {pp2, tp2},
      {dp2, pp2},
      {pp4, pp2},
      {pp2, pp4},
      {pp4, dp4},
      {cube, pp4},
      {pp4, cube},
      {cube, one},
      {dp4, cube},
      // ZeRO-3 through a pipeline, to and from others
      {mesh(2, 1, 2, 3, schedule_kind::zero_bubble_h1),
       mesh(2, 2, 2, 3, schedule_kind::interleaved, 2)},
      {mesh(2, 2, 2, 3, schedule_kind::interleaved, 2), dp2},
      {dp4, mesh(2, 1, 2, 3, schedule_kind::gpipe)}};
  for (const auto& [a, b] : others) p.emplace_back(a, b);
  p.emplace_back(cube, mesh(1, 2, 2, 1));
  p.emplace_back(cube, mesh(4, 2, 2, 2, schedule_kind::zero_bubble_h1));
  p.emplace_back(cube, mesh(2, 1, 2, 0, schedule_kind::gpipe));
  p.emplace_back(cube, mesh(2, 4, 2, 1, schedule_kind::one_f_one_b, 1, true));
  p.emplace_back(cube, mesh(2, 2, 1, 3));
  p.emplace_back(cube, mesh(2, 2, 4, 2));
  return p;
}

/// Pairs for check_resave under bf16_mixed: its master weights resharded
/// by ZeRO-3 to tp, by a 3-D mesh to an interleaved pipeline, by a
/// pipeline to ZeRO-2.
inline std::vector<std::pair<mesh_run, mesh_run>> master_pairs() {
  return {{mesh(2, 1, 1, 3), mesh(1, 2, 1, 0, schedule_kind::one_f_one_b, 1, true)},
          {mesh(2, 2, 2, 1), mesh(1, 1, 4, 0, schedule_kind::interleaved, 2)},
          {mesh(1, 1, 2, 0), mesh(4, 1, 1, 2)}};
}

/// The uninterrupted single-rank run of `model(tied)` (tp_suite's record).
inline pp_suite::reference single_rank(const data::token_file& f, bool tied = false) {
  pp_suite::layout one;
  one.micro_batches = G;
  one.layers = layers;
  train::trainer<P> tr(model(tied), pp_suite::config(one, steps), f);
  return tp_suite::record_run(tr, steps);
}

/// What B's world rank 0 saw: its losses and gradient norms per step.
struct continued {
  std::vector<double> loss, norm;
};

/// On every rank of `world` (m.ranks() ranks): a trainer of mesh `m`;
/// loads `from` and saves it at once to `resaved` (each if not empty);
/// trains until step `until`; saves to `to` (if not empty).
template <class Prec, class S, class Comm>
continued run_mesh(Comm& world, const mesh_run& m, const data::token_file& f, const fs::path& from,
                   const fs::path& resaved, std::int64_t until, const fs::path& to) {
  using layers_t = nn::tensor_parallel_layers<Comm>;
  continued out;
  auto g = comm::make_groups(world, comm::device_mesh(m.l.dp, m.l.tp, m.l.pp));
  train::trainer<Prec, host, optim::adamw, S, Comm, layers_t> tr(
      model(m.l.tied), pp_suite::config(m.l, steps), f,
      parallel::layout{g.dp, layers_t{&g.tp}, g.pp});
  if (!from.empty()) tr.load_checkpoint(from);
  if (!resaved.empty()) tr.save_checkpoint(resaved);
  while (tr.step() < until) {
    const auto s = tr.train_step();
    if (world.rank() == 0) {
      out.loss.push_back(s.loss);
      out.norm.push_back(s.grad_norm);
    }
  }
  if (!to.empty()) tr.save_checkpoint(to);
  return out;
}

template <class Prec, class Comm>
continued run_any(Comm& world, const mesh_run& m, const data::token_file& f, const fs::path& from,
                  const fs::path& resaved, std::int64_t until, const fs::path& to) {
  switch (m.zero) {
    case 0:
      return run_mesh<Prec, parallel::zero<0>>(world, m, f, from, resaved, until, to);
    case 1:
      return run_mesh<Prec, parallel::zero<1>>(world, m, f, from, resaved, until, to);
    case 2:
      return run_mesh<Prec, parallel::zero<2>>(world, m, f, from, resaved, until, to);
    default:
      return run_mesh<Prec, parallel::zero<3>>(world, m, f, from, resaved, until, to);
  }
}

/// run_any on m.ranks() thread ranks of their own (local_world); world
/// rank 0's losses and norms.
template <class Prec>
continued run_on_threads(const mesh_run& m, const data::token_file& f, const fs::path& from,
                         const fs::path& resaved, std::int64_t until, const fs::path& to) {
  continued out;
  comm::comm_options o;
  o.timeout = std::chrono::seconds(150);
  comm::local_world::run(
      m.ranks(),
      [&](comm::local_communicator& world) {
        continued c = run_any<Prec>(world, m, f, from, resaved, until, to);
        if (world.rank() == 0) out = std::move(c);
      },
      o);
  return out;
}

/// Where folders `a` and `b` differ: a tensor, role, shape or element
/// type in one and not the other, the first element whose bytes differ,
/// or a run-state key (other than the layout's own) of another value.
/// Empty when they hold the same state bit for bit.
inline std::string state_difference(const fs::path& a, const fs::path& b) {
  train::checkpoint_reader ra(a), rb(b);
  const auto& ia = ra.index();
  const auto& ib = rb.index();
  for (const auto& [name, t] : ia.tensors) {
    const auto u = ib.tensors.find(name);
    if (u == ib.tensors.end()) return name + " is missing";
    if (u->second.shape != t.shape) return name + " has another shape";
    if (u->second.roles != t.roles) return name + " has other roles or element types";
    const train::index_box box{std::vector<std::int64_t>(t.shape.size(), 0), t.shape};
    for (const auto& [role, dtype] : t.roles) {
      (void)dtype;
      const std::size_t esize = ia.element_bytes(name, role);
      std::vector<unsigned char> x(static_cast<std::size_t>(box.numel()) * esize), y(x.size());
      ra.read(name, role, box, 0, box.numel(), x.data());
      rb.read(name, role, box, 0, box.numel(), y.data());
      for (std::size_t j = 0; j < x.size(); j += esize)
        if (std::memcmp(x.data() + j, y.data() + j, esize) != 0)
          return name + " " + role + " differs at element " + std::to_string(j / esize);
    }
  }
  if (ib.tensors.size() != ia.tensors.size()) return "the tensor counts differ";
  for (const auto& [k, v] : ia.run.items())
    if (!train::layout_key(k) && (!ib.run.contains(k) || ib.run[k] != v))
      return "run state '" + k + "' differs: " + v.dump() + " against " +
             (ib.run.contains(k) ? ib.run[k].dump() : std::string("none"));
  return {};
}

inline bool close(double a, double b, double tol) {
  return std::fabs(a - b) <= tol * std::max(1.0, std::fabs(b));
}

/// A saves in `root`/a at step saved_at; B loads it, at once saves it again
/// in `root`/a_again, trains until `until` and saves in `root`/b (the ranks
/// beyond each mesh wait). Collective over `world`; returns B's losses and
/// norms on world rank 0, and there also where the two saves of the same
/// state differ (state_difference; empty when bit for bit equal).
template <class Prec, class Comm>
std::pair<continued, std::string> save_load_save(Comm& world, const mesh_run& a, const mesh_run& b,
                                                 const data::token_file& f, const fs::path& root,
                                                 std::int64_t until) {
  const int r = world.rank();
  continued c;
  {
    auto sub = world.split(r < a.ranks() ? 0 : 1, r);
    if (r < a.ranks()) (void)run_any<Prec>(sub, a, f, {}, {}, saved_at, root / "a");
  }
  world.barrier();
  {
    auto sub = world.split(r < b.ranks() ? 0 : 1, r);
    if (r < b.ranks())
      c = run_any<Prec>(sub, b, f, root / "a", root / "a_again", until, root / "b");
  }
  world.barrier();
  std::string diff;
  if (r == 0) {
    diff = state_difference(root / "a", root / "a_again");
    if (!diff.empty()) diff = "loaded and saved again: " + diff;
  }
  return {std::move(c), std::move(diff)};
}

/// A fresh folder for a pair, named by world rank 0's process id (the ranks
/// share one node's temporary folder). Collective.
template <class Comm>
fs::path pair_folder(Comm& world) {
  std::int64_t id = world.rank() == 0 ? static_cast<std::int64_t>(::getpid()) : 0;
  world.all_reduce(&id, 1, comm::reduce_op::sum);
  const fs::path root = fs::temp_directory_path() / ("tessera_reshard_" + std::to_string(id));
  if (world.rank() == 0) fs::remove_all(root);
  world.barrier();
  return root;
}

/// Throws zero_suite::suite_failure on every rank of `world` when world
/// rank 0's `failure` is not empty, with its text (broadcast as int32).
template <class Comm>
void agree_failure(Comm& world, const mesh_run& a, const mesh_run& b, const std::string& failure) {
  std::int64_t n = static_cast<std::int64_t>(failure.size());
  world.broadcast(&n, 1, 0);
  std::vector<std::int32_t> text(failure.begin(), failure.end());
  text.resize(static_cast<std::size_t>(n));
  if (n > 0) world.broadcast(text.data(), text.size(), 0);
  zero_suite::check(n == 0, "saved at ", a.name(), ", loaded at ", b.name(), ": ",
                    std::string(text.begin(), text.end()));
}

/// The pair (a, b) on `world` (max(a.ranks(), b.ranks()) ranks; each rank
/// reads the same corpus from `f`), checked against `ref` (single_rank) as
/// the file comment says. Collective. Throws zero_suite::suite_failure on
/// every rank, naming the first difference world rank 0 found.
template <class Comm>
void check_pair(Comm& world, const mesh_run& a, const mesh_run& b, const data::token_file& f,
                const pp_suite::reference& ref) {
  zero_suite::check(world.size() == std::max(a.ranks(), b.ranks()), "the pair needs ",
                    std::max(a.ranks(), b.ranks()), " ranks, the world has ", world.size());
  const fs::path root = pair_folder(world);
  auto [c, failure] = save_load_save<P>(world, a, b, f, root, steps);
  if (world.rank() == 0) {
    if (failure.empty() && c.loss.size() != static_cast<std::size_t>(steps - saved_at))
      failure = std::to_string(c.loss.size()) + " steps continued";
    for (std::size_t s = 0; failure.empty() && s < c.loss.size(); ++s) {
      const std::size_t at = static_cast<std::size_t>(saved_at) + s;
      if (!close(c.loss[s], ref.loss[at], 1e-10) || !close(c.norm[s], ref.norm[at], 1e-10))
        failure = tessera::detail::str("step ", at + 1, ": loss ", c.loss[s], " norm ", c.norm[s],
                                       ", one rank's ", ref.loss[at], " ", ref.norm[at]);
    }
    // The parameters B saved after the last step, tensor by tensor.
    train::checkpoint_reader rd(root / "b");
    for (const auto& e : ref.layout.entries()) {
      if (!failure.empty()) break;
      const train::index_box box{
          std::vector<std::int64_t>(static_cast<std::size_t>(e.full.rank), 0),
          std::vector<std::int64_t>(e.full.dims.begin(), e.full.dims.begin() + e.full.rank)};
      std::vector<double> got(static_cast<std::size_t>(box.numel()));
      rd.read(e.name, "param", box, 0, box.numel(), got.data());
      double worst = 0, scale = 0;
      for (std::size_t j = 0; j < got.size(); ++j) {
        const double want = ref.params[static_cast<std::size_t>(e.offset) + j];
        worst = std::max(worst, std::fabs(got[j] - want));
        scale = std::max(scale, std::fabs(want));
      }
      if (worst > 1e-10 * std::max(1.0, scale))
        failure = tessera::detail::str("after step ", steps, ": ", e.name, " differs by ", worst,
                                       " of ", scale);
    }
    fs::remove_all(root);
  }
  agree_failure(world, a, b, failure);
}

/// Under precision `Prec` with master weights (bf16_mixed: bf16 parameters,
/// float32 master weights and moments), the pair (a, b) on `world`: the
/// state B loads, saved again at once, equals A's save bit for bit, every
/// role (param, master, exp_avg, exp_avg_sq) included, and B trains a step
/// on. (Its continuation is not held to one rank's: bf16 rounds by layout.)
template <class Prec, class Comm>
void check_resave(Comm& world, const mesh_run& a, const mesh_run& b, const data::token_file& f) {
  const fs::path root = pair_folder(world);
  auto [c, failure] = save_load_save<Prec>(world, a, b, f, root, saved_at + 1);
  if (world.rank() == 0) {
    if (failure.empty()) {
      train::checkpoint_reader rd(root / "a");
      const auto& roles = rd.index().tensors.begin()->second.roles;
      if (roles.count("master") == 0) failure = "no master role saved: not a test of it";
    }
    if (failure.empty() && (c.loss.size() != 1 || !std::isfinite(c.loss[0])))
      failure = "the step after loading did not run or is not finite";
    fs::remove_all(root);
  }
  agree_failure(world, a, b, failure);
}

}  // namespace reshard_suite
