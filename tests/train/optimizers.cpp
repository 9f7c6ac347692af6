// The optimizer policies beyond AdamW and SGD through the trainer
// (include/tessera/optim/lion.hpp): on a dp x tp x pp mesh of thread ranks
// each computes the single-rank trajectory (tests/train/pp_suite.hpp: the
// loss, the gradient norm and every gradient of every step, the parameters
// after the last, float64 1e-10 relative); a run resumed from a checkpoint
// (folder and single file) continues bit for bit; a run trains (the loss
// falls); the planner counts the optimizer's state as it is allocated.
#include <catch2/catch.hpp>

#include <omp.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <tessera/comm/device_mesh.hpp>
#include <tessera/comm/local.hpp>
#include <tessera/nn/tensor_parallel.hpp>
#include <tessera/plan/state.hpp>

#include "pp_suite.hpp"
#include "trainer_suite.hpp"

namespace test_train_optimizers {

using namespace tessera;
using comm::local_communicator;
using comm::local_world;
using parallel::schedule_kind;
namespace fs = std::filesystem;

namespace {

comm::comm_options test_options(int seconds = 120) {
  comm::comm_options o;
  o.timeout = std::chrono::seconds(seconds);
  return o;
}

pp_suite::layout mesh(int dp, int tp, int pp, schedule_kind s = schedule_kind::one_f_one_b) {
  pp_suite::layout l;
  l.dp = dp;
  l.tp = tp;
  l.pp = pp;
  l.schedule = s;
  l.micro_batches = 4;
  return l;
}

// The mesh `l` under sharding S and optimizer O against one rank's run of
// O (pp_suite: five steps, float64).
template <class O, class S>
void check_mesh(const pp_suite::layout& l, double tol) {
  using P = precision::fp64;
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("optimizers", 0)};
  data::token_file f(corpus.path);
  const pp_suite::reference ref =
      pp_suite::single_rank<P, O>(f, 5, l.micro_batches * l.dp, l.layers);
  INFO(O::name << " " << l.name() << " " << S::name);
  REQUIRE_NOTHROW(local_world::run(
      l.dp * l.tp * l.pp,
      [&](local_communicator& world) {
        omp_set_num_threads(1);
        pp_suite::check_mesh<P, S, O>(world, ref, f, l, tol);
      },
      test_options()));
}

// A small run's settings (trainer_suite's tiny model and corpus).
train::train_config small_config(std::int64_t steps) {
  train::train_config c = trainer_suite::config(1);
  c.steps = steps;
  c.global_batch = 4;
  c.micro_batch = 2;
  c.eval_windows = 8;
  return c;
}

}  // namespace

// Lion is element-wise, so every layout that gives the single-rank
// gradients gives its update: the sign of c = beta1 m + (1 - beta1) g
// can differ only where c is within rounding of 0, which none of these
// elements reaches (a flip would move an element by 2 lr = 6e-3, far
// outside the tolerance).
TEST_CASE("lion: dp 2 under zero<0..3> equals one rank's trajectory (float64)",
          "[train][optim][lion]") {
  check_mesh<optim::lion, parallel::zero<0>>(mesh(2, 1, 1), 1e-10);
  check_mesh<optim::lion, parallel::zero<1>>(mesh(2, 1, 1), 1e-10);
  check_mesh<optim::lion, parallel::zero<2>>(mesh(2, 1, 1), 1e-10);
  check_mesh<optim::lion, parallel::zero<3>>(mesh(2, 1, 1), 1e-10);
}

TEST_CASE("lion: pp 2, tp 2 and dp x tp x pp equal one rank's trajectory (float64)",
          "[train][optim][lion][pp][tp]") {
  check_mesh<optim::lion, parallel::zero<0>>(mesh(1, 1, 2), 1e-10);
  check_mesh<optim::lion, parallel::zero<0>>(mesh(1, 1, 2, schedule_kind::zero_bubble_h1), 1e-10);
  check_mesh<optim::lion, parallel::zero<0>>(mesh(1, 2, 1), 1e-10);
  check_mesh<optim::lion, parallel::zero<1>>(mesh(2, 2, 2), 1e-10);
}

TEST_CASE("lion: a run resumed from a checkpoint continues bit for bit", "[train][optim][lion]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("lion_resume", 0)};
  data::token_file f(corpus.path);
  train::train_config c = small_config(6);
  c.lr = 1e-3;
  c.lion = {0.9, 0.99, 0.5};
  const fs::path dir =
      fs::temp_directory_path() / ("tessera_lion_resume_" + std::to_string(::getpid()));
  const fs::path bin = dir.string() + ".bin";
  struct cleanup {
    fs::path a, b;
    ~cleanup() {
      std::error_code ec;
      fs::remove_all(a, ec);
      fs::remove(b, ec);
    }
  } clean{dir, bin};
  using P = precision::bf16_mixed;  // master weights and the momentum both checkpointed
  std::vector<double> full;
  {
    train::trainer<P, host, optim::lion> t(trainer_suite::model(), c, f);
    for (int s = 0; s < 6; ++s) {
      full.push_back(t.train_step().loss);
      if (s == 2) {
        t.save_checkpoint(dir);
        t.save_checkpoint(bin);
      }
    }
    CHECK(t.metadata()["optimizer"] == "lion");
    CHECK(t.metadata()["lion"]["weight_decay"] == 0.5);
  }
  for (const fs::path& from : {dir, bin}) {
    INFO("resumed from " << from);
    train::trainer<P, host, optim::lion> r(trainer_suite::model(), c, f);
    r.load_checkpoint(from);
    REQUIRE(r.step() == 3);
    CHECK(r.optimizer().steps_taken() == 3);
    for (int s = 3; s < 6; ++s) CHECK(r.train_step().loss == full[static_cast<std::size_t>(s)]);
  }
  // The folder names the momentum as lion-pytorch does.
  {
    train::checkpoint_reader rd(dir);
    const auto& t = rd.index().tensors.at("blocks.0.attn.wq");
    CHECK(t.roles.count("exp_avg") == 1);
    CHECK(t.roles.count("master") == 1);
    CHECK(t.roles.size() == 3);
  }
  // Another optimizer's checkpoint is refused naming both.
  train::trainer<P> adamw_run(trainer_suite::model(), c, f);
  CHECK_THROWS_WITH(adamw_run.load_checkpoint(dir), Catch::Contains("optimizer") &&
                                                        Catch::Contains("lion") &&
                                                        Catch::Contains("adamw"));
}

TEST_CASE("lion: a small run trains, its loss falling as AdamW's does", "[train][optim][lion]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("lion_trains", 0)};
  data::token_file f(corpus.path);
  train::train_config c = small_config(30);
  c.lr = 3e-3;
  c.lion = {0.9, 0.99, 0.1};
  train::trainer<precision::fp32, host, optim::lion> t(trainer_suite::model(), c, f);
  const double before = t.evaluate();
  double first = 0, last = 0;
  while (t.step() < c.steps) {
    const auto m = t.train_step();
    if (m.step == 1) first = m.loss;
    last = m.loss;
  }
  UNSCOPED_INFO("lion: loss " << first << " -> " << last << ", validation " << before << " -> "
                              << t.evaluate());
  // From ~ln(256) = 5.5 nats: the repeated-words corpus is easy.
  CHECK(last < first - 1.0);
  CHECK(t.evaluate() < before - 1.0);
  CHECK(t.optimizer().steps_taken() == c.steps);
}

TEST_CASE("lion: the planner counts the state the optimizer allocates", "[train][optim][lion]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("lion_plan", 0)};
  data::token_file f(corpus.path);
  const auto mc = trainer_suite::model();
  using P = precision::bf16_mixed;
  const auto d = plan::dtype_sizes::of<P>();
  // One rank: the whole flat buffer, 4 bytes of momentum and 4 of master
  // weights a parameter (bf16 weights: 2 + 4 + 4 + 4 with the gradient).
  {
    train::trainer<P, host, optim::lion> t(mc, small_config(1), f);
    const auto st = plan::plan_state(mc, d, plan::optimizer_spec::lion(), {});
    CHECK(st.optimizer == static_cast<std::uint64_t>(t.model().flat_size()) * 4);
    CHECK(st.master + st.optimizer + st.segment_table == t.optimizer().state_bytes());
  }
  // dp 2 under zero<1>: each rank's shard.
  REQUIRE_NOTHROW(local_world::run(
      2,
      [&](local_communicator& w) {
        omp_set_num_threads(1);
        train::train_config c = small_config(1);
        c.dp = 2;
        c.micro_batch = 1;
        train::trainer<P, host, optim::lion, parallel::zero<1>, local_communicator> t(
            mc, c, f, parallel::layout{w});
        plan::sharding sh;
        sh.zero = 1;
        sh.dp = 2;
        sh.rank = w.rank();
        const auto st = plan::plan_state(mc, d, plan::optimizer_spec::lion(), sh);
        zero_suite::check(
            st.master + st.optimizer + st.segment_table == t.optimizer().state_bytes(), "rank ",
            w.rank(), ": planned ", st.master + st.optimizer, " + segments, allocated ",
            t.optimizer().state_bytes());
      },
      test_options()));
  CHECK(plan::optimizer_spec::from_name("lion").moments == 1);
}

}  // namespace test_train_optimizers
