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

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <tessera/comm/device_mesh.hpp>
#include <tessera/comm/local.hpp>
#include <tessera/nn/tensor_parallel.hpp>

#include "../comm/grouping_local.hpp"
#include "pp_suite.hpp"
#include "trainer_suite.hpp"

namespace test_train_pipeline {

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

// Grouped: the ranks run over grouping_local, so the executor issues each
// message group as one group_p2p with a rendezvous, as over NCCL.
template <class P, class S, bool Grouped = false>
void check_mesh(const pp_suite::layout& l, double tol, std::int64_t steps = 5) {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("pp", 0)};
  data::token_file f(corpus.path);
  const pp_suite::reference ref =
      pp_suite::single_rank<P>(f, steps, l.micro_batches * l.dp, l.layers);
  INFO(l.name() << " " << S::name);
  REQUIRE_NOTHROW(local_world::run(
      l.dp * l.tp * l.pp,
      [&](local_communicator& world) {
        omp_set_num_threads(1);
        if constexpr (Grouped) {
          grouping_test::grouping_local g(std::move(world));
          pp_suite::check_mesh<P, S>(g, ref, f, l, tol);
        } else {
          pp_suite::check_mesh<P, S>(world, ref, f, l, tol);
        }
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

// Two training steps, then evaluate() and generate() of `tr` against one
// rank's `eval_one` (within 1e-12) and `gen_one` (the same tokens).
template <class Trainer>
void two_steps_then_eval_and_generate(Trainer& tr, double eval_one,
                                      const std::vector<std::int32_t>& gen_one) {
  (void)tr.train_step();
  (void)tr.train_step();
  const double e = tr.evaluate();
  zero_suite::check(std::fabs(e - eval_one) <= 1e-12 * eval_one, "evaluation ", e,
                    " vs one rank's ", eval_one);
  const auto gen = tr.generate({104, 101}, 6, 0.8, 5);
  zero_suite::check(gen == gen_one, "generation differs from one rank's");
}

}  // namespace

TEST_CASE("pp trainer: every schedule at pp 2 and 4 equals one rank's (float64)", "[train][pp]") {
  using P = precision::fp64;
  using Z0 = parallel::zero<0>;
  for (schedule_kind s :
       {schedule_kind::gpipe, schedule_kind::one_f_one_b, schedule_kind::zero_bubble_h1}) {
    check_mesh<P, Z0>(pipe(2, s), 1e-10);
    check_mesh<P, Z0>(pipe(4, s), 1e-10);
  }
  check_mesh<P, Z0>(pipe(2, schedule_kind::interleaved, 2), 1e-10);
  check_mesh<P, Z0>(pipe(4, schedule_kind::interleaved, 1), 1e-10);
  // V = 2 at pp 4: rank 3's chunk 0 sends to rank 0's chunk 1 (8 blocks).
  auto v2 = pipe(4, schedule_kind::interleaved, 2, 8);
  v2.layers = 8;
  check_mesh<P, Z0>(v2, 1e-10);
}

TEST_CASE("pp trainer: grouped messages with a rendezvous (NCCL's) equal one rank's",
          "[train][pp]") {
  // The executor's path for nccl_communicator, on threads: every schedule
  // at pp 2 and 4 (interleaved with 2 virtual stages), each message group
  // one group_p2p whose sends wait for their receives.
  using P = precision::fp64;
  using Z1 = parallel::zero<1>;
  for (schedule_kind s :
       {schedule_kind::gpipe, schedule_kind::one_f_one_b, schedule_kind::zero_bubble_h1}) {
    check_mesh<P, Z1, true>(pipe(2, s), 1e-10);
    check_mesh<P, Z1, true>(pipe(4, s), 1e-10);
  }
  check_mesh<P, Z1, true>(pipe(2, schedule_kind::interleaved, 2), 1e-10);
  auto v2 = pipe(4, schedule_kind::interleaved, 2, 8);
  v2.layers = 8;
  check_mesh<P, Z1, true>(v2, 1e-10);
  // bf16 weights: activations travel as 32-bit words in the group too.
  check_mesh<precision::bf16_mixed, Z1, true>(pipe(2, schedule_kind::one_f_one_b), 2e-2, 2);
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
  // ZeRO-2: a bucket opens in B, its gradients are written in W and it
  // reduce-scatters after the last W; several engines per rank interleaved.
  check_mesh<P, parallel::zero<2>>(pipe(2, schedule_kind::gpipe, 1, 4, 2, 1), 1e-10);
  check_mesh<P, parallel::zero<2>>(pipe(2, schedule_kind::zero_bubble_h1, 1, 4, 2, 1), 1e-10);
  check_mesh<P, parallel::zero<2>>(pipe(2, schedule_kind::interleaved, 2, 4, 2, 1), 1e-10);
  check_mesh<P, parallel::zero<2>>(pipe(2, schedule_kind::zero_bubble_h1, 1, 4, 2, 2), 1e-10);
  auto sp = pipe(2, schedule_kind::zero_bubble_h1, 1, 4, 1, 2);
  sp.sequence_parallel = true;
  check_mesh<P, parallel::zero<1>>(sp, 1e-10);
}

TEST_CASE("pp trainer: zero<3> under every schedule equals one rank's (float64)",
          "[train][pp][z3]") {
  using P = precision::fp64;
  using Z3 = parallel::zero<3>;
  for (schedule_kind s :
       {schedule_kind::gpipe, schedule_kind::one_f_one_b, schedule_kind::zero_bubble_h1})
    check_mesh<P, Z3>(pipe(2, s, 1, 4, 2, 1), 1e-10);
  check_mesh<P, Z3>(pipe(2, schedule_kind::interleaved, 2, 4, 2, 1), 1e-10);
  // With tensor parallelism: each dp group gathers its tp rank's shards.
  check_mesh<P, Z3>(pipe(2, schedule_kind::one_f_one_b, 1, 4, 2, 2), 1e-10);
  // Four blocks per stage: under GPipe the forwards run back to back, so a
  // prefetch at the head for a backward that does not come next would still
  // be held when the next forward gathers two more.
  for (schedule_kind s :
       {schedule_kind::gpipe, schedule_kind::one_f_one_b, schedule_kind::zero_bubble_h1}) {
    auto deep = pipe(2, s, 1, 4, 2, 1);
    deep.layers = 8;
    check_mesh<P, Z3>(deep, 1e-10);
  }
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
  for (std::int64_t M :
       {std::int64_t{1}, std::int64_t{K - 1}, std::int64_t{K}, std::int64_t{K + 1}}) {
    for (schedule_kind s :
         {schedule_kind::gpipe, schedule_kind::one_f_one_b, schedule_kind::zero_bubble_h1})
      check_mesh<P, parallel::zero<0>>(pipe(K, s, 1, M), 1e-10, 2);
    // Interleaved runs only multiples of pp (then as one rank does); others
    // are refused at construction, before any send.
    if (M % 2 == 0)
      check_mesh<P, parallel::zero<0>>(pipe(2, schedule_kind::interleaved, 2, M), 1e-10, 2);
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
                pp_suite::model(), pp_suite::config(l, 2), f,
                parallel::layout{g.dp, nn::dense_layers{}, g.pp});
            (void)tr.train_step();
          } catch (const config_error& e) {
            const std::string w = e.what();
            if (w.find("multiple of pp=2") != std::string::npos) ++refused;
          }
          // Refused: nothing was sent on the pp group.
          if (M % 2 != 0) zero_suite::check(g.pp.stats().send.calls == 0, "a send before refusal");
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
  const auto dir =
      std::filesystem::temp_directory_path() / ("tessera_pp_ckpt_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  using tp_layers = nn::tensor_parallel_layers<local_communicator>;
  const auto ckpt = dir / "ckpt.bin";
  for (auto [K_, s, V, tp_] : {std::tuple{4, schedule_kind::zero_bubble_h1, 1, 1},
                               std::tuple{2, schedule_kind::one_f_one_b, 1, 1},
                               std::tuple{2, schedule_kind::interleaved, 2, 1},
                               std::tuple{2, schedule_kind::one_f_one_b, 1, 2}}) {
    const int K = K_, tp = tp_;  // lambdas capture variables, not bindings (clang 14)
    INFO("pp " << K << " " << parallel::to_string(s) << " V " << V << " tp " << tp);
    auto l = pipe(K, s, V, 4, 1, tp);
    REQUIRE_NOTHROW(local_world::run(
        K * tp,
        [&](local_communicator& world) {
          omp_set_num_threads(1);
          const comm::device_mesh mesh(1, tp, K);
          auto g = comm::make_groups(world, mesh);
          using T = train::trainer<P, host, optim::adamw, parallel::zero<0>, local_communicator,
                                   tp_layers>;
          T tr(pp_suite::model(), pp_suite::config(l, 4), f,
               parallel::layout{g.dp, tp_layers{&g.tp}, g.pp});
          two_steps_then_eval_and_generate(tr, eval_one, gen_one);
          tr.save_checkpoint(ckpt);
          const auto m3 = tr.train_step();
          T back(pp_suite::model(), pp_suite::config(l, 4), f,
                 parallel::layout{g.dp, tp_layers{&g.tp}, g.pp});
          back.load_checkpoint(ckpt);
          zero_suite::check(back.step() == 2, "resumed at step ", back.step());
          const auto r3 = back.train_step();
          zero_suite::check(r3.loss == m3.loss && r3.grad_norm == m3.grad_norm,
                            "the resumed step differs: loss ", r3.loss, " vs ", m3.loss);
        },
        test_options()));
    // The shards this layout wrote, and only those: the pp 4 run's
    // ckpt.bin.pp2 and .pp3 were removed by the pp 2 save.
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(dir))
      names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    std::vector<std::string> want = {"ckpt.bin"};
    for (int k = 0; k < K; ++k)
      for (int r = 0; r < tp; ++r) {
        if (k == 0 && r == 0) continue;
        std::string n = "ckpt.bin";
        if (k > 0) n += ".pp" + std::to_string(k);
        if (r > 0) n += ".tp" + std::to_string(r);
        want.push_back(n);
      }
    std::sort(want.begin(), want.end());
    CHECK(names == want);
  }
  // The last checkpoint (pp 2 x tp 2) does not resume at pp 1 (tp named first).
  train::trainer<P> other(pp_suite::model(), pp_suite::config(one_layout, 4), f);
  CHECK_THROWS_WITH(other.load_checkpoint(ckpt), Catch::Contains("tp=2"));
  // A pp 2 checkpoint without tp does not resume at pp 1: pp named.
  REQUIRE_NOTHROW(local_world::run(
      2,
      [&](local_communicator& world) {
        const comm::device_mesh mesh(1, 1, 2);
        auto g = comm::make_groups(world, mesh);
        train::trainer<P, host, optim::adamw, parallel::zero<0>, local_communicator> tr(
            pp_suite::model(), pp_suite::config(pipe(2, schedule_kind::gpipe, 1, 4), 4), f,
            parallel::layout{g.dp, nn::dense_layers{}, g.pp});
        tr.save_checkpoint(ckpt);
      },
      test_options()));
  CHECK_THROWS_WITH(
      other.load_checkpoint(ckpt),
      Catch::Contains("was written at pp=2 with 1 virtual stages but this run has pp=1"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("pp trainer: zero<3> evaluates and generates through the pipeline as one rank does",
          "[train][pp]") {
  // The forward-only passes (begin_forward_only: no backward prefetch)
  // gather each segment of each chunk and free it, on every stage.
  using P = precision::fp64;
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("ppz3e", 0)};
  data::token_file f(corpus.path);
  train::trainer<P> one(pp_suite::model(),
                        pp_suite::config(pipe(1, schedule_kind::one_f_one_b, 1, 4), 4), f);
  (void)one.train_step();
  (void)one.train_step();
  const double eval_one = one.evaluate();
  const std::vector<std::int32_t> gen_one = one.generate({104, 101}, 6, 0.8, 5);
  for (auto [s, V] :
       {std::pair{schedule_kind::zero_bubble_h1, 1}, std::pair{schedule_kind::interleaved, 2}}) {
    const auto l = pipe(2, s, V, 2, 2);
    INFO(l.name());
    REQUIRE_NOTHROW(local_world::run(
        4,
        [&](local_communicator& world) {
          omp_set_num_threads(1);
          auto g = comm::make_groups(world, comm::device_mesh(2, 1, 2));
          train::trainer<P, host, optim::adamw, parallel::zero<3>, local_communicator> tr(
              pp_suite::model(), pp_suite::config(l, 4), f,
              parallel::layout{g.dp, nn::dense_layers{}, g.pp});
          two_steps_then_eval_and_generate(tr, eval_one, gen_one);
          for (int c = 0; c < tr.chunks(); ++c)
            zero_suite::check(tr.engine(c).segments_held() == 0, "chunk ", c, " holds ",
                              tr.engine(c).segments_held(), " gathered segments");
        },
        test_options()));
  }
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
              pp_suite::model(), pp_suite::config(l, 4), f,
              parallel::layout{g.dp, nn::dense_layers{}, g.pp});
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

TEST_CASE("pp executor: a feed that throws mid-step on stage 0 ends both stages at once",
          "[train][pp]") {
  // The step's actions run by the trainer's executor with a feed of our
  // own that fails at micro-batch 3 on stage 0, mid-step: stage 0's run()
  // drops its records and messages, abandons the step and rethrows; stage
  // 1, waiting for micro-batch 3's activations, fails at once naming rank 0.
  using P = precision::fp64;
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("ppx", 0)};
  data::token_file f(corpus.path);
  std::atomic<int> ok{0};
  const auto t0 = std::chrono::steady_clock::now();
  try {
    local_world::run(
        2,
        [&](local_communicator& world) {
          omp_set_num_threads(1);
          const comm::device_mesh mesh(1, 1, 2);
          auto g = comm::make_groups(world, mesh);
          auto l = pipe(2, schedule_kind::one_f_one_b, 1, 8);
          train::trainer<P, host, optim::adamw, parallel::zero<0>, local_communicator> tr(
              pp_suite::model(), pp_suite::config(l, 4), f,
              parallel::layout{g.dp, nn::dense_layers{}, g.pp});
          (void)tr.train_step();
          using Exec = std::remove_reference_t<decltype(tr.executor())>;
          const std::int64_t N = 16;  // B 1 x T 16
          std::vector<std::int32_t> ids(static_cast<std::size_t>(2 * N));
          for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>(i % 200);
          std::vector<double> losses(8), sq(1);
          std::vector<double> clip(1);
          typename Exec::inputs in;
          in.grad_scale = 1.0 / 128;
          in.d_losses = losses.data();
          in.lr = 1e-3;
          in.d_sum_squares = sq.data();
          in.d_clip = clip.data();
          auto feed = [&](std::int64_t m) {
            if (world.rank() == 0 && m == 3)
              throw std::runtime_error("feed fails at micro-batch 3");
            return nn::micro_batch<double>{ids.data(), ids.data() + N, nullptr, 1, 16};
          };
          try {
            tr.executor().run(tr.actions(), feed, in);
          } catch (const std::runtime_error& e) {
            if (world.rank() == 0 && std::string(e.what()) == "feed fails at micro-batch 3") ++ok;
            if (world.rank() == 1 &&
                std::string(e.what()).find("peer rank 0 will not send") != std::string::npos)
              ++ok;
            if (world.rank() == 0) {
              // Nothing is held after the failed step: records and messages dropped.
              zero_suite::check(tr.executor().pool(0).in_flight() == 0, "records left in flight");
            }
            throw;
          }
        },
        test_options(30));
  } catch (const std::exception&) {
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(ok.load() == 2);
  CHECK(s < 20);
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
                c, pp_suite::config(l, 2), f, parallel::layout{g.dp, nn::dense_layers{}, g.pp});
          } catch (const config_error& e) {
            if (std::string(e.what()).find(msg) != std::string::npos)
              ++ok;
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
  expect(4, pipe(4, schedule_kind::one_f_one_b), c, "more");     // stages than layers
  expect(2, pipe(2, schedule_kind::interleaved, 2), c, "more");  // 4 virtual stages, 3 layers
  auto wrong = pipe(3, schedule_kind::one_f_one_b);              // pp=3 on a group of 2
  expect(2, wrong, pp_suite::model(), "pp=3");
  expect(2, pipe(2, schedule_kind::one_f_one_b, 2), pp_suite::model(), "interleaved");
}

}  // namespace test_train_pipeline
