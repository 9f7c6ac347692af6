// The trainer under context parallelism (train_config::cp): each sequence's
// 16 tokens split head-tail over cp thread ranks, which read the same
// micro-batches, with the gradients reduced (and ZeRO-sharded) over
// dp x cp. On (dp, cp, tp, pp) meshes (cp 2 and 4; (2, 2, 1, 1), (1, 2, 2,
// 1), (1, 2, 1, 2), (2, 2, 2, 2)), ring and Ulysses, each under ZeRO 0, 1
// and 2, it computes the single-rank run (tests/train/pp_suite.hpp: the
// loss, the gradient norm and every gradient of five float64 AdamW steps
// at 1e-10, the parameters after them); with packed documents, with
// sequence parallelism, under ZeRO-3; generation through a pipeline; the
// held-out loss equals one rank's; a checkpoint of a cp run resumes; and
// meshes that cannot split the sequence are refused naming the numbers.
#include <catch2/catch.hpp>

#include <omp.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <string>

#include <tessera/comm/local.hpp>
#include <tessera/train/trainer.hpp>

#include "pp_suite.hpp"
#include "trainer_suite.hpp"

namespace test_train_context_parallel {

using namespace tessera;
using comm::local_communicator;
using comm::local_world;
using nn::cp_kind;

namespace {

// (dp, cp, tp, pp), four micro-batches per dp rank.
pp_suite::layout mesh(int dp, int cp, int tp, int pp, cp_kind kind = cp_kind::ring) {
  pp_suite::layout l = pp_suite::mesh(dp, tp, pp);
  l.cp = cp;
  l.cp_kind = kind;
  return l;
}

template <class S>
void check_mesh(const pp_suite::layout& l, double tol = 1e-10) {
  using P = precision::fp64;
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("context_parallel", 0)};
  data::token_file f(corpus.path);
  const pp_suite::reference ref =
      pp_suite::single_rank<P>(f, 5, l.micro_batches * l.dp, l.layers, false, l.document_separator);
  INFO(l.name() << " " << S::name);
  REQUIRE_NOTHROW(local_world::run(
      l.ranks(),
      [&](local_communicator& world) {
        omp_set_num_threads(1);
        pp_suite::check_mesh<P, S>(world, ref, f, l, tol);
      },
      pp_suite::test_options()));
}

}  // namespace

// Every layout under ZeRO 0, 1 and 2.
static void check_zero_0_to_2(const pp_suite::layout& l) {
  check_mesh<parallel::zero<0>>(l);
  check_mesh<parallel::zero<1>>(l);
  check_mesh<parallel::zero<2>>(l);
}

TEST_CASE("trainer under cp 2 and 4, ring and Ulysses, equals one rank (float64)", "[train][cp]") {
  for (const cp_kind kind : {cp_kind::ring, cp_kind::ulysses}) {
    check_zero_0_to_2(mesh(1, 2, 1, 1, kind));
    check_zero_0_to_2(mesh(1, 4, 1, 1, kind));
  }
}

TEST_CASE("trainer under cp with dp, tp and pp equals one rank (float64)", "[train][cp]") {
  for (const cp_kind kind : {cp_kind::ring, cp_kind::ulysses}) {
    check_zero_0_to_2(mesh(2, 2, 1, 1, kind));
    check_zero_0_to_2(mesh(1, 2, 2, 1, kind));
    check_zero_0_to_2(mesh(1, 2, 1, 2, kind));
    check_zero_0_to_2(mesh(2, 2, 2, 2, kind));
  }
}

TEST_CASE("trainer under cp: packed documents, sequence parallelism, ZeRO-3", "[train][cp]") {
  pp_suite::layout docs = mesh(1, 2, 1, 1);
  docs.document_separator = ' ';  // several documents per window, across the chunks
  check_mesh<parallel::zero<0>>(docs);
  docs.cp_kind = cp_kind::ulysses;
  check_mesh<parallel::zero<1>>(docs);
  pp_suite::layout sp = mesh(1, 2, 2, 1);
  sp.sequence_parallel = true;
  check_mesh<parallel::zero<0>>(sp);
  check_mesh<parallel::zero<3>>(mesh(2, 2, 1, 1));
}

// The held-out loss: every cp rank scores its tokens of the windows.
TEST_CASE("trainer under cp: evaluation equals one rank's", "[train][cp]") {
  using P = precision::fp64;
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("context_parallel_eval", 0)};
  data::token_file f(corpus.path);
  const pp_suite::layout one = mesh(1, 1, 1, 1);
  train::trainer<P> ref(pp_suite::model(), pp_suite::config(one, 2), f);
  (void)ref.train_step();
  const double want = ref.evaluate();
  for (const cp_kind kind : {cp_kind::ring, cp_kind::ulysses}) {
    const pp_suite::layout l = mesh(1, 2, 1, 1, kind);
    std::vector<double> got(2);
    REQUIRE_NOTHROW(local_world::run(
        2,
        [&](local_communicator& world) {
          omp_set_num_threads(1);
          auto g = comm::make_groups(world, comm::device_mesh(comm::mesh_degrees{.cp = 2}));
          train::trainer<P, host, optim::adamw, parallel::zero<0>, local_communicator> tr(
              pp_suite::model(), pp_suite::config(l, 2), f,
              parallel::layout{g, nn::dense_layers{}});
          (void)tr.train_step();
          got[static_cast<std::size_t>(world.rank())] = tr.evaluate();
        },
        pp_suite::test_options()));
    INFO(nn::to_string(kind));
    CHECK(got[0] == got[1]);
    CHECK(std::fabs(got[0] - want) <= 1e-12 * want);
  }
}

// Generation runs on whole sequences on every rank (the weights are
// replicated over cp), through the pipeline's stages too: at (dp, cp, tp,
// pp) = (1, 2, 1, 2) the tokens sampled after two steps are one rank's.
TEST_CASE("trainer under cp: generation through a pipeline equals one rank's", "[train][cp]") {
  using P = precision::fp64;
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("context_parallel_gen", 0)};
  data::token_file f(corpus.path);
  const nn::llama_config model_cfg = pp_suite::model();
  train::trainer<P> ref(model_cfg, pp_suite::config(mesh(1, 1, 1, 1), 2), f);
  (void)ref.train_step();
  (void)ref.train_step();
  const std::vector<std::int32_t> prompt = {'t', 'h', 'e', ' '};  // odd lengths follow
  const std::vector<std::int32_t> want = ref.generate(prompt, 9, 0.8, 5);
  std::vector<std::vector<std::int32_t>> got(4);
  REQUIRE_NOTHROW(local_world::run(
      4,
      [&](local_communicator& world) {
        omp_set_num_threads(1);
        // example-begin cp_trainer
        auto g = comm::make_groups(world, comm::device_mesh(comm::mesh_degrees{.cp = 2, .pp = 2}));
        train::train_config cfg = pp_suite::config(mesh(1, 1, 1, 1), 2);  // the run's settings
        cfg.cp = 2;
        cfg.cp_kind = nn::cp_kind::ring;
        cfg.pp = 2;
        train::trainer<P, host, optim::adamw, parallel::zero<1>, local_communicator> tr(
            model_cfg, cfg, f, parallel::layout{g, nn::dense_layers{}});
        // example-end cp_trainer
        (void)tr.train_step();
        (void)tr.train_step();
        got[static_cast<std::size_t>(world.rank())] = tr.generate(prompt, 9, 0.8, 5);
      },
      pp_suite::test_options()));
  for (const auto& g : got) CHECK(g == want);
}

// The evaluation with two windows a micro-batch and packed documents: each
// row's document starts are cut to its cp rank's tokens.
TEST_CASE("trainer under cp: evaluation with B 2 and documents equals one rank's", "[train][cp]") {
  using P = precision::fp64;
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("context_parallel_eval_docs", 0)};
  data::token_file f(corpus.path);
  pp_suite::layout one = mesh(1, 1, 1, 1);
  one.document_separator = ' ';
  auto cfg1 = pp_suite::config(one, 2);
  cfg1.micro_batch = 2;
  train::trainer<P> ref(pp_suite::model(), cfg1, f);
  const double l1 = ref.train_step().loss;
  const double want = ref.evaluate();
  pp_suite::layout l = mesh(1, 2, 1, 1, cp_kind::ulysses);
  l.document_separator = ' ';
  std::vector<double> loss(2), got(2);
  REQUIRE_NOTHROW(local_world::run(
      2,
      [&](local_communicator& world) {
        omp_set_num_threads(1);
        auto g = comm::make_groups(world, comm::device_mesh(comm::mesh_degrees{.cp = 2}));
        auto cfg = pp_suite::config(l, 2);
        cfg.micro_batch = 2;
        train::trainer<P, host, optim::adamw, parallel::zero<0>, local_communicator> tr(
            pp_suite::model(), cfg, f, parallel::layout{g, nn::dense_layers{}});
        loss[static_cast<std::size_t>(world.rank())] = tr.train_step().loss;
        got[static_cast<std::size_t>(world.rank())] = tr.evaluate();
      },
      pp_suite::test_options()));
  for (int r = 0; r < 2; ++r) {
    CHECK(std::fabs(loss[static_cast<std::size_t>(r)] - l1) <= 1e-12 * l1);
    CHECK(std::fabs(got[static_cast<std::size_t>(r)] - want) <= 1e-12 * want);
  }
}

// A checkpoint of a cp run (ZeRO-1: each dp x cp rank writes its shard of
// the optimizer state) resumes on the same layout: the steps after it equal
// the uninterrupted run's bit for bit.
TEST_CASE("trainer under cp: a checkpoint resumes", "[train][cp][checkpoint]") {
  using P = precision::fp64;
  using S = parallel::zero<1>;
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("context_parallel_ckpt", 0)};
  data::token_file f(corpus.path);
  const pp_suite::layout l = mesh(1, 2, 1, 1);
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      ("tessera_cp_ckpt_" + std::to_string(static_cast<long>(::getpid())));
  std::filesystem::remove_all(dir);
  std::vector<double> straight(2), resumed(2);
  auto run = [&](bool save, bool load) {
    local_world::run(
        2,
        [&](local_communicator& world) {
          omp_set_num_threads(1);
          auto g = comm::make_groups(world, comm::device_mesh(comm::mesh_degrees{.cp = 2}));
          train::trainer<P, host, optim::adamw, S, local_communicator> tr(
              pp_suite::model(), pp_suite::config(l, 4), f,
              parallel::layout{g, nn::dense_layers{}});
          if (load) {
            tr.load_checkpoint(dir);
          } else {
            (void)tr.train_step();
            (void)tr.train_step();
          }
          if (save) tr.save_checkpoint(dir);
          if (save && !load) return;
          double* out = load ? resumed.data() : straight.data();
          for (int s = 0; s < 2; ++s) {
            const double loss = tr.train_step().loss;
            if (world.rank() == 0) out[s] = loss;
          }
        },
        pp_suite::test_options());
  };
  REQUIRE_NOTHROW(run(false, false));  // four steps straight
  REQUIRE_NOTHROW(run(true, false));   // two steps, saved
  REQUIRE_NOTHROW(run(false, true));   // loaded, two more
  std::filesystem::remove_all(dir);
  CHECK(resumed == straight);
}

TEST_CASE("trainer under cp: meshes that cannot split the sequence are refused", "[train][cp]") {
  using P = precision::fp64;
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("context_parallel_refused", 0)};
  data::token_file f(corpus.path);
  auto refused = [&](pp_suite::layout l, std::int64_t seq, const std::string& want) {
    std::vector<std::string> what(static_cast<std::size_t>(l.ranks()));
    local_world::run(
        l.ranks(),
        [&](local_communicator& world) {
          auto g = comm::make_groups(
              world, comm::device_mesh(comm::mesh_degrees{.dp = l.dp, .cp = l.cp, .tp = l.tp}));
          auto cfg = pp_suite::config(l, 1);
          cfg.seq = seq;
          try {
            train::trainer<P, host, optim::adamw, parallel::zero<0>, local_communicator> tr(
                pp_suite::model(), cfg, f, parallel::layout{g, nn::dense_layers{}});
          } catch (const config_error& e) {
            what[static_cast<std::size_t>(world.rank())] = e.what();
          }
        },
        pp_suite::test_options());
    for (const std::string& w : what) CHECK_THAT(w, Catch::Contains(want));
  };
  refused(mesh(1, 3, 1, 1), 16, "T=16 is not divisible by 2*cp=6");
  // the tiny model's 4 query heads over cp 8 ranks of Ulysses
  refused(mesh(1, 8, 1, 1, cp_kind::ulysses), 16,
          "cp=8 does not divide the query heads of a tp rank, nh/tp = 4/1 = 4");
}

}  // namespace test_train_context_parallel
