// The trainer with tied embeddings (llama_config::tie_word_embeddings): the
// gradient norm it reports is the float64 norm of the flat gradient, which
// holds the tied tensor once (a norm that counted the embedding and the
// head apart would differ by a margin the test checks is wide); dp 2 under
// ZeRO 0 to 3 (the head reads and adds to the embedding's segment, which
// ZeRO-2 and 3 keep apart), tp 2 and dp 2 x tp 2 give the single-rank run
// (float64 1e-10: loss, norm, every gradient before clipping, the
// parameters; tests/train/pp_suite.hpp).
#include <catch2/catch.hpp>

#include <omp.h>

#include <chrono>
#include <cmath>
#include <vector>

#include <tessera/comm/local.hpp>

#include "pp_suite.hpp"
#include "trainer_suite.hpp"

namespace test_train_tied_embeddings {

using namespace tessera;
using comm::local_communicator;
using comm::local_world;
using parallel::schedule_kind;

namespace {

comm::comm_options test_options() {
  comm::comm_options o;
  o.timeout = std::chrono::seconds(60);
  return o;
}

pp_suite::layout tied_mesh(int dp, int tp, int pp, schedule_kind s = schedule_kind::one_f_one_b,
                           std::int64_t M = 4) {
  pp_suite::layout l;
  l.dp = dp;
  l.tp = tp;
  l.pp = pp;
  l.schedule = s;
  l.micro_batches = M;
  l.tied = true;
  return l;
}

template <class P, class S>
void check_mesh(const pp_suite::layout& l, double tol, std::int64_t steps = 4) {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("tied", 0)};
  data::token_file f(corpus.path);
  const pp_suite::reference ref =
      pp_suite::single_rank<P>(f, steps, l.micro_batches * l.dp, l.layers, l.tied);
  INFO(l.name() << " " << S::name);
  REQUIRE_NOTHROW(local_world::run(
      l.dp * l.tp * l.pp,
      [&](local_communicator& world) {
        omp_set_num_threads(1);
        pp_suite::check_mesh<P, S>(world, ref, f, l, tol);
      },
      test_options()));
}

}  // namespace

TEST_CASE("tied trainer: the reported norm is the flat gradient's, the tied tensor once",
          "[train][tied]") {
  using P = precision::fp64;
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("tiednorm", 0)};
  data::token_file f(corpus.path);
  train::train_config cfg = pp_suite::config(tied_mesh(1, 1, 1), 3);
  train::trainer<P> tr(pp_suite::model(4, true), cfg, f);
  const auto& layout = tr.model().layout();
  REQUIRE_THROWS(layout.at("lm_head"));
  const auto& emb = layout.at("embedding");
  for (int s = 0; s < 3; ++s) {
    const auto m = tr.train_step();
    double all = 0, e2 = 0;
    for (std::int64_t i = 0; i < tr.model().flat_size(); ++i)
      all += tr.model().grads()[i] * tr.model().grads()[i];
    for (std::int64_t j = 0; j < emb.numel; ++j)
      e2 += tr.model().grads()[emb.offset + j] * tr.model().grads()[emb.offset + j];
    const double once = std::sqrt(all), twice = std::sqrt(all + e2);
    INFO("step " << s + 1 << ": reported " << m.grad_norm << ", the flat gradient's " << once
                 << ", the tied tensor counted twice " << twice);
    CHECK(std::fabs(m.grad_norm - once) <= 1e-12 * once);
    // A double count would be visible far beyond the tolerances of the
    // layout tests (1e-10): the embedding holds a good part of the norm.
    CHECK(twice - once > 1e-3 * once);
  }
}

TEST_CASE("tied trainer: dp 2 under ZeRO 0 to 3 equals one rank (float64)", "[train][tied]") {
  using P = precision::fp64;
  check_mesh<P, parallel::zero<0>>(tied_mesh(2, 1, 1), 1e-10);
  check_mesh<P, parallel::zero<1>>(tied_mesh(2, 1, 1), 1e-10);
  check_mesh<P, parallel::zero<2>>(tied_mesh(2, 1, 1), 1e-10);
  check_mesh<P, parallel::zero<3>>(tied_mesh(2, 1, 1), 1e-10);
}

TEST_CASE("tied trainer: tp 2 and dp 2 x tp 2 equal one rank (float64)", "[train][tied][tp]") {
  using P = precision::fp64;
  check_mesh<P, parallel::zero<0>>(tied_mesh(1, 2, 1), 1e-10);
  check_mesh<P, parallel::zero<1>>(tied_mesh(2, 2, 1), 1e-10);
  check_mesh<P, parallel::zero<3>>(tied_mesh(2, 2, 1), 1e-10);
}

}  // namespace test_train_tied_embeddings
