// Tests fp16_mixed's loss scale in the trainer (precision/loss_scaler.hpp,
// train/step.hpp):
//   - the gradients are unscaled exactly once: under static scales from 1
//     to 2^16 the gradient norm and one SGD step's loss decrease equal the
//     float32 run's (a missing unscale makes them S times too large, a
//     second one S times too small);
//   - an overflow injected on one rank of a (2, 2, 2) mesh (an infinity
//     written into one fp16 weight) makes every rank skip that step and
//     halve the scale, the same decision on every rank, and the scale grows
//     back after the window; the data-parallel replicas stay equal;
//   - a resume continues with the same scale and the same losses bit for
//     bit, through steps with overflows;
//   - loss-scale settings under a policy without a loss scale, and a resume
//     with other loss-scale settings, are refused naming them.
#include <catch2/catch.hpp>

#include <omp.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include <tessera/comm/device_mesh.hpp>
#include <tessera/comm/local.hpp>
#include <tessera/nn/tensor_parallel.hpp>
#include <tessera/optim/sgd.hpp>

#include "pp_suite.hpp"

namespace test_train_loss_scale {

using namespace tessera;
namespace fs = std::filesystem;
using P16 = precision::fp16_mixed;

namespace {
// One rank's run: M micro-batches of one sequence per step.
train::train_config one_rank(std::int64_t steps) {
  pp_suite::layout one;
  one.micro_batches = 8;
  return pp_suite::config(one, steps);
}
}  // namespace

TEST_CASE("fp16_mixed unscales the gradients exactly once, at every loss scale",
          "[train][fp16]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("fp16_once", 0)};
  data::token_file f(corpus.path);
  train::train_config cfg = one_rank(2);
  cfg.warmup = 0;
  cfg.grad_clip = 0;  // a clip would hide a wrong scale in the update
  cfg.lr = 0.5;
  cfg.min_lr_ratio = 1;
  cfg.sgd.momentum = 0;  // plain SGD: the update is proportional to the gradient
  cfg.sgd.weight_decay = 0;
  train::trainer<precision::fp32, host, optim::sgd> ref(pp_suite::model(), cfg, f);
  const auto r1 = ref.train_step(), r2 = ref.train_step();
  const double ref_drop = r1.loss - r2.loss;
  REQUIRE(ref_drop > 0.05);  // one step moves the loss clearly
  for (double S : {1.0, 256.0, 65536.0}) {
    INFO("static loss scale " << S);
    train::train_config c = cfg;
    c.loss_scale.dynamic = false;
    c.loss_scale.initial = S;
    c.loss_scale.min_scale = 1;
    train::trainer<P16, host, optim::sgd> tr(pp_suite::model(), c, f);
    const auto m1 = tr.train_step(), m2 = tr.train_step();
    CHECK(m1.loss_scale == S);
    CHECK(!m1.skipped);
    CHECK(m1.grad_norm == Approx(r1.grad_norm).epsilon(2e-2));
    CHECK(m1.loss - m2.loss == Approx(ref_drop).epsilon(5e-2));
    CHECK(m1.loss == Approx(r1.loss).epsilon(1e-3));
  }
}

TEST_CASE("an overflow on one rank of (2, 2, 2) skips the step on every rank and backs off",
          "[train][fp16][threads]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("fp16_mesh", 0)};
  data::token_file f(corpus.path);
  using Comm = comm::local_communicator;
  using L = nn::tensor_parallel_layers<Comm>;
  pp_suite::layout cube;
  cube.dp = cube.tp = cube.pp = 2;
  cube.micro_batches = 4;
  constexpr int steps = 6, poked_step = 2;  // the overflow is injected into step 2 (1-based)
  for (int poked : {1, 6}) {
    INFO("infinity written into a weight of world rank " << poked);
    // Per rank: (skipped, scale, skipped so far, loss) of each step; the
    // final parameters keyed by (tp rank, stage) for each dp rank.
    std::vector<std::vector<std::tuple<bool, double, std::int64_t, double>>> seen(8);
    std::map<std::pair<int, int>, std::array<std::vector<std::uint16_t>, 2>> params;
    std::mutex mu;
    comm::comm_options o;
    o.timeout = std::chrono::seconds(120);
    comm::local_world::run(
        8,
        [&](Comm& world) {
          omp_set_num_threads(1);
          auto g = comm::make_groups(world, comm::device_mesh(2, 2, 2));
          train::train_config c = pp_suite::config(cube, steps);
          c.loss_scale.initial = 1024;
          c.loss_scale.hysteresis = 1;
          c.loss_scale.growth_interval = 2;
          train::trainer<P16, host, optim::adamw, parallel::zero<1>, Comm, L> tr(
              pp_suite::model(), c, f, parallel::layout{g.dp, L{&g.tp}, g.pp});
          auto& m = tr.model();
          fp16* last = m.params() + (m.flat_size() - 1);
          const fp16 kept = *last;
          for (int s = 1; s <= steps; ++s) {
            const bool poke = s == poked_step && world.rank() == poked;
            if (poke) *last = fp16(INFINITY);
            const auto r = tr.train_step();
            // The skipped step wrote no parameter, but ZeRO gathered the
            // poked shard to its replicas: every rank puts the weight back.
            if (s == poked_step) *last = kept;
            seen[static_cast<std::size_t>(world.rank())].emplace_back(r.skipped, r.loss_scale,
                                                                      r.skipped_steps, r.loss);
          }
          std::vector<std::uint16_t> bits(static_cast<std::size_t>(m.flat_size()));
          std::memcpy(bits.data(), m.params(), bits.size() * sizeof(std::uint16_t));
          std::lock_guard<std::mutex> lock(mu);
          params[{tr.layout().tp_rank(), tr.layout().stage()}]
                [static_cast<std::size_t>(tr.layout().dp_rank())] = std::move(bits);
        },
        o);
    for (int r = 0; r < 8; ++r) {
      INFO("world rank " << r);
      const auto& v = seen[static_cast<std::size_t>(r)];
      REQUIRE(v.size() == static_cast<std::size_t>(steps));
      for (int s = 1; s <= steps; ++s) {
        INFO("step " << s);
        const auto& [skipped, scale, skipped_so_far, loss] = v[static_cast<std::size_t>(s - 1)];
        CHECK(skipped == (s == poked_step));
        // 1024 until the overflow, 512 for the two clean steps after it,
        // then grown back by the window of 2.
        CHECK(scale == (s <= poked_step ? 1024 : s <= poked_step + 2 ? 512 : 1024));
        CHECK(skipped_so_far == (s >= poked_step ? 1 : 0));
        // The same decision and the same global figures on every rank.
        CHECK(std::get<1>(seen[0][static_cast<std::size_t>(s - 1)]) == scale);
        if (!skipped) CHECK(std::isfinite(loss));
        CHECK(std::memcmp(&std::get<3>(seen[0][static_cast<std::size_t>(s - 1)]), &loss,
                          sizeof loss) == 0);
      }
    }
    REQUIRE(params.size() == 4);
    for (const auto& [where, replicas] : params) {
      INFO("tp rank " << where.first << " stage " << where.second);
      CHECK(replicas[0] == replicas[1]);  // the dp replicas did not diverge
    }
  }
}

TEST_CASE("a resume continues with the same loss scale and the same losses, bit for bit",
          "[train][fp16][checkpoint]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("fp16_resume", 0)};
  data::token_file f(corpus.path);
  const fs::path dir =
      fs::temp_directory_path() / ("tessera_fp16_resume_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  constexpr int steps = 10, saved_at = 5;
  train::train_config c = one_rank(steps);
  // A scale far too large for fp16 gradients: overflows, backoffs and
  // growths all happen in the first steps.
  c.loss_scale.initial = std::ldexp(1.0, 30);
  c.loss_scale.hysteresis = 2;
  c.loss_scale.growth_interval = 2;
  std::vector<train::step_metrics> whole;
  {
    train::trainer<P16> tr(pp_suite::model(), c, f);
    for (int s = 0; s < steps; ++s) whole.push_back(tr.train_step());
  }
  std::int64_t overflows = 0;
  for (const auto& m : whole) overflows += m.skipped;
  REQUIRE(overflows >= 2);
  REQUIRE(whole[saved_at - 1].skipped_steps < overflows);  // overflows on both sides of the save
  nlohmann::json saved_state;
  {
    train::trainer<P16> tr(pp_suite::model(), c, f);
    for (int s = 0; s < saved_at; ++s) tr.train_step();
    saved_state = tr.loss_scaler()->state();
    tr.save_checkpoint(dir);
  }
  train::trainer<P16> tr(pp_suite::model(), c, f);
  tr.load_checkpoint(dir);
  CHECK(tr.loss_scaler()->state() == saved_state);
  for (int s = saved_at; s < steps; ++s) {
    INFO("step " << s + 1);
    const auto m = tr.train_step();
    const auto& w = whole[static_cast<std::size_t>(s)];
    CHECK(std::memcmp(&m.loss, &w.loss, sizeof m.loss) == 0);
    CHECK(std::memcmp(&m.grad_norm, &w.grad_norm, sizeof m.grad_norm) == 0);
    CHECK(m.loss_scale == w.loss_scale);
    CHECK(m.skipped == w.skipped);
    CHECK(m.skipped_steps == w.skipped_steps);
    const auto j = m.to_json();  // the metrics line carries the scale and the skipped steps
    CHECK(j.at("loss_scale") == m.loss_scale);
    CHECK(j.at("skipped_steps") == m.skipped_steps);
  }
  // Other loss-scale settings are refused, naming them.
  train::train_config other = c;
  other.loss_scale.growth_interval = 3;
  train::trainer<P16> changed(pp_suite::model(), other, f);
  REQUIRE_THROWS_AS(changed.load_checkpoint(dir), config_error);
  REQUIRE_THROWS_WITH(changed.load_checkpoint(dir), Catch::Contains("loss_scale=") &&
                                                        Catch::Contains("\"growth_interval\":3"));
  fs::remove_all(dir);
}

TEST_CASE("loss-scale settings under a policy without a loss scale are refused",
          "[train][fp16][errors]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("fp16_refuse", 0)};
  data::token_file f(corpus.path);
  train::train_config c = one_rank(2);
  c.loss_scale.initial = 128;
  using T = train::trainer<precision::bf16_mixed>;
  REQUIRE_THROWS_AS(T(pp_suite::model(), c, f), config_error);
  REQUIRE_THROWS_WITH(T(pp_suite::model(), c, f),
                      Catch::Contains("under precision bf16_mixed, which trains without a loss "
                                      "scale"));
  c.loss_scale = {};
  T ok(pp_suite::model(), c, f);
  CHECK(ok.loss_scaler() == nullptr);
  CHECK(ok.train_step().loss_scale == 0);
}

}  // namespace test_train_loss_scale
