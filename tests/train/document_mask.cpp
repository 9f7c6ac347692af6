// The trainer with packed documents (train_config::document_separator):
// on dp x tp x pp meshes of thread ranks it computes the single-rank run
// (tests/train/pp_suite.hpp: the loss, the gradient norm and every gradient
// of five float64 AdamW steps at 1e-10, the parameters after them), at
// pp 2 (1F1B, and interleaved with 2 virtual stages: a chunk without the
// embedding gets the documents too), tp 2 with sequence parallelism, and
// (dp, tp, pp) = (1, 2, 2); the mask changes the run (the test sees it);
// a separator outside the vocabulary is refused, and a checkpoint resumes
// only under its own setting.
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

namespace test_train_document_mask {

using namespace tessera;
using comm::local_communicator;
using comm::local_world;
using parallel::schedule_kind;

namespace {

// The corpus is words and spaces: with the space as the separator every
// window packs several documents of 2 to 6 tokens, some windows start
// with a separator, and documents cross every micro-batch and tile edge.
constexpr std::int32_t space = ' ';

template <class P, class S>
void check_mesh(pp_suite::layout l, double tol, std::int64_t steps = 5) {
  l.document_separator = space;
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("docmask", 0)};
  data::token_file f(corpus.path);
  const pp_suite::reference ref = pp_suite::single_rank<P>(f, steps, l.micro_batches * l.dp,
                                                           l.layers, false, l.document_separator);
  // The mask is on: the single rank's run without it gives another loss.
  const pp_suite::reference plain =
      pp_suite::single_rank<P>(f, 1, l.micro_batches * l.dp, l.layers);
  CHECK(std::fabs(plain.loss[0] - ref.loss[0]) > 1e-6 * ref.loss[0]);
  INFO(l.name() << " " << S::name);
  comm::comm_options o;
  o.timeout = std::chrono::seconds(60);
  REQUIRE_NOTHROW(local_world::run(
      l.dp * l.tp * l.pp,
      [&](local_communicator& world) {
        omp_set_num_threads(1);
        pp_suite::check_mesh<P, S>(world, ref, f, l, tol);
      },
      o));
}

using pp_suite::mesh;

}  // namespace

TEST_CASE("trainer with a document mask: pp 2, tp 2 and (1, 2, 2) equal one rank (float64)",
          "[train][pp][tp][document_mask]") {
  using P = precision::fp64;
  // float64: the layouts sum the same terms in other orders (1e-10, as the
  // unmasked meshes of tests/train/pipeline.cpp).
  check_mesh<P, parallel::zero<0>>(mesh(1, 1, 2), 1e-10);
  check_mesh<P, parallel::zero<1>>(mesh(1, 1, 2, schedule_kind::interleaved, 2), 1e-10);
  auto sp = mesh(1, 2, 1);
  sp.sequence_parallel = true;
  check_mesh<P, parallel::zero<0>>(sp, 1e-10);
  check_mesh<P, parallel::zero<1>>(mesh(2, 1, 1), 1e-10);
  check_mesh<P, parallel::zero<0>>(mesh(1, 2, 2), 1e-10);
  // ZB-H1 splits the backward: the weight gradients (W) read the mask from
  // the record after the input gradients (B).
  check_mesh<P, parallel::zero<0>>(mesh(1, 1, 2, schedule_kind::zero_bubble_h1), 1e-10);
}

// Activation checkpointing recomputes a block's forward in its backward:
// the recompute reads the same document starts, so every block
// checkpointed (and every second one) gives the run that keeps the
// activations (float64: the same operations in the same order).
TEST_CASE("trainer with a document mask: activation checkpointing recomputes under the mask",
          "[train][document_mask]") {
  using P = precision::fp64;
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("docmask_ckpt", 0)};
  data::token_file f(corpus.path);
  pp_suite::layout one = mesh(1, 1, 1);
  one.document_separator = space;
  auto cfg = pp_suite::config(one, 3);
  for (const std::int64_t every : {1, 2}) {
    INFO("checkpointing every " << every);
    auto c = cfg;
    c.checkpointing.mode = nn::activation_checkpointing::full;
    c.checkpointing.every = every;
    train::trainer<P> recompute(pp_suite::model(), c, f);
    train::trainer<P> plain(pp_suite::model(), cfg, f);
    for (int s = 0; s < 3; ++s) {
      const auto a = plain.train_step(), b = recompute.train_step();
      CHECK(b.loss == a.loss);
      CHECK(b.grad_norm == a.grad_norm);
    }
  }
}

TEST_CASE("trainer with a document mask: evaluation at pp 2 equals one rank's and sees the mask",
          "[train][pp][document_mask]") {
  using P = precision::fp64;
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("docmask_eval", 0)};
  data::token_file f(corpus.path);
  pp_suite::layout one = mesh(1, 1, 1);
  one.document_separator = space;
  train::trainer<P> ref(pp_suite::model(), pp_suite::config(one, 2), f);
  (void)ref.train_step();
  const double e_one = ref.evaluate();
  auto cfg_plain = pp_suite::config(one, 2);
  cfg_plain.document_separator.reset();
  train::trainer<P> plain(pp_suite::model(), cfg_plain, f);
  (void)plain.train_step();
  CHECK(std::fabs(plain.evaluate() - e_one) > 1e-6 * e_one);  // the mask changes the loss
  pp_suite::layout two = mesh(1, 1, 2);
  two.document_separator = space;
  double e_two = 0;
  comm::comm_options o;
  o.timeout = std::chrono::seconds(60);
  local_world::run(
      2,
      [&](local_communicator& world) {
        omp_set_num_threads(1);
        const comm::device_mesh m(1, 1, 2);
        auto g = comm::make_groups(world, m);
        train::trainer<P, host, optim::adamw, parallel::zero<0>, local_communicator> tr(
            pp_suite::model(), pp_suite::config(two, 2), f,
            parallel::layout{g.dp, nn::dense_layers{}, g.pp});
        (void)tr.train_step();
        const double e = tr.evaluate();
        if (world.rank() == 0) e_two = e;
      },
      o);
  INFO("evaluation: one rank " << e_one << ", pp 2 " << e_two);
  CHECK(std::fabs(e_two - e_one) <= 1e-12 * e_one);
}

TEST_CASE("trainer with a document mask: bad separators and resumes are refused",
          "[train][document_mask]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("docmask_bad", 0)};
  data::token_file f(corpus.path);
  auto cfg = pp_suite::config(pp_suite::layout{}, 2);
  cfg.document_separator = 256;  // the byte vocabulary is [0, 256)
  CHECK_THROWS_WITH((train::trainer<precision::fp32>(pp_suite::model(), cfg, f)),
                    Catch::Contains("document separator id 256") &&
                        Catch::Contains("outside the vocabulary [0, 256)"));
  cfg.document_separator = -1;
  CHECK_THROWS_WITH(cfg.validate(), Catch::Contains("document separator id -1"));
  // End-of-text (3) is a byte, but this corpus holds none: every window
  // would be one document, so the run is refused.
  cfg.document_separator = 3;
  CHECK_THROWS_WITH((train::trainer<precision::fp32>(pp_suite::model(), cfg, f)),
                    Catch::Contains("document separator id 3 does not occur in the first") &&
                        Catch::Contains("training tokens of"));

  // A checkpoint written with the mask resumes with it, and only with it.
  cfg.document_separator = space;
  const auto ck = std::filesystem::temp_directory_path() /
                  ("tessera_docmask_" + std::to_string(::getpid()) + ".bin");
  trainer_suite::temp_file ck_file{ck};
  {
    train::trainer<precision::fp32> tr(pp_suite::model(), cfg, f);
    (void)tr.train_step();
    tr.save_checkpoint(ck);
  }
  {
    train::trainer<precision::fp32> tr(pp_suite::model(), cfg, f);
    CHECK_NOTHROW(tr.load_checkpoint(ck));
  }
  for (const std::optional<std::int32_t> other :
       {std::optional<std::int32_t>{}, std::optional<std::int32_t>{'\n'}}) {
    auto c2 = cfg;
    c2.document_separator = other;
    train::trainer<precision::fp32> tr(pp_suite::model(), c2, f);
    CHECK_THROWS_WITH(tr.load_checkpoint(ck),
                      Catch::Contains("document_separator=32 in the checkpoint"));
  }
}

}  // namespace test_train_document_mask
