// optim::muon through the trainer (include/tessera/optim/muon.hpp): on a
// dp x tp x pp mesh of thread ranks each computes the single-rank
// trajectory (tests/train/pp_suite.hpp: the loss, the gradient norm and
// every gradient of every step, the parameters after the last, float64
// 1e-10 relative): dp under ZeRO 0-3 (the chunks' pieces of each matrix
// gathered whole), tp (each split matrix gathered over the tp group), pp;
// a run resumed from a checkpoint (folder and single file) continues bit
// for bit, and at another layout (tp 1 -> 2, zero<1> dp 2 -> one rank)
// continues the trajectory; a run trains; the planner counts the state as
// it is allocated.
#include <catch2/catch.hpp>

#include <omp.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include <tessera/comm/device_mesh.hpp>
#include <tessera/comm/local.hpp>
#include <tessera/nn/tensor_parallel.hpp>
#include <tessera/optim/muon.hpp>
#include <tessera/plan/state.hpp>

#include "pp_suite.hpp"
#include "trainer_suite.hpp"

namespace test_train_muon {

using namespace tessera;
using comm::local_communicator;
using comm::local_world;
using parallel::schedule_kind;
namespace fs = std::filesystem;

namespace {

using pp_suite::mesh;
using pp_suite::test_options;

// The mesh `l` under sharding S against one rank's Muon run (pp_suite:
// five steps, float64).
template <class S>
void check_mesh(const pp_suite::layout& l, double tol) {
  using P = precision::fp64;
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("muon_mesh", 0)};
  data::token_file f(corpus.path);
  const pp_suite::reference ref =
      pp_suite::single_rank<P, optim::muon>(f, 5, l.micro_batches * l.dp, l.layers, l.tied);
  INFO("muon " << l.name() << " " << S::name);
  REQUIRE_NOTHROW(local_world::run(
      l.dp * l.tp * l.pp,
      [&](local_communicator& world) {
        omp_set_num_threads(1);
        pp_suite::check_mesh<P, S, optim::muon>(world, ref, f, l, tol);
      },
      test_options()));
}

train::train_config small_config(std::int64_t steps) {
  train::train_config c = trainer_suite::config(1);
  c.steps = steps;
  c.global_batch = 4;
  c.micro_batch = 2;
  c.eval_windows = 8;
  return c;
}

}  // namespace

// Each matrix is orthogonalised whole on every layout: under tp its
// momentum shards are gathered over the tp group in rank order and every
// rank runs the same iteration on the same whole matrix (the same BLAS
// calls on the same operands), keeping its rows or columns of the result;
// so only the gradients' rounding differs from one rank's.
TEST_CASE("muon: dp 2 (zero<0>), tp 2, pp 2 and dp x tp x pp equal one rank's trajectory (float64)",
          "[train][optim][muon][pp][tp]") {
  check_mesh<parallel::zero<0>>(mesh(2, 1, 1), 1e-10);
  check_mesh<parallel::zero<0>>(mesh(1, 2, 1), 1e-10);
  check_mesh<parallel::zero<0>>(mesh(1, 1, 2), 1e-10);
  check_mesh<parallel::zero<0>>(mesh(1, 1, 2, schedule_kind::zero_bubble_h1), 1e-10);
  check_mesh<parallel::zero<0>>(mesh(2, 2, 2), 1e-10);
  // tp 4 over nkv 2: two ranks hold each key/value head (the gathered
  // shards are read from each head's first replica).
  check_mesh<parallel::zero<0>>(mesh(1, 4, 1), 1e-10);
  // ZeRO stages at one dp rank (chunks hold whole tensors).
  check_mesh<parallel::zero<1>>(mesh(1, 1, 2), 1e-10);
  check_mesh<parallel::zero<3>>(mesh(1, 2, 1), 1e-10);
}

TEST_CASE("muon with tied embeddings under a pipeline equals one rank (float64)",
          "[train][optim][muon][tied][pp]") {
  pp_suite::layout l = mesh(1, 1, 2);
  l.tied = true;
  check_mesh<parallel::zero<0>>(l, 1e-10);
}

// Under ZeRO over dp 2 the chunks cut matrices between the ranks: each
// bucket's pieces of what is orthogonalised are all-gathered whole, and
// every rank owning a piece runs the iteration on the whole matrix; small
// buckets put several boundaries inside matrices.
TEST_CASE("muon: dp 2 under zero<1..3> equals one rank's trajectory (float64)",
          "[train][optim][muon][zero]") {
  check_mesh<parallel::zero<1>>(mesh(2, 1, 1), 1e-10);
  check_mesh<parallel::zero<2>>(mesh(2, 1, 1), 1e-10);
  check_mesh<parallel::zero<3>>(mesh(2, 1, 1), 1e-10);
  check_mesh<parallel::zero<1>>(mesh(2, 1, 2), 1e-10);
  check_mesh<parallel::zero<1>>(mesh(2, 2, 1), 1e-10);
  check_mesh<parallel::zero<1>>(mesh(2, 2, 2), 1e-10);
}

// Buckets of 2 kB put a chunk boundary inside every block's bucket, so
// the stages split matrices between the ranks (checked), whose pieces are
// then gathered whole: the trajectory is one rank's (float64).
template <class S>
void split_matrices_case() {
  using P = precision::fp64;
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("muon_split", 0)};
  data::token_file f(corpus.path);
  train::train_config c = small_config(4);
  c.lr = 2e-2;
  std::vector<double> one_loss;
  std::vector<double> one_params;
  {
    train::trainer<P, host, optim::muon> t(trainer_suite::model(), c, f);
    for (int s = 0; s < 4; ++s) one_loss.push_back(t.train_step().loss);
    one_params.assign(t.model().params(), t.model().params() + t.model().flat_size());
  }
  std::string failures[2];
  int pieces[2] = {0, 0};
  REQUIRE_NOTHROW(local_world::run(
      2,
      [&](local_communicator& w) {
        omp_set_num_threads(1);
        train::train_config c2 = c;
        c2.dp = 2;
        c2.micro_batch = 1;
        parallel::data_parallel_options dpo;
        dpo.bucket_bytes = 2000;
        train::trainer<P, host, optim::muon, S, local_communicator> t(trainer_suite::model(), c2, f,
                                                                      parallel::layout{w}, dpo);
        for (const auto& m : t.optimizer().matrices()) pieces[w.rank()] += m.owned() < m.local();
        std::ostringstream o;
        for (int s = 0; s < 4; ++s) {
          const double l = t.train_step().loss;
          if (!(std::abs(l - one_loss[static_cast<std::size_t>(s)]) <= 1e-10 * l))
            o << "step " << s << ": loss " << l << " vs " << one_loss[static_cast<std::size_t>(s)]
              << "; ";
        }
        std::vector<double> full(static_cast<std::size_t>(t.model().flat_size()));
        t.engine(0).full_params(full.data());
        double worst = 0;
        for (std::size_t i = 0; i < full.size(); ++i)
          worst = std::max(worst, std::abs(full[i] - one_params[i]));
        if (!(worst <= 1e-10)) o << "parameters differ by " << worst;
        failures[w.rank()] = o.str();
      },
      test_options()));
  for (int r = 0; r < 2; ++r) {
    INFO(S::name << " rank " << r);
    CHECK(pieces[r] > 0);
    CHECK(failures[r].empty());
  }
}

TEST_CASE("muon: ZeRO 1-3 over dp 2 with matrices split between the ranks equal one rank",
          "[train][optim][muon][zero]") {
  split_matrices_case<parallel::zero<1>>();
  split_matrices_case<parallel::zero<2>>();
  split_matrices_case<parallel::zero<3>>();
}

TEST_CASE("muon: a checkpoint written under zero<1> on dp 2 resumes on one rank",
          "[train][optim][muon][zero]") {
  using P = precision::fp64;
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("muon_zero_ckpt", 0)};
  data::token_file f(corpus.path);
  train::train_config c = small_config(5);
  c.lr = 2e-2;
  const fs::path dir =
      fs::temp_directory_path() / ("tessera_muon_zero_" + std::to_string(::getpid()));
  struct cleanup {
    fs::path a;
    ~cleanup() {
      std::error_code ec;
      fs::remove_all(a, ec);
    }
  } clean{dir};
  double full[2][5] = {};
  REQUIRE_NOTHROW(local_world::run(
      2,
      [&](local_communicator& w) {
        omp_set_num_threads(1);
        train::train_config c2 = c;
        c2.dp = 2;
        c2.micro_batch = 1;
        train::trainer<P, host, optim::muon, parallel::zero<1>, local_communicator> t(
            trainer_suite::model(), c2, f, parallel::layout{w});
        for (int s = 0; s < 5; ++s) {
          full[w.rank()][s] = t.train_step().loss;
          if (s == 1) t.save_checkpoint(dir);
        }
      },
      test_options()));
  CHECK(full[0][4] == full[1][4]);
  train::trainer<P, host, optim::muon> one(trainer_suite::model(), c, f);
  one.load_checkpoint(dir);
  REQUIRE(one.step() == 2);
  for (int s = 2; s < 5; ++s) {
    INFO("step " << s);
    CHECK(std::abs(one.train_step().loss - full[0][s]) <= 1e-10 * full[0][s]);
  }
}

TEST_CASE("muon: a run resumed from a checkpoint continues bit for bit", "[train][optim][muon]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("muon_resume", 0)};
  data::token_file f(corpus.path);
  train::train_config c = small_config(6);
  c.lr = 2e-2;
  c.muon.adamw_lr_ratio = 0.25;
  const fs::path dir =
      fs::temp_directory_path() / ("tessera_muon_resume_" + std::to_string(::getpid()));
  const fs::path bin = dir.string() + ".bin";
  struct cleanup {
    fs::path a, b;
    ~cleanup() {
      std::error_code ec;
      fs::remove_all(a, ec);
      fs::remove(b, ec);
    }
  } clean{dir, bin};
  using P = precision::bf16_mixed;  // master weights, momentum and AdamW's moments checkpointed
  std::vector<double> full;
  {
    train::trainer<P, host, optim::muon> t(trainer_suite::model(), c, f);
    for (int s = 0; s < 6; ++s) {
      full.push_back(t.train_step().loss);
      if (s == 2) {
        t.save_checkpoint(dir);
        t.save_checkpoint(bin);
      }
    }
    CHECK(t.metadata()["optimizer"] == "muon");
    CHECK(t.metadata()["muon"]["adamw_lr_ratio"] == 0.25);
    CHECK(t.metadata()["muon"]["adjust_lr"] == "original");
  }
  for (const fs::path& from : {dir, bin}) {
    INFO("resumed from " << from);
    train::trainer<P, host, optim::muon> r(trainer_suite::model(), c, f);
    r.load_checkpoint(from);
    REQUIRE(r.step() == 3);
    CHECK(r.optimizer().steps_taken() == 3);
    for (int s = 3; s < 6; ++s) CHECK(r.train_step().loss == full[static_cast<std::size_t>(s)]);
  }
  // The folder: a block's matrix keeps torch.optim.Muon's momentum_buffer,
  // the embedding and the norm gains torch.optim.AdamW's two moments.
  {
    train::checkpoint_reader rd(dir);
    const auto& tensors = rd.index().tensors;
    const auto& wq = tensors.at("blocks.0.attn.wq").roles;
    CHECK(wq.count("momentum_buffer") == 1);
    CHECK(wq.count("master") == 1);
    CHECK(wq.count("exp_avg") == 0);
    for (const char* name : {"embedding", "blocks.0.attn_norm", "final_norm"}) {
      INFO(name);
      CHECK(tensors.at(name).roles.count("exp_avg") == 1);
      CHECK(tensors.at(name).roles.count("exp_avg_sq") == 1);
      CHECK(tensors.at(name).roles.count("momentum_buffer") == 0);
    }
  }
  // Other hyper-parameters are refused, naming the value.
  train::train_config other = c;
  other.muon.momentum = 0.9;
  train::trainer<P, host, optim::muon> u(trainer_suite::model(), other, f);
  CHECK_THROWS_WITH(u.load_checkpoint(dir), Catch::Contains("momentum"));
  // Another optimizer's checkpoint is refused naming both.
  train::trainer<P> adamw_run(trainer_suite::model(), c, f);
  CHECK_THROWS_WITH(adamw_run.load_checkpoint(dir),
                    Catch::Contains("muon") && Catch::Contains("adamw"));
}

// The momentum is stored by the boxes of the parameters (one element an
// element), so a checkpoint written on one rank resumes at tp 2 and
// continues one rank's trajectory (float64; the tp gradients' rounding).
TEST_CASE("muon: a checkpoint written at tp 1 resumes at tp 2", "[train][optim][muon][tp]") {
  using P = precision::fp64;
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("muon_retp", 0)};
  data::token_file f(corpus.path);
  train::train_config c = small_config(5);
  c.lr = 2e-2;
  const fs::path dir =
      fs::temp_directory_path() / ("tessera_muon_retp_" + std::to_string(::getpid()));
  struct cleanup {
    fs::path a;
    ~cleanup() {
      std::error_code ec;
      fs::remove_all(a, ec);
    }
  } clean{dir};
  std::vector<double> full;
  {
    train::trainer<P, host, optim::muon> t(trainer_suite::model(), c, f);
    for (int s = 0; s < 5; ++s) {
      full.push_back(t.train_step().loss);
      if (s == 1) t.save_checkpoint(dir);
    }
  }
  double resumed[2][5] = {};
  REQUIRE_NOTHROW(local_world::run(
      2,
      [&](local_communicator& world) {
        omp_set_num_threads(1);
        using layers = nn::tensor_parallel_layers<local_communicator>;
        auto g = comm::make_groups(world, comm::device_mesh(1, 2, 1));
        train::train_config c2 = c;
        c2.tp = 2;
        train::trainer<P, host, optim::muon, parallel::zero<0>, local_communicator, layers> t(
            trainer_suite::model(), c2, f, parallel::layout{g.dp, layers{&g.tp}, g.pp});
        t.load_checkpoint(dir);
        for (int s = 2; s < 5; ++s) resumed[world.rank()][s] = t.train_step().loss;
      },
      test_options()));
  for (int r = 0; r < 2; ++r)
    for (int s = 2; s < 5; ++s) {
      INFO("tp rank " << r << " step " << s);
      CHECK(std::abs(resumed[r][s] - full[static_cast<std::size_t>(s)]) <=
            1e-10 * full[static_cast<std::size_t>(s)]);
    }
}

TEST_CASE("muon: a small run trains", "[train][optim][muon]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("muon_trains", 0)};
  data::token_file f(corpus.path);
  train::train_config c = small_config(30);
  c.lr = 2e-2;
  c.muon.adamw_lr_ratio = 0.15;  // AdamW's 3e-3 for the embedding, head and norms
  train::trainer<precision::fp32, host, optim::muon> t(trainer_suite::model(), c, f);
  const double before = t.evaluate();
  double first = 0, last = 0;
  while (t.step() < c.steps) {
    const auto m = t.train_step();
    if (m.step == 1) first = m.loss;
    last = m.loss;
  }
  UNSCOPED_INFO("muon: loss " << first << " -> " << last << ", validation " << before << " -> "
                              << t.evaluate());
  // From ~ln(256) = 5.5 nats: the repeated-words corpus is easy.
  CHECK(last < first - 1.0);
  CHECK(t.evaluate() < before - 1.0);
  CHECK(t.optimizer().steps_taken() == c.steps);
}

TEST_CASE("muon: the planner counts the state and scratch the optimizer allocates",
          "[train][optim][muon]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("muon_plan", 0)};
  data::token_file f(corpus.path);
  const auto mc = trainer_suite::model();
  using P = precision::bf16_mixed;
  const auto d = plan::dtype_sizes::of<P>();
  {
    train::trainer<P, host, optim::muon> t(mc, small_config(1), f);
    const auto st = plan::plan_state(mc, d, plan::optimizer_spec::muon(), {});
    CHECK(st.master + st.optimizer + st.segment_table == t.optimizer().state_bytes());
    // One buffer a parameter plus AdamW's second moment of the rest: below AdamW's two.
    const auto adamw = plan::plan_state(mc, d, plan::optimizer_spec::adamw(), {});
    CHECK(st.optimizer < adamw.optimizer);
  }
  // Under tp 2, each rank's shards, and the gathered shards in the scratch.
  REQUIRE_NOTHROW(local_world::run(
      2,
      [&](local_communicator& world) {
        omp_set_num_threads(1);
        using layers = nn::tensor_parallel_layers<local_communicator>;
        const comm::device_mesh dm(1, 2, 1);
        auto g = comm::make_groups(world, dm);
        train::train_config c = small_config(1);
        c.tp = 2;
        train::trainer<P, host, optim::muon, parallel::zero<0>, local_communicator, layers> t(
            mc, c, f, parallel::layout{g.dp, layers{&g.tp}, g.pp});
        plan::sharding sh;
        sh.tp = 2;
        sh.tp_rank = world.rank();
        const auto st = plan::plan_state(mc, d, plan::optimizer_spec::muon(), sh);
        zero_suite::check(
            st.master + st.optimizer + st.segment_table == t.optimizer().state_bytes(), "tp rank ",
            world.rank(), ": planned ", st.master + st.optimizer + st.segment_table, ", allocated ",
            t.optimizer().state_bytes());
      },
      test_options()));
  // dp 2 under zero<1>: each rank's pieces and the largest bucket holding a matrix.
  REQUIRE_NOTHROW(local_world::run(
      2,
      [&](local_communicator& w) {
        omp_set_num_threads(1);
        train::train_config c = small_config(1);
        c.dp = 2;
        c.micro_batch = 1;
        train::trainer<P, host, optim::muon, parallel::zero<1>, local_communicator> t(
            mc, c, f, parallel::layout{w});
        plan::sharding sh;
        sh.zero = 1;
        sh.dp = 2;
        sh.rank = w.rank();
        const auto st = plan::plan_state(mc, d, plan::optimizer_spec::muon(), sh);
        zero_suite::check(
            st.master + st.optimizer + st.segment_table == t.optimizer().state_bytes(), "rank ",
            w.rank(), ": planned ", st.master + st.optimizer + st.segment_table, ", allocated ",
            t.optimizer().state_bytes());
      },
      test_options()));
  CHECK(plan::optimizer_spec::from_name("muon").orthogonalised);
}

}  // namespace test_train_muon
