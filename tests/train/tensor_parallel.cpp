// The trainer on a dp x tp mesh of thread ranks (tp fastest, Megatron
// order) computes the single-rank run (tests/train/tp_suite.hpp): five
// AdamW steps with gradient accumulation, (dp, tp) = (1, 2), (1, 4), (2, 2)
// and (4, 2) on 8 ranks, with and without sequence parallelism, under
// ZeRO 0 to 3 — the loss, the gradient norm and every parameter's gradient
// before clipping of every step, and every parameter shard, at float64
// 1e-10 and float32 1e-5 relative; tp 4 over the tiny model's 2 key/value
// heads replicates each on 2 ranks; the norm gains (over 20 steps too) and
// the replicated heads stay bit-identical; the tp group's and
// the replica group's bytes equal the planner's formulas; a tp checkpoint
// resumes at its layout; a tp that does not match the group or split the
// heads, and a sequence-parallel T that tp does not divide, fail before
// any collective.
#include <array>
#include <catch2/catch.hpp>

#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <tessera/comm/device_mesh.hpp>
#include <tessera/comm/local.hpp>
#include <tessera/nn/tensor_parallel.hpp>
#include <tessera/plan/step.hpp>

#include "tp_suite.hpp"
#include "trainer_suite.hpp"

namespace test_train_tensor_parallel {

using namespace tessera;
using comm::local_communicator;
using comm::local_world;

namespace {

comm::comm_options test_options() {
  comm::comm_options o;
  o.timeout = std::chrono::seconds(60);
  return o;
}

using tp_layers = nn::tensor_parallel_layers<local_communicator>;

train::train_config tp_config(int dp, int tp, std::int64_t steps) {
  return tp_suite::config(dp, tp, steps, false);
}

template <class P, class S>
void check_mesh(int dp, int tp, double tol, bool sp = false, const nn::checkpoint_policy& ck = {},
                std::int64_t steps = 5) {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("tp", 0)};
  data::token_file f(corpus.path);
  const tp_suite::reference ref = tp_suite::single_rank<P>(f, steps, ck);
  INFO("dp " << dp << " tp " << tp << (sp ? " sequence-parallel " : " ") << S::name);
  REQUIRE_NOTHROW(local_world::run(
      dp * tp,
      [&](local_communicator& world) {
        omp_set_num_threads(1);
        tp_suite::check_mesh<P, S>(world, ref, f, dp, tp, sp, tol, ck);
      },
      test_options()));
}

}  // namespace

TEST_CASE("tp trainer: five AdamW steps equal one rank's (float64)", "[train][tp]") {
  check_mesh<precision::fp64, parallel::zero<0>>(1, 2, 1e-10);
  check_mesh<precision::fp64, parallel::zero<0>>(1, 4, 1e-10);  // key/value heads replicated
  check_mesh<precision::fp64, parallel::zero<0>>(2, 2, 1e-10);
  check_mesh<precision::fp64, parallel::zero<1>>(2, 2, 1e-10);
  check_mesh<precision::fp64, parallel::zero<1>>(4, 2, 1e-10);
  check_mesh<precision::fp64, parallel::zero<2>>(2, 2, 1e-10);
  check_mesh<precision::fp64, parallel::zero<3>>(2, 2, 1e-10);
}

TEST_CASE("tp trainer: sequence parallelism equals one rank's (float64)", "[train][tp][sp]") {
  check_mesh<precision::fp64, parallel::zero<0>>(1, 2, 1e-10, true);
  check_mesh<precision::fp64, parallel::zero<1>>(1, 4, 1e-10, true);
  check_mesh<precision::fp64, parallel::zero<0>>(2, 2, 1e-10, true);
  check_mesh<precision::fp64, parallel::zero<1>>(4, 2, 1e-10, true);
  check_mesh<precision::fp64, parallel::zero<3>>(2, 2, 1e-10, true);
}

TEST_CASE("tp trainer: activation checkpointing, its traffic as planned", "[train][tp]") {
  const nn::checkpoint_policy full{nn::activation_checkpointing::full, 1};
  check_mesh<precision::fp64, parallel::zero<1>>(1, 2, 1e-10, false, full);
  check_mesh<precision::fp64, parallel::zero<1>>(1, 2, 1e-10, true, full);
}

TEST_CASE("tp trainer: bf16_mixed follows one rank's run", "[train][tp]") {
  // 16-bit partial sums are rounded to bf16 on each rank before their
  // float all-reduce, where one rank rounds the whole sum once: the runs
  // agree to bf16's precision, not bit for bit.
  check_mesh<precision::bf16_mixed, parallel::zero<1>>(1, 2, 2e-2);
  check_mesh<precision::bf16_mixed, parallel::zero<1>>(1, 2, 2e-2, true);
}

TEST_CASE("tp trainer: five AdamW steps equal one rank's (float32)", "[train][tp]") {
  check_mesh<precision::fp32, parallel::zero<0>>(1, 2, 1e-5);
  check_mesh<precision::fp32, parallel::zero<1>>(2, 2, 1e-5);
  check_mesh<precision::fp32, parallel::zero<1>>(1, 4, 1e-5, true);
}

TEST_CASE("tp trainer: the norm gains stay bit-identical over tp ranks for 20 steps",
          "[train][tp][sp]") {
  // Sequence parallelism makes the gains' gradients partial over tp: each
  // rank sums the same all-reduced values, so the gains keep the same bits
  // (check_mesh compares them across all world ranks after the last step).
  check_mesh<precision::fp32, parallel::zero<1>>(2, 2, 1e-4, true, {}, 20);
  check_mesh<precision::fp64, parallel::zero<0>>(1, 4, 1e-10, true, {}, 20);
}

TEST_CASE("tp trainer: a tp that does not match or split fails before any collective",
          "[train][tp][errors]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("tp_err", 0)};
  data::token_file f(corpus.path);
  // Catch2's assertions are not thread-safe (TSan): each rank records what
  // its constructors threw and the main thread checks it.
  const auto what = [](auto&& make) -> std::string {
    try {
      make();
    } catch (const std::exception& e) {
      return e.what();
    }
    return "(nothing thrown)";
  };
  std::vector<std::array<std::string, 3>> msg(2);
  std::vector<std::uint64_t> tp_bytes(2, 1);
  REQUIRE_NOTHROW(local_world::run(
      2,
      [&](local_communicator& world) {
        const comm::device_mesh mesh(1, 2, 1);
        auto g = comm::make_groups(world, mesh);
        using T = train::trainer<precision::fp64, host, optim::adamw, parallel::zero<0>,
                                 local_communicator, tp_layers>;
        auto& m = msg[static_cast<std::size_t>(world.rank())];
        m[0] = what([&] {
          T t(trainer_suite::model(), tp_config(1, 4, 2), f,
              parallel::layout{g.dp, tp_layers{&g.tp}});
        });
        auto odd = trainer_suite::model();
        odd.ffn_dim = 25;
        m[1] = what([&] {
          T t(odd, tp_config(1, 2, 2), f, parallel::layout{g.dp, tp_layers{&g.tp}});
        });
        train::train_config sp = tp_suite::config(1, 2, 2, true);
        sp.seq = 15;
        m[2] = what([&] {
          T t(trainer_suite::model(), sp, f, parallel::layout{g.dp, tp_layers{&g.tp}});
        });
        tp_bytes[static_cast<std::size_t>(world.rank())] = g.tp.stats().bytes_sent();
      },
      test_options()));
  for (std::size_t r = 0; r < 2; ++r) {
    CHECK_THAT(msg[r][0], Catch::Contains("tp=4") && Catch::Contains("2 ranks"));
    CHECK_THAT(msg[r][1], Catch::Contains("F=25") && Catch::Contains("tp=2"));
    CHECK_THAT(msg[r][2], Catch::Contains("T=15") && Catch::Contains("tp=2"));
    CHECK(tp_bytes[r] == 0);
  }
}

TEST_CASE("tp trainer: a single-file checkpoint resumes at its layout only", "[train][tp]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("tp_ck", 0)};
  data::token_file f(corpus.path);
  const auto ck = std::filesystem::temp_directory_path() /
                  ("tessera_tp_ck_" + std::to_string(::getpid()) + ".bin");
  // Catch2's assertions are not thread-safe (TSan): ranks record, main checks.
  std::vector<double> rest[2], again[2];
  REQUIRE_NOTHROW(local_world::run(
      2,
      [&](local_communicator& world) {
        omp_set_num_threads(1);
        const comm::device_mesh mesh(1, 2, 1);
        auto g = comm::make_groups(world, mesh);
        using T = train::trainer<precision::fp64, host, optim::adamw, parallel::zero<0>,
                                 local_communicator, tp_layers>;
        T whole(trainer_suite::model(), tp_config(1, 2, 6), f,
                parallel::layout{g.dp, tp_layers{&g.tp}});
        for (int s = 0; s < 3; ++s) whole.train_step();
        whole.save_checkpoint(ck);
        world.barrier();
        const auto r = static_cast<std::size_t>(world.rank());
        for (int s = 0; s < 3; ++s) rest[r].push_back(whole.train_step().loss);
        T resumed(trainer_suite::model(), tp_config(1, 2, 6), f,
                  parallel::layout{g.dp, tp_layers{&g.tp}});
        resumed.load_checkpoint(ck);
        for (int s = 0; s < 3; ++s) again[r].push_back(resumed.train_step().loss);
      },
      test_options()));
  for (std::size_t r = 0; r < 2; ++r) CHECK(again[r] == rest[r]);
  // One rank cannot resume a tp 2 checkpoint: the message names both degrees.
  train::trainer<precision::fp64> one(trainer_suite::model(), tp_config(1, 1, 6), f);
  CHECK_THROWS_WITH(one.load_checkpoint(ck),
                    Catch::Contains("written at tp=2") && Catch::Contains("this run has tp=1"));
  std::error_code ec;
  std::filesystem::remove(ck, ec);
  std::filesystem::remove(ck.string() + ".tp1", ec);
}

TEST_CASE("tp trainer: shards that are not one checkpoint are refused on every rank",
          "[train][tp][errors]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("tp_mix", 0)};
  data::token_file f(corpus.path);
  const auto base =
      std::filesystem::temp_directory_path() / ("tessera_tp_mix_" + std::to_string(::getpid()));
  const std::filesystem::path a = base.string() + ".a.bin", b = base.string() + ".b.bin",
                              one_ck = base.string() + ".one.bin";
  // A stale shard of an earlier tp 4 run, which the tp 2 save removes.
  std::ofstream(a.string() + ".tp3") << "stale";
  // A tp 1 checkpoint, which a tp 2 run must refuse by its degree.
  {
    train::trainer<precision::fp64> one(trainer_suite::model(), tp_config(1, 1, 6), f);
    one.train_step();
    one.save_checkpoint(one_ck);
  }
  std::string mixed[2], degree[2];
  REQUIRE_NOTHROW(local_world::run(
      2,
      [&](local_communicator& world) {
        omp_set_num_threads(1);
        auto g = comm::make_groups(world, comm::device_mesh(1, 2, 1));
        using T = train::trainer<precision::fp64, host, optim::adamw, parallel::zero<0>,
                                 local_communicator, tp_layers>;
        T tr(trainer_suite::model(), tp_config(1, 2, 6), f,
             parallel::layout{g.dp, tp_layers{&g.tp}});
        for (int s = 0; s < 3; ++s) tr.train_step();
        tr.save_checkpoint(a);
        for (int s = 0; s < 2; ++s) tr.train_step();
        tr.save_checkpoint(b);
        world.barrier();
        // tp rank 1's shard of step 5 beside tp rank 0's of step 3.
        if (world.rank() == 0)
          std::filesystem::copy_file(b.string() + ".tp1", a.string() + ".tp1",
                                     std::filesystem::copy_options::overwrite_existing);
        world.barrier();
        const auto r = static_cast<std::size_t>(world.rank());
        T resumed(trainer_suite::model(), tp_config(1, 2, 6), f,
                  parallel::layout{g.dp, tp_layers{&g.tp}});
        try {
          resumed.load_checkpoint(a);
        } catch (const std::exception& e) {
          mixed[r] = e.what();
        }
        try {
          resumed.load_checkpoint(one_ck);
        } catch (const std::exception& e) {
          degree[r] = e.what();
        }
      },
      test_options()));
  for (int r = 0; r < 2; ++r) {
    INFO("tp rank " << r);
    CHECK_THAT(mixed[r], Catch::Contains("different steps") && Catch::Contains("3 to 5"));
    CHECK_THAT(degree[r],
               Catch::Contains("written at tp=1") && Catch::Contains("this run has tp=2"));
  }
  CHECK(!std::filesystem::exists(a.string() + ".tp3"));
  std::error_code ec;
  for (const auto& p : {a, b, one_ck}) {
    std::filesystem::remove(p, ec);
    std::filesystem::remove(p.string() + ".tp1", ec);
  }
}

}  // namespace test_train_tensor_parallel
