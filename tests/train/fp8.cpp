// Tests precision::fp8_mixed in the trainer (nn/fp8_linear.hpp,
// train/step.hpp, train/trainer.hpp):
//   - tp 2, with and without sequence parallelism, trains as one rank does
//     under delayed and current scaling (the scales agree: the sharded
//     operands' amaxes are reduced with max over tp);
//   - dp 2 under delayed scaling trains as one rank does, its replicas'
//     scales bit for bit equal (the step amaxes reduced over dp); ZeRO-1,
//     2 and 3 give ZeRO-0's losses and scales bit for bit (ZeRO-3 casts
//     the gathered weight);
//   - a resume through a checkpoint folder continues bit for bit with the
//     scales and amax histories restored, and a pp 2 checkpoint (each
//     stage holding half the blocks) holds every block's state and loads
//     on one rank;
//   - FP8 settings under a policy without FP8 are refused, naming them.
#include <catch2/catch.hpp>

#include <omp.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <vector>

#include <tessera/comm/device_mesh.hpp>
#include <tessera/comm/local.hpp>
#include <tessera/nn/tensor_parallel.hpp>

#include "pp_suite.hpp"

namespace test_train_fp8 {

using namespace tessera;
namespace fs = std::filesystem;
using P8 = precision::fp8_mixed;
using Comm = comm::local_communicator;
using L = nn::tensor_parallel_layers<Comm>;

namespace {

struct run_record {
  std::vector<double> loss, grad_norm;
  nlohmann::json fp8_1, fp8;  // the FP8 states after the first and the last step
};

train::train_config fp8_config(const pp_suite::layout& l, std::int64_t steps,
                               precision::fp8_scaling scaling) {
  train::train_config c = pp_suite::config(l, steps);
  c.fp8.scaling = scaling;
  c.fp8.history = 4;
  return c;
}

template <class Trainer>
run_record record(Trainer& tr, std::int64_t steps) {
  run_record r;
  for (std::int64_t s = 0; s < steps; ++s) {
    const auto m = tr.train_step();
    r.loss.push_back(m.loss);
    r.grad_norm.push_back(m.grad_norm);
    if (s == 0) r.fp8_1 = tr.model().fp8_state();
  }
  r.fp8 = tr.model().fp8_state();
  return r;
}

run_record single_rank(const data::token_file& f, std::int64_t steps,
                       precision::fp8_scaling scaling, std::int64_t M) {
  pp_suite::layout one;
  one.micro_batches = M;
  train::trainer<P8> tr(pp_suite::model(), fp8_config(one, steps, scaling), f);
  return record(tr, steps);
}

// Largest |a - b| / |b| over the scales of every linear of two fp8_state()s.
double scale_rel(const nlohmann::json& a, const nlohmann::json& b) {
  double worst = 0;
  for (const auto& [name, lin] : b.items())
    for (const char* op : {"x", "w", "dy"}) {
      const double x = a.at(name).at(op).at("scale").get<double>(),
                   y = lin.at(op).at("scale").get<double>();
      worst = std::max(worst, std::fabs(x - y) / y);
    }
  return worst;
}

comm::comm_options slow() {
  comm::comm_options o;
  o.timeout = std::chrono::seconds(120);
  return o;
}

}  // namespace

TEST_CASE("fp8_mixed on tp 2, with and without sequence parallelism, trains as one rank",
          "[train][fp8][tp]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("fp8_tp", 0)};
  data::token_file f(corpus.path);
  constexpr std::int64_t steps = 3, M = 4;
  for (auto scaling : {precision::fp8_scaling::delayed, precision::fp8_scaling::current}) {
    const run_record ref = single_rank(f, steps, scaling, M);
    for (bool sp : {false, true}) {
      INFO(precision::to_string(scaling) << (sp ? " with" : " without") << " sequence parallelism");
      std::vector<run_record> got(2);
      comm::local_world::run(
          2,
          [&](Comm& world) {
            omp_set_num_threads(1);
            auto g = comm::make_groups(world, comm::device_mesh(1, 2, 1));
            pp_suite::layout l;
            l.tp = 2;
            l.micro_batches = M;
            l.sequence_parallel = sp;
            train::trainer<P8, host, optim::adamw, parallel::zero<0>, Comm, L> tr(
                pp_suite::model(), fp8_config(l, steps, scaling), f,
                parallel::layout{g.dp, L{&g.tp}, g.pp});
            got[static_cast<std::size_t>(world.rank())] = record(tr, steps);
          },
          slow());
      // Not bit for bit: the row-parallel layers' partial sums are added
      // over tp in another order than one rank's GEMM sums them, so a
      // bf16 output moves by an ulp here and there and an FP8 cast
      // downstream (3 mantissa bits) can round the other way; and with
      // tp > nkv each replica of a key/value head casts its own part of
      // dk and dv before they are summed (one rank casts the sum).
      // Measured: the losses agree to 2e-5 relative; after step 1 the
      // scales (each the amax of one element) to 2.2e-3 under delayed and
      // 1.4e-2 under current scaling (its scales are the last use's, a
      // gradient's, where the key/value replicas' parts count), after three
      // AdamW steps, whose updates move the weights apart, to a few percent.
      for (std::size_t s = 0; s < static_cast<std::size_t>(steps); ++s) {
        INFO("step " << s + 1);
        CHECK(got[0].loss[s] == Approx(ref.loss[s]).epsilon(2e-4));
        CHECK(got[0].grad_norm[s] == Approx(ref.grad_norm[s]).epsilon(2e-2));
        CHECK(std::memcmp(&got[0].loss[s], &got[1].loss[s], sizeof(double)) == 0);
      }
      CHECK(got[0].fp8 == got[1].fp8);  // the tp ranks keep equal scales
      CHECK(scale_rel(got[0].fp8_1, ref.fp8_1) <= 3e-2);
      CHECK(scale_rel(got[0].fp8, ref.fp8) <= 0.3);
    }
  }
}

namespace {

// dp 2 under ZeRO stage Z, delayed scaling: both ranks' records.
template <int Z>
std::vector<run_record> dp2_zero(const data::token_file& f, std::int64_t steps, std::int64_t M) {
  std::vector<run_record> got(2);
  comm::local_world::run(
      2,
      [&](Comm& world) {
        omp_set_num_threads(1);
        auto g = comm::make_groups(world, comm::device_mesh(2, 1, 1));
        pp_suite::layout l;
        l.dp = 2;
        l.micro_batches = M;
        train::trainer<P8, host, optim::adamw, parallel::zero<Z>, Comm, L> tr(
            pp_suite::model(), fp8_config(l, steps, precision::fp8_scaling::delayed), f,
            parallel::layout{g.dp, L{&g.tp}, g.pp});
        got[static_cast<std::size_t>(world.rank())] = record(tr, steps);
      },
      slow());
  return got;
}

}  // namespace

TEST_CASE("fp8_mixed on dp 2 under delayed scaling trains as one rank, replicas equal",
          "[train][fp8][dp]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("fp8_dp", 0)};
  data::token_file f(corpus.path);
  constexpr std::int64_t steps = 3, M = 4;
  const run_record ref = single_rank(f, steps, precision::fp8_scaling::delayed, 2 * M);
  const std::vector<run_record> got = dp2_zero<0>(f, steps, M);
  // The first step's scales are 1 on both layouts and its amaxes are the
  // maxima over the same micro-batches: its loss is the one-rank loss up to
  // the loss sum's order; later steps differ by the dp gradient sum's
  // rounding only (float32, 1e-6), through the FP8 casts. (Measured with
  // one OpenMP thread: the same bits, losses and scales.)
  CHECK(got[0].loss[0] == Approx(ref.loss[0]).epsilon(1e-6));
  for (std::size_t s = 0; s < static_cast<std::size_t>(steps); ++s) {
    INFO("step " << s + 1);
    CHECK(got[0].loss[s] == Approx(ref.loss[s]).epsilon(2e-4));
    CHECK(got[0].grad_norm[s] == Approx(ref.grad_norm[s]).epsilon(2e-2));
  }
  CHECK(got[0].fp8 == got[1].fp8);  // bit for bit: the step amaxes reduced over dp
  CHECK(scale_rel(got[0].fp8_1, ref.fp8_1) <= 1e-2);
  CHECK(scale_rel(got[0].fp8, ref.fp8) <= 0.3);
  // After step 1 the histories hold the one-rank amaxes of step 1 exactly.
  for (const auto& [name, lin] : ref.fp8.items())
    for (const char* op : {"x", "w", "dy"}) {
      INFO(name << " " << op);
      const auto h = lin[op]["amax_history"], d = got[0].fp8[name][op]["amax_history"];
      REQUIRE(h.size() == 4);
      CHECK(h[1] == d[1]);  // oldest first: [0] unused, [1] step 1
    }
}

TEST_CASE("fp8_mixed under ZeRO-1, 2 and 3 trains as ZeRO-0 does",
          "[train][fp8][dp][zero]") {
  // Under ZeRO-3 each layer casts the gathered weight (the whole bf16 tensor,
  // bit-equal to the replicated one), so its amax and scale are the
  // replicated weight's; the two-rank gradient sums are a + b in either
  // order. So every stage gives ZeRO-0's losses and FP8 states bit for bit,
  // and its gradient norms to float64 rounding (ZeRO-3 sums the squares of
  // each rank's shard first, another order).
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("fp8_zero", 0)};
  data::token_file f(corpus.path);
  constexpr std::int64_t steps = 3, M = 2;
  const std::vector<run_record> z0 = dp2_zero<0>(f, steps, M);
  auto same = [&](const std::vector<run_record>& z, int stage) {
    INFO("ZeRO-" << stage);
    for (std::size_t r = 0; r < 2; ++r) {
      CHECK(z[r].loss == z0[r].loss);
      for (std::size_t k = 0; k < z0[r].grad_norm.size(); ++k)
        CHECK(z[r].grad_norm[k] == Approx(z0[r].grad_norm[k]).epsilon(1e-14));
      CHECK(z[r].fp8 == z0[r].fp8);
    }
  };
  same(dp2_zero<1>(f, steps, M), 1);
  same(dp2_zero<2>(f, steps, M), 2);
  same(dp2_zero<3>(f, steps, M), 3);
}

TEST_CASE("an fp8_mixed resume continues bit for bit with its scales and histories",
          "[train][fp8][checkpoint]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("fp8_resume", 0)};
  data::token_file f(corpus.path);
  const fs::path dir =
      fs::temp_directory_path() / ("tessera_fp8_resume_" + std::to_string(::getpid()));
  constexpr int steps = 6, saved_at = 3;
  pp_suite::layout one;
  one.micro_batches = 2;
  for (auto scaling : {precision::fp8_scaling::delayed, precision::fp8_scaling::current}) {
    INFO(precision::to_string(scaling));
    fs::remove_all(dir);
    const train::train_config c = fp8_config(one, steps, scaling);
    std::vector<train::step_metrics> whole;
    nlohmann::json end_state;
    {
      train::trainer<P8> tr(pp_suite::model(), c, f);
      for (int s = 0; s < steps; ++s) whole.push_back(tr.train_step());
      end_state = tr.model().fp8_state();
    }
    nlohmann::json saved_state;
    {
      train::trainer<P8> tr(pp_suite::model(), c, f);
      for (int s = 0; s < saved_at; ++s) tr.train_step();
      saved_state = tr.model().fp8_state();
      tr.save_checkpoint(dir);
    }
    train::trainer<P8> tr(pp_suite::model(), c, f);
    CHECK(tr.model().fp8_state() != saved_state);  // fresh scales before the load
    tr.load_checkpoint(dir);
    CHECK(tr.model().fp8_state() == saved_state);
    for (int s = saved_at; s < steps; ++s) {
      INFO("step " << s + 1);
      const auto m = tr.train_step();
      const auto& w = whole[static_cast<std::size_t>(s)];
      CHECK(std::memcmp(&m.loss, &w.loss, sizeof m.loss) == 0);
      CHECK(std::memcmp(&m.grad_norm, &w.grad_norm, sizeof m.grad_norm) == 0);
    }
    CHECK(tr.model().fp8_state() == end_state);
    // Another recipe is refused at the load, naming it.
    train::train_config other = c;
    other.fp8.margin = 1;
    train::trainer<P8> tr2(pp_suite::model(), other, f);
    CHECK_THROWS_WITH(tr2.load_checkpoint(dir), Catch::Contains("fp8"));
  }
  fs::remove_all(dir);
}

TEST_CASE("a pp 2 fp8_mixed checkpoint holds every block's FP8 state and loads on one rank",
          "[train][fp8][checkpoint][pp]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("fp8_pp", 0)};
  data::token_file f(corpus.path);
  const fs::path dir = fs::temp_directory_path() / ("tessera_fp8_pp_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  constexpr int steps = 4;
  pp_suite::layout l;
  l.pp = 2;
  l.micro_batches = 2;
  std::vector<nlohmann::json> stage_state(2);
  comm::local_world::run(
      2,
      [&](Comm& world) {
        omp_set_num_threads(1);
        auto g = comm::make_groups(world, comm::device_mesh(1, 1, 2));
        train::trainer<P8, host, optim::adamw, parallel::zero<0>, Comm, L> tr(
            pp_suite::model(), fp8_config(l, steps, precision::fp8_scaling::delayed), f,
            parallel::layout{g.dp, L{&g.tp}, g.pp});
        for (int s = 0; s < 2; ++s) tr.train_step();
        stage_state[static_cast<std::size_t>(tr.pp_rank())] = tr.model().fp8_state();
        tr.save_checkpoint(dir);
      },
      slow());
  nlohmann::json all = stage_state[0];
  for (const auto& [k, v] : stage_state[1].items()) all[k] = v;
  // Each stage holds only its blocks (balanced by FLOPs: the head's stage fewer).
  REQUIRE(stage_state[0].size() > 0);
  REQUIRE(stage_state[1].size() > 0);
  REQUIRE(all.size() == 4 * nn::block_linears);
  nlohmann::json meta;
  std::ifstream(dir / "metadata.json") >> meta;
  const nlohmann::json& run = meta.contains("run") ? meta["run"] : meta;
  REQUIRE(run.contains("fp8_state"));
  CHECK(run["fp8_state"] == all);
  pp_suite::layout one;
  one.micro_batches = 2;
  train::trainer<P8> tr(pp_suite::model(), fp8_config(one, steps, precision::fp8_scaling::delayed),
                        f);
  tr.load_checkpoint(dir);
  CHECK(tr.model().fp8_state() == all);
  CHECK(std::isfinite(tr.train_step().loss));
  fs::remove_all(dir);
}

TEST_CASE("FP8 settings under a policy without FP8 are refused, naming them", "[train][fp8]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("fp8_refused", 0)};
  data::token_file f(corpus.path);
  pp_suite::layout one;
  train::train_config c = pp_suite::config(one, 2);
  c.fp8.scaling = precision::fp8_scaling::current;
  CHECK_THROWS_WITH((train::trainer<precision::bf16_mixed>(pp_suite::model(), c, f)),
                    Catch::Contains("FP8 settings") && Catch::Contains("current") &&
                        Catch::Contains("bf16_mixed"));
  c.fp8 = {};
  c.fp8.history = 0;
  CHECK_THROWS_WITH((train::trainer<P8>(pp_suite::model(), c, f)),
                    Catch::Contains("amax history 0"));
}

}  // namespace test_train_fp8
