// The trainer with tied embeddings (llama_config::tie_word_embeddings): the
// gradient norm it reports is the float64 norm of the flat gradient, which
// holds the tied tensor once (a norm that counted the embedding and the
// head apart would differ by a margin the test checks is wide); dp 2 under
// ZeRO 0 to 3 (the head reads and adds to the embedding's segment, which
// ZeRO-2 and 3 keep apart), tp 2 and dp 2 x tp 2 give the single-rank run
// (float64 1e-10: loss, norm, every gradient before clipping, the
// parameters; tests/train/pp_suite.hpp). Under a pipeline the first stage
// holds the embedding and the last a copy whose gradients are summed over
// the embedding group and counted once in the norm: pp 2 and 4 under every
// schedule, interleaved, (2, 1, 2) and (2, 2, 2) under ZeRO 0 to 3 give the
// single-rank run (1e-10; a norm that counted the copy would miss by far
// more), and the copy holds the embedding's bits after the steps. A
// checkpoint stores the tied tensor once ("embedding", no "lm_head") and
// loads on another layout (tests/train/reshard_suite.hpp), and an untied
// model refuses it.
#include <catch2/catch.hpp>

#include <omp.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <utility>
#include <vector>

#include <tessera/comm/local.hpp>

#include "pp_suite.hpp"
#include "reshard_suite.hpp"
#include "trainer_suite.hpp"

namespace test_train_tied_embeddings {

using namespace tessera;
using comm::local_communicator;
using comm::local_world;
using parallel::schedule_kind;
namespace fs = std::filesystem;

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

TEST_CASE("tied trainer: pp 2 and 4 under every schedule equal one rank (float64)",
          "[train][tied][pp]") {
  using P = precision::fp64;
  using Z0 = parallel::zero<0>;
  for (schedule_kind s :
       {schedule_kind::gpipe, schedule_kind::one_f_one_b, schedule_kind::zero_bubble_h1}) {
    check_mesh<P, Z0>(tied_mesh(1, 1, 2, s, 8), 1e-10);
    check_mesh<P, Z0>(tied_mesh(1, 1, 4, s, 8), 1e-10);
  }
  auto v2 = tied_mesh(1, 1, 2, schedule_kind::interleaved, 8);
  v2.virtual_stages = 2;
  check_mesh<P, Z0>(v2, 1e-10);
  auto v2k4 = tied_mesh(1, 1, 4, schedule_kind::interleaved, 8);
  v2k4.virtual_stages = 2;
  v2k4.layers = 8;
  check_mesh<P, Z0>(v2k4, 1e-10);
}

TEST_CASE("tied trainer: (dp, tp, pp) = (2, 1, 2) and (2, 2, 2) under ZeRO 0 to 3 (float64)",
          "[train][tied][pp][tp]") {
  using P = precision::fp64;
  check_mesh<P, parallel::zero<0>>(tied_mesh(2, 1, 2), 1e-10);
  check_mesh<P, parallel::zero<1>>(tied_mesh(2, 1, 2, schedule_kind::zero_bubble_h1), 1e-10);
  check_mesh<P, parallel::zero<2>>(tied_mesh(2, 1, 2, schedule_kind::gpipe), 1e-10);
  check_mesh<P, parallel::zero<3>>(tied_mesh(2, 1, 2), 1e-10);
  check_mesh<P, parallel::zero<0>>(tied_mesh(2, 2, 2), 1e-10);
  check_mesh<P, parallel::zero<1>>(tied_mesh(2, 2, 2), 1e-10);
  check_mesh<P, parallel::zero<2>>(tied_mesh(2, 2, 2, schedule_kind::zero_bubble_h1), 1e-10);
  check_mesh<P, parallel::zero<3>>(tied_mesh(2, 2, 2), 1e-10);
  auto sp = tied_mesh(1, 2, 2, schedule_kind::one_f_one_b, 8);
  sp.sequence_parallel = true;
  check_mesh<P, parallel::zero<1>>(sp, 1e-10);
}

TEST_CASE("tied trainer: float32 and bf16 under a pipeline keep the copy equal",
          "[train][tied][pp]") {
  // The copy's bits (pp_suite::check_mesh) whatever the rounding: both
  // stages update one summed gradient alike.
  check_mesh<precision::fp32, parallel::zero<1>>(tied_mesh(2, 1, 2), 1e-5);
  check_mesh<precision::bf16_mixed, parallel::zero<1>>(tied_mesh(1, 1, 2), 2e-2, 2);
}

TEST_CASE("tied trainer: the pipeline's norm counts the tied tensor once", "[train][tied][pp]") {
  // One rank's norm is the flat gradient's (the first test case); pp 2
  // reports it to 1e-10 (check_mesh). Counting the last stage's copy too
  // would report sqrt(norm^2 + |g_embedding|^2): here the margin by which
  // it would miss, far beyond the tolerance.
  using P = precision::fp64;
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("tiedpp", 0)};
  data::token_file f(corpus.path);
  const auto l = tied_mesh(1, 1, 2, schedule_kind::one_f_one_b, 8);
  const pp_suite::reference ref = pp_suite::single_rank<P>(f, 2, 8, 4, true);
  const auto& emb = ref.layout.at("embedding");
  std::vector<double> reported(2);
  REQUIRE_NOTHROW(local_world::run(
      2,
      [&](local_communicator& world) {
        omp_set_num_threads(1);
        auto g = comm::make_groups(world, comm::device_mesh(1, 1, 2));
        train::trainer<P, host, optim::adamw, parallel::zero<0>, local_communicator> tr(
            pp_suite::model(4, true), pp_suite::config(l, 2), f,
            parallel::layout{g.dp, nn::dense_layers{}, g.pp});
        zero_suite::check(tr.all_chunks().tied_group() != nullptr, "no embedding group");
        for (int s = 0; s < 2; ++s) {
          const double n = tr.train_step().grad_norm;
          if (world.rank() == 0) reported[static_cast<std::size_t>(s)] = n;
        }
      },
      test_options()));
  for (std::size_t s = 0; s < 2; ++s) {
    double e2 = 0;
    for (std::int64_t j = 0; j < emb.numel; ++j)
      e2 += ref.grads[s][static_cast<std::size_t>(emb.offset + j)] *
            ref.grads[s][static_cast<std::size_t>(emb.offset + j)];
    const double twice = std::sqrt(ref.norm[s] * ref.norm[s] + e2);
    INFO("step " << s + 1 << ": pp 2 reports " << reported[s] << ", one rank " << ref.norm[s]
                 << ", counted twice " << twice);
    CHECK(std::fabs(reported[s] - ref.norm[s]) <= 1e-10 * ref.norm[s]);
    CHECK(twice - ref.norm[s] > 1e-3 * ref.norm[s]);
  }
}

TEST_CASE("tied checkpoints: the tensor stored once, loaded on other layouts",
          "[train][tied][ckpt]") {
  using reshard_suite::mesh;
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("tiedck", 0)};
  data::token_file f(corpus.path);
  const pp_suite::reference ref = reshard_suite::single_rank(f, true);
  auto tied = [](reshard_suite::mesh_run m) {
    m.l.tied = true;
    return m;
  };
  const std::pair<reshard_suite::mesh_run, reshard_suite::mesh_run> pairs[] = {
      {tied(mesh(1, 1, 2, 0)), tied(mesh(1, 1, 1, 0))},
      {tied(mesh(1, 1, 1, 0)), tied(mesh(1, 1, 4, 0, schedule_kind::interleaved, 2))},
      {tied(mesh(2, 2, 2, 1)), tied(mesh(1, 1, 2, 0))},
      {tied(mesh(1, 1, 4, 0, schedule_kind::interleaved, 2)), tied(mesh(2, 2, 2, 3))},
      {tied(mesh(2, 1, 2, 3, schedule_kind::zero_bubble_h1)), tied(mesh(4, 1, 1, 2))}};
  for (const auto& pair : pairs) {
    const reshard_suite::mesh_run& a = pair.first;
    const reshard_suite::mesh_run& b = pair.second;
    INFO("saved at " << a.name() << ", loaded at " << b.name());
    REQUIRE_NOTHROW(local_world::run(
        std::max(a.ranks(), b.ranks()),
        [&](local_communicator& world) {
          omp_set_num_threads(1);
          reshard_suite::check_pair(world, a, b, f, ref);
        },
        test_options()));
  }
  // The folder holds "embedding" and no "lm_head"; an untied model refuses it.
  const fs::path dir =
      fs::temp_directory_path() / ("tessera_tied_ck_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  REQUIRE_NOTHROW(local_world::run(
      2,
      [&](local_communicator& world) {
        omp_set_num_threads(1);
        auto g = comm::make_groups(world, comm::device_mesh(1, 1, 2));
        auto l = tied_mesh(1, 1, 2, schedule_kind::one_f_one_b, 8);
        l.layers = reshard_suite::layers;
        train::trainer<precision::fp64, host, optim::adamw, parallel::zero<0>, local_communicator>
            tr(reshard_suite::model(true), pp_suite::config(l, 2), f,
               parallel::layout{g.dp, nn::dense_layers{}, g.pp});
        tr.train_step();
        tr.save_checkpoint(dir);
      },
      test_options()));
  {
    train::checkpoint_reader rd(dir);
    CHECK(rd.index().tensors.count("embedding") == 1);
    CHECK(rd.index().tensors.count("lm_head") == 0);
  }
  pp_suite::layout one;
  one.micro_batches = 8;
  one.layers = reshard_suite::layers;
  train::trainer<precision::fp64> untied(reshard_suite::model(false), pp_suite::config(one, 2), f);
  CHECK_THROWS_WITH(untied.load_checkpoint(dir), Catch::Contains("\"tie_word_embeddings\":true"));
  fs::remove_all(dir);
}

}  // namespace test_train_tied_embeddings
