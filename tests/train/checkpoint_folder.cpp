// Checkpoint folders move between layouts (include/tessera/train/
// checkpoint_folder.hpp through trainer::save_checkpoint and
// load_checkpoint): a float64 run on thread ranks of one (dp, tp, pp,
// schedule, ZeRO stage) mesh trains two steps and saves; a run on another
// mesh loads the folder and trains three more. Its losses and gradient
// norms, and the parameters it then saves, equal the uninterrupted
// single-rank run's steps 3 to 5 within 1e-10 (the layouts' own tolerance
// against one rank, tests/train/pipeline.cpp). Then: a folder without its
// metadata is refused, and another global batch is refused naming both.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <tessera/comm/device_mesh.hpp>
#include <tessera/comm/local.hpp>
#include <tessera/nn/tensor_parallel.hpp>

#include "pp_suite.hpp"

namespace test_train_checkpoint_folder {

using namespace tessera;
namespace fs = std::filesystem;
using comm::local_communicator;
using P = precision::fp64;
using parallel::schedule_kind;

namespace {

constexpr std::int64_t G = 8, steps = 5, saved_at = 2, layers = 8;

struct temp_dir {
  fs::path path;
  explicit temp_dir(const std::string& name) {
    path = fs::temp_directory_path() /
           ("tessera_ckpt_folder_" + name + "_" + std::to_string(::getpid()));
    fs::remove_all(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

struct mesh_run {
  pp_suite::layout l;
  int zero = 0;
  std::string name() const { return l.name() + " zero<" + std::to_string(zero) + ">"; }
};
mesh_run mesh(int dp, int tp, int pp, int zero, schedule_kind s = schedule_kind::one_f_one_b,
              int V = 1, bool sp = false) {
  mesh_run m;
  m.l.dp = dp;
  m.l.tp = tp;
  m.l.pp = pp;
  m.l.schedule = s;
  m.l.virtual_stages = V;
  m.l.micro_batches = G / dp;
  m.l.sequence_parallel = sp;
  m.l.layers = layers;
  m.zero = zero;
  return m;
}

// What the loading run saw: its losses and norms per step (world rank 0).
struct continued {
  std::vector<double> loss, norm;
};

// On every rank of `m`: a trainer; loads `from` (if set); trains until
// `until`; saves to `to`.
template <class S>
continued run_mesh(const mesh_run& m, const data::token_file& f, const fs::path& from,
                   std::int64_t until, const fs::path& to) {
  continued out;
  comm::comm_options o;
  o.timeout = std::chrono::seconds(60);
  comm::local_world::run(
      m.l.dp * m.l.tp * m.l.pp,
      [&](local_communicator& world) {
        using layers_t = nn::tensor_parallel_layers<local_communicator>;
        auto g = comm::make_groups(world, comm::device_mesh(m.l.dp, m.l.tp, m.l.pp));
        train::train_config cfg = pp_suite::config(m.l, steps);
        train::trainer<P, host, optim::adamw, S, local_communicator, layers_t> tr(
            pp_suite::model(layers), cfg, f, parallel::layout{g.dp, layers_t{&g.tp}, g.pp});
        if (!from.empty()) tr.load_checkpoint(from);
        while (tr.step() < until) {
          const auto s = tr.train_step();
          if (world.rank() == 0) {
            out.loss.push_back(s.loss);
            out.norm.push_back(s.grad_norm);
          }
        }
        tr.save_checkpoint(to);
      },
      o);
  return out;
}
continued run_any(const mesh_run& m, const data::token_file& f, const fs::path& from,
                  std::int64_t until, const fs::path& to) {
  switch (m.zero) {
    case 0:
      return run_mesh<parallel::zero<0>>(m, f, from, until, to);
    case 1:
      return run_mesh<parallel::zero<1>>(m, f, from, until, to);
    case 2:
      return run_mesh<parallel::zero<2>>(m, f, from, until, to);
    default:
      return run_mesh<parallel::zero<3>>(m, f, from, until, to);
  }
}

bool close(double a, double b, double tol) {
  return std::fabs(a - b) <= tol * std::max(1.0, std::fabs(b));
}

}  // namespace

TEST_CASE("a checkpoint folder saved at one layout continues at another as one rank would",
          "[train][checkpoint]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("ckpt_folder", 0)};
  data::token_file f(corpus.path);
  const auto ref = pp_suite::single_rank<P>(f, steps, G, layers);
  const std::vector<std::pair<mesh_run, mesh_run>> pairs = {
      {mesh(2, 1, 1, 3), mesh(1, 2, 1, 0, schedule_kind::one_f_one_b, 1, true)},
      {mesh(1, 2, 1, 1), mesh(4, 1, 1, 2)},
      {mesh(1, 1, 2, 0), mesh(2, 2, 1, 1)},
      {mesh(2, 2, 2, 1), mesh(1, 1, 4, 0, schedule_kind::interleaved, 2)},
      {mesh(1, 1, 4, 0, schedule_kind::interleaved, 2), mesh(1, 1, 1, 0)},
      {mesh(2, 1, 2, 3, schedule_kind::zero_bubble_h1),
       mesh(2, 2, 2, 3, schedule_kind::interleaved, 2)},
  };
  for (const auto& [a, b] : pairs) {
    INFO("saved at " << a.name() << ", continued at " << b.name());
    temp_dir da("a"), db("b");
    (void)run_any(a, f, {}, saved_at, da.path);
    const continued c = run_any(b, f, da.path, steps, db.path);
    REQUIRE(c.loss.size() == static_cast<std::size_t>(steps - saved_at));
    for (std::size_t s = 0; s < c.loss.size(); ++s) {
      INFO("step " << saved_at + 1 + static_cast<std::int64_t>(s));
      CHECK(close(c.loss[s], ref.loss[saved_at + s], 1e-10));
      CHECK(close(c.norm[s], ref.norm[saved_at + s], 1e-10));
    }
    // The parameters B saved after step 5, tensor by tensor, against one rank's.
    train::checkpoint_reader rd(db.path);
    for (const auto& e : ref.layout.entries()) {
      train::index_box box{
          std::vector<std::int64_t>(static_cast<std::size_t>(e.full.rank), 0),
          std::vector<std::int64_t>(e.full.dims.begin(), e.full.dims.begin() + e.full.rank)};
      std::vector<double> got(static_cast<std::size_t>(box.numel()));
      rd.read(e.name, "param", box, 0, box.numel(), got.data());
      double worst = 0, scale = 0;
      for (std::size_t j = 0; j < got.size(); ++j) {
        worst =
            std::max(worst, std::fabs(got[j] - ref.params[static_cast<std::size_t>(e.offset) + j]));
        scale = std::max(scale, std::fabs(ref.params[static_cast<std::size_t>(e.offset) + j]));
      }
      CHECK(worst <= 1e-10 * std::max(1.0, scale));
    }
  }
}

TEST_CASE("a checkpoint folder without metadata, or of another global batch, is refused",
          "[train][checkpoint]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("ckpt_folder_refuse", 0)};
  data::token_file f(corpus.path);
  temp_dir d("refuse");
  train::train_config cfg = pp_suite::config(mesh(1, 1, 1, 0).l, steps);
  {
    train::trainer<P> tr(pp_suite::model(layers), cfg, f);
    (void)tr.train_step();
    tr.save_checkpoint(d.path);
  }
  cfg.global_batch = 2 * G;
  {
    train::trainer<P> tr(pp_suite::model(layers), cfg, f);
    CHECK_THROWS_WITH(tr.load_checkpoint(d.path),
                      Catch::Contains("global_batch=8 in the checkpoint, 16 in this run"));
  }
  fs::remove(d.path / "metadata.json");
  cfg.global_batch = G;
  train::trainer<P> tr(pp_suite::model(layers), cfg, f);
  CHECK_THROWS_WITH(tr.load_checkpoint(d.path), Catch::Contains("has no metadata.json"));
}

}  // namespace test_train_checkpoint_folder
