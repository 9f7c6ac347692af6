// Tests include/tessera/train/inference.hpp: evaluate is the mean loss over
// every scored token of the validation windows (held to the model's own
// per-batch forward_loss, float64), the same over 2 dp ranks and through a
// 2-stage pipeline (1e-12), and generate samples the same tokens on every
// rank, deterministic in its seed.
#include <catch2/catch.hpp>

#include <cmath>
#include <mutex>
#include <string>
#include <vector>

#include "pp_suite.hpp"
#include "tessera/comm/local.hpp"
#include "tessera/train/inference.hpp"

namespace test_train_inference {

using namespace tessera;

TEST_CASE("evaluate: the mean loss over the windows, on one rank, over dp and through a pipeline",
          "[train][inference]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("inference", 0)};
  const data::token_file f(corpus.path);
  pp_suite::layout one;
  one.micro_batches = 4;
  auto cfg = pp_suite::config(one, 2);
  cfg.micro_batch = 2;
  cfg.global_batch = 4;
  cfg.eval_windows = 5;  // two full batches of B = 2 and a last one of 1
  train::trainer<precision::fp64> tr(pp_suite::model(), cfg, f);
  tr.train_step();
  // The reference: the model's own loss sums over the same batches.
  const data::val_windows val(f, f.split().val, cfg.seq, 5);
  std::vector<std::int32_t> buf(static_cast<std::size_t>(2 * (cfg.seq + 1)));
  double sum = 0, scored = 0;
  for (std::int64_t b = 0; b < val.batches(2); ++b) {
    const std::int64_t rows = val.fill(b, 2, buf.data());
    const nn::loss_sum r = tr.model().forward_loss(buf.data(), rows, cfg.seq);
    sum += r.sum;
    scored += static_cast<double>(r.scored);
  }
  const double want = sum / scored;
  CHECK(tr.evaluate() == want);  // the same forwards, summed in the same order
  const std::vector<std::int32_t> prompt{84, 104, 101};
  const auto sample = tr.generate(prompt, 16, 0.8, 7);
  CHECK(sample.size() == 19);
  CHECK(tr.generate(prompt, 16, 0.8, 7) == sample);  // deterministic in the seed
  // Two dp ranks and two pipeline stages (threads), after the same step.
  std::mutex mu;
  std::vector<std::string> failures;
  for (int pp : {1, 2}) {
    comm::local_world::run(2, [&](comm::local_communicator& world) {
      const int dp = 2 / pp;
      auto g = comm::make_groups(world, comm::device_mesh(dp, 1, pp));
      pp_suite::layout l = one;
      l.dp = dp;
      l.pp = pp;
      auto c = pp_suite::config(l, 2);
      c.micro_batch = 2 / dp;
      c.global_batch = 4;
      c.eval_windows = 5;
      train::trainer<precision::fp64, host, optim::adamw, parallel::zero<0>,
                     comm::local_communicator>
          t(pp_suite::model(), c, f, parallel::layout{g.dp, nn::dense_layers{}, g.pp});
      t.train_step();
      const double e = t.evaluate();
      const auto s = t.generate(prompt, 16, 0.8, 7);
      std::lock_guard lock(mu);
      if (!(std::abs(e - want) <= 1e-12 * want))
        failures.push_back(
            tessera::detail::str("dp ", dp, " pp ", pp, ": evaluate ", e, " vs ", want));
      if (s != sample)
        failures.push_back(tessera::detail::str("dp ", dp, " pp ", pp, ": another sample"));
    });
  }
  for (const auto& m : failures) FAIL_CHECK(m);
  CHECK(failures.empty());
}

}  // namespace test_train_inference
