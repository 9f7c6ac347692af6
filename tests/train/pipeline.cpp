// The trainer on a dp x tp x pp mesh of thread ranks computes the
// single-rank run (tests/train/pp_suite.hpp): five AdamW steps with
// gradient accumulation on a 4-block tiny model, pp 2 and 4 under every
// schedule (interleaved with 2 virtual stages at pp 2), (dp, tp, pp) =
// (2, 1, 2), (1, 2, 2) and (2, 2, 2) on 8 ranks, ZeRO 0, 1 and 2: the loss,
// the gradient norm, every gradient before clipping of every step and the
// parameters at float64 1e-10 and float32 1e-5 relative; micro-batch
// counts 1, K - 1, K and K + 1 either run so or are refused before any
// send; evaluation and generation through the pipeline give one rank's
// values; a checkpoint of a pipeline resumes at its layout; an exception on
// one stage mid-step ends every rank promptly with an error naming it; a
// wrong configuration fails before the first send.
#include <catch2/catch.hpp>

#include <omp.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <tessera/comm/device_mesh.hpp>
#include <tessera/comm/local.hpp>

#include "pp_suite.hpp"
#include "trainer_suite.hpp"

using namespace tessera;
using comm::local_communicator;
using comm::local_world;
using parallel::schedule_kind;

namespace {

comm::comm_options test_options(int seconds = 60) {
  comm::comm_options o;
  o.timeout = std::chrono::seconds(seconds);
  return o;
}

template <class P, class S>
void check_mesh(const pp_suite::layout& l, double tol, std::int64_t steps = 5) {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("pp", 0)};
  data::token_file f(corpus.path);
  const pp_suite::reference ref =
      pp_suite::single_rank<P>(f, steps, l.micro_batches * l.dp);
  INFO(l.name() << " " << S::name);
  REQUIRE_NOTHROW(local_world::run(
      l.dp * l.tp * l.pp,
      [&](local_communicator& world) {
        omp_set_num_threads(1);
        pp_suite::check_mesh<P, S>(world, ref, f, l, tol);
      },
      test_options()));
}

pp_suite::layout pipe(int pp, schedule_kind s, int V = 1, std::int64_t M = 8, int dp = 1,
                      int tp = 1) {
  pp_suite::layout l;
  l.pp = pp;
  l.schedule = s;
  l.virtual_stages = V;
  l.micro_batches = M;
  l.dp = dp;
  l.tp = tp;
  return l;
}

}  // namespace

TEST_CASE("pp trainer: every schedule at pp 2 and 4 equals one rank's (float64)",
          "[train][pp]") {
  using P = precision::fp64;
  using Z0 = parallel::zero<0>;
  for (schedule_kind s : {schedule_kind::gpipe, schedule_kind::one_f_one_b,
                          schedule_kind::zero_bubble_h1}) {
    check_mesh<P, Z0>(pipe(2, s), 1e-10);
    check_mesh<P, Z0>(pipe(4, s), 1e-10);
  }
  check_mesh<P, Z0>(pipe(2, schedule_kind::interleaved, 2), 1e-10);
  check_mesh<P, Z0>(pipe(4, schedule_kind::interleaved, 1), 1e-10);
}

TEST_CASE("pp trainer: dp x tp x pp meshes on up to 8 ranks equal one rank's (float64)",
          "[train][pp][tp]") {
  using P = precision::fp64;
  for (schedule_kind s : {schedule_kind::one_f_one_b, schedule_kind::zero_bubble_h1}) {
    check_mesh<P, parallel::zero<0>>(pipe(2, s, 1, 4, 2, 1), 1e-10);
    check_mesh<P, parallel::zero<1>>(pipe(2, s, 1, 4, 2, 1), 1e-10);
    check_mesh<P, parallel::zero<0>>(pipe(2, s, 1, 8, 1, 2), 1e-10);
    check_mesh<P, parallel::zero<1>>(pipe(2, s, 1, 4, 2, 2), 1e-10);
  }
  check_mesh<P, parallel::zero<0>>(pipe(2, schedule_kind::interleaved, 2, 4, 2, 2), 1e-10);
  check_mesh<P, parallel::zero<2>>(pipe(2, schedule_kind::gpipe, 1, 4, 2, 1), 1e-10);
  auto sp = pipe(2, schedule_kind::zero_bubble_h1, 1, 4, 1, 2);
  sp.sequence_parallel = true;
  check_mesh<P, parallel::zero<1>>(sp, 1e-10);
}

TEST_CASE("pp trainer: float32 under every schedule", "[train][pp]") {
  using P = precision::fp32;
  check_mesh<P, parallel::zero<0>>(pipe(2, schedule_kind::gpipe), 1e-5);
  check_mesh<P, parallel::zero<1>>(pipe(2, schedule_kind::one_f_one_b, 1, 4, 2), 1e-5);
  check_mesh<P, parallel::zero<0>>(pipe(4, schedule_kind::zero_bubble_h1), 1e-5);
  check_mesh<P, parallel::zero<0>>(pipe(2, schedule_kind::interleaved, 2, 4, 1, 2), 1e-5);
}

TEST_CASE("pp trainer: micro-batch counts 1, K - 1, K and K + 1", "[train][pp]") {
  using P = precision::fp64;
  const int K = 4;
  for (std::int64_t M : {std::int64_t{1}, std::int64_t{K - 1}, std::int64_t{K},
                         std::int64_t{K + 1}}) {
    for (schedule_kind s : {schedule_kind::gpipe, schedule_kind::one_f_one_b,
                            schedule_kind::zero_bubble_h1})
      check_mesh<P, parallel::zero<0>>(pipe(K, s, 1, M), 1e-10, 2);
    // Interleaved runs only multiples of pp: refused at construction, before any send.
    trainer_suite::temp_file corpus{trainer_suite::make_corpus("ppm", 0)};
    data::token_file f(corpus.path);
    std::atomic<int> refused{0};
    REQUIRE_NOTHROW(local_world::run(
        2,
        [&](local_communicator& world) {
          auto l = pipe(2, schedule_kind::interleaved, 2, M);
          const comm::device_mesh mesh(1, 1, 2);
          auto g = comm::make_groups(world, mesh);
          try {
            train::trainer<P, host, optim::adamw, parallel::zero<0>, local_communicator> tr(
                pp_suite::model(), pp_suite::config(l, 2), f, g.dp, nn::dense_layers{}, g.pp);
            (void)tr.train_step();
          } catch (const config_error& e) {
            const std::string w = e.what();
            if (w.find("multiple of pp=2") != std::string::npos) ++refused;
          }
          // Nothing was sent: the pp group is clean.
          zero_suite::check(g.pp.stats().send.calls == 0 || M % 2 == 0, "a send before refusal");
        },
        test_options()));
    CHECK(refused.load() == (M % 2 == 0 ? 0 : 2));
  }
}

TEST_CASE("pp trainer: evaluation, generation and checkpoints through the pipeline",
          "[train][pp]") {
  using P = precision::fp64;
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("ppe", 0)};
  data::token_file f(corpus.path);
  auto one_layout = pipe(1, schedule_kind::one_f_one_b, 1, 4);
  train::trainer<P> one(pp_suite::model(), pp_suite::config(one_layout, 4), f);
  (void)one.train_step();
  (void)one.train_step();
  const double eval_one = one.evaluate();
  const std::vector<std::int32_t> gen_one = one.generate({104, 101}, 6, 0.8, 5);
  const auto dir = std::filesystem::temp_directory_path() /
                   ("tessera_pp_ckpt_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  for (auto [K, s, V] : {std::tuple{2, schedule_kind::one_f_one_b, 1},
                         std::tuple{2, schedule_kind::interleaved, 2},
                         std::tuple{4, schedule_kind::zero_bubble_h1, 1}}) {
    INFO("pp " << K << " " << parallel::to_string(s) << " V " << V);
    auto l = pipe(K, s, V, 4);
    REQUIRE_NOTHROW(local_world::run(
        K,
        [&](local_communicator& world) {
          omp_set_num_threads(1);
          const comm::device_mesh mesh(1, 1, K);
          auto g = comm::make_groups(world, mesh);
          using T = train::trainer<P, host, optim::adamw, parallel::zero<0>, local_communicator>;
          T tr(pp_suite::model(), pp_suite::config(l, 4), f, g.dp, nn::dense_layers{}, g.pp);
          (void)tr.train_step();
          (void)tr.train_step();
          const double e = tr.evaluate();
          zero_suite::check(std::fabs(e - eval_one) <= 1e-12 * eval_one, "evaluation ", e,
                            " vs one rank's ", eval_one);
          const auto gen = tr.generate({104, 101}, 6, 0.8, 5);
          zero_suite::check(gen == gen_one, "generation differs from one rank's");
          tr.save_checkpoint(dir / "ckpt.bin");
          const auto m3 = tr.train_step();
          T back(pp_suite::model(), pp_suite::config(l, 4), f, g.dp, nn::dense_layers{}, g.pp);
          back.load_checkpoint(dir / "ckpt.bin");
          zero_suite::check(back.step() == 2, "resumed at step ", back.step());
          const auto r3 = back.train_step();
          zero_suite::check(r3.loss == m3.loss && r3.grad_norm == m3.grad_norm,
                            "the resumed step differs: loss ", r3.loss, " vs ", m3.loss);
        },
        test_options()));
  }
  // A checkpoint of pp 2 does not resume at pp 1.
  train::trainer<P> other(pp_suite::model(), pp_suite::config(one_layout, 4), f);
  CHECK_THROWS_WITH(other.load_checkpoint(dir / "ckpt.bin"), Catch::Contains("pp"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("pp trainer: an exception on one stage ends every rank promptly, naming it",
          "[train][pp]") {
  using P = precision::fp64;
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("ppk", 0)};
  data::token_file f(corpus.path);
  const auto t0 = std::chrono::steady_clock::now();
  std::atomic<int> named{0};
  try {
    local_world::run(
        4,
        [&](local_communicator& world) {
          omp_set_num_threads(1);
          const comm::device_mesh mesh(1, 1, 4);
          auto g = comm::make_groups(world, mesh);
          auto l = pipe(4, schedule_kind::one_f_one_b, 1, 8);
          train::trainer<P, host, optim::adamw, parallel::zero<0>, local_communicator> tr(
              pp_suite::model(), pp_suite::config(l, 4), f, g.dp, nn::dense_layers{}, g.pp);
          (void)tr.train_step();
          if (world.rank() == 2) throw std::runtime_error("stage 2 fails mid-run");
          try {
            (void)tr.train_step();
          } catch (const comm_error& e) {
            const std::string w = e.what();
            if (w.find("peer rank 2") != std::string::npos) ++named;
            throw;
          }
        },
        test_options(30));
    FAIL("the run did not fail");
  } catch (const std::exception& e) {
    INFO(e.what());
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(s < 20);  // not the 30 s collective timeout
  CHECK(named.load() >= 1);
}

TEST_CASE("pp trainer: wrong configurations fail before the first send", "[train][pp]") {
  using P = precision::fp64;
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("ppc", 0)};
  data::token_file f(corpus.path);
  auto expect = [&](int K, pp_suite::layout l, nn::llama_config c, const std::string& msg) {
    std::atomic<int> ok{0};
    REQUIRE_NOTHROW(local_world::run(
        K,
        [&](local_communicator& world) {
          const comm::device_mesh mesh(1, 1, K);
          auto g = comm::make_groups(world, mesh);
          try {
            train::trainer<P, host, optim::adamw, parallel::zero<0>, local_communicator> tr(
                c, pp_suite::config(l, 2), f, g.dp, nn::dense_layers{}, g.pp);
          } catch (const config_error& e) {
            if (std::string(e.what()).find(msg) != std::string::npos) ++ok;
            else
              UNSCOPED_INFO(e.what());
          }
          zero_suite::check(g.pp.stats().send.calls == 0, "sent before refusing");
        },
        test_options()));
    CHECK(ok.load() == K);
  };
  auto c = pp_suite::model();
  c.n_layers = 3;
  expect(4, pipe(4, schedule_kind::one_f_one_b), c, "more");       // stages than layers
  expect(2, pipe(2, schedule_kind::interleaved, 2), c, "more");    // 4 virtual stages, 3 layers
  auto wrong = pipe(3, schedule_kind::one_f_one_b);                // pp=3 on a group of 2
  expect(2, wrong, pp_suite::model(), "pp=3");
  expect(2, pipe(2, schedule_kind::one_f_one_b, 2), pp_suite::model(), "interleaved");
  // ZeRO-3 is refused with a pipeline.
  std::atomic<int> z3{0};
  REQUIRE_NOTHROW(local_world::run(
      2,
      [&](local_communicator& world) {
        const comm::device_mesh mesh(1, 1, 2);
        auto g = comm::make_groups(world, mesh);
        try {
          train::trainer<P, host, optim::adamw, parallel::zero<3>, local_communicator> tr(
              pp_suite::model(), pp_suite::config(pipe(2, schedule_kind::gpipe), 2), f, g.dp,
              nn::dense_layers{}, g.pp);
        } catch (const config_error&) {
          ++z3;
        }
      },
      test_options()));
  CHECK(z3.load() == 2);
}
