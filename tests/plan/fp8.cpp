// Tests include/tessera/plan/fp8.hpp: the planner's FP8 figures held to
// what an fp8_mixed run holds.
//   - after one train::trainer<fp8_mixed> step (tiny shapes; tp 1, tp 2
//     with and without sequence parallelism, tp 4 with replicated
//     key/value heads and sequence parallelism), plan_memory's FP8 operand
//     copies equal nn::fp8_workspace_bytes() on every rank, and its FP8
//     state the bytes of the model's fp8_linear_states (each operand's
//     scale and amax history, and each state's own scalars), and its FP8
//     scalars the model's scalars in its memory resource, under delayed and
//     current scaling;
//   - on pp 2, plan_pipeline's per-stage figures equal each stage's;
//   - the state rule counts what nn::fp8_linear_state holds, for any
//     recipe; a policy without FP8 plans nothing; bad sizes are refused.
#include <catch2/catch.hpp>

#include <omp.h>

#include <algorithm>
#include <span>
#include <vector>

#include <tessera/comm/device_mesh.hpp>
#include <tessera/comm/local.hpp>
#include <tessera/nn/tensor_parallel.hpp>
#include <tessera/plan/fp8.hpp>
#include <tessera/plan/memory.hpp>
#include <tessera/plan/pipeline.hpp>

#include "../train/pp_suite.hpp"

namespace test_plan_fp8 {

using namespace tessera;
using P8 = precision::fp8_mixed;
using Comm = comm::local_communicator;
using L = nn::tensor_parallel_layers<Comm>;

namespace {

// Bytes the FP8 states of a model hold on the host: per operand (x, W, dy)
// its float scale and its amax history (fp8_scale::state()), and the
// state's own scalars.
std::uint64_t state_bytes(std::span<const nn::fp8_linear_state> states) {
  std::uint64_t b = 0;
  for (const nn::fp8_linear_state& st : states) {
    b += sizeof st.x.scale() + sizeof st.w.scale() + sizeof st.dy.scale();
    b += sizeof(*st.scalars()) * nn::fp8_linear_scalars;
    for (const precision::fp8_scale* s : {&st.x, &st.w, &st.dy})
      b += sizeof(float) * s->state()["amax_history"].size();
  }
  return b;
}

// What one rank measured after its step, and what the planner says.
struct figures {
  std::size_t before = 0;    // nn::fp8_workspace_bytes() before the first step
  std::size_t operands = 0;  // nn::fp8_workspace_bytes() after it
  std::uint64_t state = 0;   // state_bytes of the rank's model
  std::uint64_t scalars = 0;  // bytes of the model's scalars in its memory resource
  std::int64_t blocks = 0;   // blocks the rank's model holds
  plan::fp8_plan planned{};  // plan_memory's (or plan_pipeline's stage's) fp8
};

train::train_config fp8_config(const pp_suite::layout& l, precision::fp8_scaling scaling) {
  train::train_config c = pp_suite::config(l, 1);
  c.fp8.scaling = scaling;
  c.fp8.history = 8;
  return c;
}

// The planner's micro-batch of `cfg` on tp rank `rank` of `tp` (whole model).
plan::fp8_plan planned(const nn::llama_config& c, const train::train_config& cfg, int tp, int rank,
                       bool sp) {
  plan::activation_options a;
  a.micro_batch = cfg.micro_batch;
  a.seq = cfg.seq;
  a.tp = tp;
  a.sequence_parallel = sp;
  a.model.ce_chunk = cfg.ce_chunk;
  a.model.fp8 = cfg.fp8;  // the recipe the trainer gives the model
  plan::sharding sh;
  sh.tp = tp;
  sh.tp_rank = rank;
  return plan::plan_memory(c, plan::dtype_sizes::of<P8>(), plan::optimizer_spec::adamw(), sh, a)
      .fp8;
}

// One training step of `tr`, measured (on the calling thread: the FP8
// operand copies are per thread).
template <class Trainer>
figures measure(Trainer& tr) {
  figures f;
  f.before = nn::fp8_workspace_bytes();
  tr.train_step();
  f.operands = nn::fp8_workspace_bytes();
  f.state = state_bytes(tr.model().fp8_linear_states());
  f.scalars = sizeof(float) * tr.model().fp8_scalars_to_host().size();
  f.blocks = static_cast<std::int64_t>(tr.model().fp8_linear_states().size()) / nn::block_linears;
  return f;
}

void check(const figures& f) {
  CHECK(f.before == 0);
  CHECK(f.operands > 0);
  CHECK(f.planned.operands == f.operands);  // every byte of x̂, Ŵ, d̂y
  CHECK(f.planned.state == f.state);        // every scale and history, the own scalars
  CHECK(f.planned.scalars == f.scalars);    // the scalars the kernels use
  CHECK(f.planned.blocks == f.blocks);
}

comm::comm_options slow() {
  comm::comm_options o;
  o.timeout = std::chrono::seconds(120);
  return o;
}

}  // namespace

TEST_CASE("planned FP8 operand copies and state equal an fp8_mixed step's, tp 1, 2 and 4",
          "[plan][fp8][tp]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("plan_fp8", 0)};
  data::token_file f(corpus.path);
  const nn::llama_config c = pp_suite::model();  // tiny: H 16, nh 4, nkv 2, F 24; 4 blocks
  for (auto scaling : {precision::fp8_scaling::delayed, precision::fp8_scaling::current}) {
    INFO(precision::to_string(scaling) << " scaling");
    {
      // One rank, the dense layers, on this thread (released first: the
      // copies are grow-only per thread).
      nn::fp8_release_workspace();
      pp_suite::layout one;
      one.micro_batches = 2;
      const train::train_config cfg = fp8_config(one, scaling);
      train::trainer<P8> tr(c, cfg, f);
      figures r = measure(tr);
      r.planned = planned(c, cfg, 1, 0, false);
      INFO("tp 1");
      check(r);
      CHECK(r.blocks == c.n_layers);
      nn::fp8_release_workspace();
    }
    struct setup {
      int tp;
      bool sp;
    };
    for (const setup su : {setup{2, false}, setup{2, true}, setup{4, true}}) {
      INFO("tp " << su.tp << (su.sp ? " sequence-parallel" : ""));
      std::vector<figures> got(static_cast<std::size_t>(su.tp));
      comm::local_world::run(
          su.tp,
          [&](Comm& world) {
            omp_set_num_threads(1);
            auto g = comm::make_groups(world, comm::device_mesh(1, su.tp, 1));
            pp_suite::layout l;
            l.tp = su.tp;
            l.micro_batches = 2;
            l.sequence_parallel = su.sp;
            const train::train_config cfg = fp8_config(l, scaling);
            train::trainer<P8, host, optim::adamw, parallel::zero<0>, Comm, L> tr(
                c, cfg, f, parallel::layout{g.dp, L{&g.tp}, g.pp});
            figures r = measure(tr);
            r.planned = planned(c, cfg, su.tp, g.tp.rank(), su.sp);
            got[static_cast<std::size_t>(world.rank())] = r;
          },
          slow());
      for (std::size_t k = 0; k < got.size(); ++k) {
        INFO("rank " << k);
        check(got[k]);
      }
    }
  }
}

TEST_CASE("planned FP8 figures of each pipeline stage equal the stage's on pp 2",
          "[plan][fp8][pp]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("plan_fp8_pp", 0)};
  data::token_file f(corpus.path);
  const nn::llama_config c = pp_suite::model();
  pp_suite::layout l;
  l.pp = 2;
  l.micro_batches = 2;
  const train::train_config cfg = fp8_config(l, precision::fp8_scaling::delayed);
  std::vector<figures> got(2);
  comm::local_world::run(
      2,
      [&](Comm& world) {
        omp_set_num_threads(1);
        auto g = comm::make_groups(world, comm::device_mesh(1, 1, 2));
        train::trainer<P8, host, optim::adamw, parallel::zero<0>, Comm, L> tr(
            c, cfg, f, parallel::layout{g.dp, L{&g.tp}, g.pp});
        got[static_cast<std::size_t>(tr.pp_rank())] = measure(tr);
      },
      slow());
  plan::pipeline_options p;
  p.pp = 2;
  p.schedule = cfg.pipeline;
  p.micro_batches = l.micro_batches;
  p.act.micro_batch = cfg.micro_batch;
  p.act.seq = cfg.seq;
  p.act.model.ce_chunk = cfg.ce_chunk;
  p.act.model.fp8 = cfg.fp8;
  const plan::pipeline_plan pl =
      plan::plan_pipeline(c, plan::dtype_sizes::of<P8>(), plan::optimizer_spec::adamw(), {0, 1}, p);
  REQUIRE(pl.stages.size() == 2);
  std::int64_t blocks = 0;
  for (std::size_t k = 0; k < 2; ++k) {
    INFO("stage " << k);
    got[k].planned = pl.stages[k].fp8;
    check(got[k]);
    CHECK(got[k].blocks > 0);
    CHECK(pl.stages[k].peak() ==
          pl.stages[k].model_state() + pl.stages[k].gathered + pl.stages[k].reduce_staging +
              pl.stages[k].peak_activation_bytes + got[k].operands + got[k].state +
              got[k].scalars);
    blocks += got[k].blocks;
  }
  CHECK(blocks == c.n_layers);
}

TEST_CASE("the FP8 state rule counts what nn::fp8_linear_state holds", "[plan][fp8]") {
  for (std::int64_t history : {1, 16, 1024})
    for (auto scaling : {precision::fp8_scaling::delayed, precision::fp8_scaling::current}) {
      precision::fp8_recipe r;
      r.scaling = scaling;
      r.history = history;
      INFO(precision::to_string(scaling) << " history " << history);
      std::vector<nn::fp8_linear_state> states;
      const std::int64_t blocks = 3;
      for (std::int64_t i = 0; i < blocks * nn::block_linears; ++i) states.emplace_back(r);
      CHECK(plan::fp8_state_bytes(blocks, r) == state_bytes(states));
      CHECK(plan::fp8_state_bytes(0, r) == 0);
    }
  // Fifteen floats per linear in the context's memory (scale, inverse, step
  // amax, amax and evaluation scale of x, W and dy), on either backend.
  CHECK(plan::fp8_scalar_bytes(2) == 2 * 7 * 15 * sizeof(float));
  CHECK_THROWS_AS(plan::fp8_state_bytes(-1, {}), config_error);
  precision::fp8_recipe bad;
  bad.history = 0;
  CHECK_THROWS_WITH(plan::fp8_state_bytes(1, bad), Catch::Contains("amax history 0"));
}

TEST_CASE("FP8 operand rules: the host's float copies, the GPU's bytes and transposes",
          "[plan][fp8]") {
  const auto c = nn::llama_config::llama2_7b();
  const std::int64_t M = 4096, H = c.dim, F = c.ffn_dim;
  // Independently of the layout: for Llama 2 7B (nh = nkv, Hq = KV = H)
  // the largest input is w_down's (M, F), weight a SwiGLU one (F, H),
  // output gradient gate's or up's (M, F).
  const auto e = plan::fp8_largest_operands(c, M);
  CHECK(e.x == M * F);
  CHECK(e.w == F * H);
  CHECK(e.dy == M * F);
  CHECK(plan::fp8_host_operand_bytes(c, M) == 4 * static_cast<std::uint64_t>(3 * M * F));
  // The GPU: one GEMM's one-byte copies at a time, the largest a gate or up
  // layer's backward to its input, dy (M, F) and W (F, H).
  CHECK(e.gemm == M * F + F * H);
  CHECK(plan::fp8_operand_bytes(c, M) == static_cast<std::uint64_t>(M * F + F * H));
  // tp 4 shards F to 2752 < H: the column-parallel layers' (M, H) inputs
  // are the largest x, the row-parallel layers' (M, H) outputs the largest
  // dy; a SwiGLU shard (F/4, H) still the largest weight.
  const auto e4 = plan::fp8_largest_operands(c, M, {4, 1});
  REQUIRE(F / 4 < H);
  CHECK(e4.x == M * H);
  CHECK(e4.w == F / 4 * H);
  CHECK(e4.dy == M * H);
  CHECK(e4.gemm == M * H + F / 4 * H);  // M = H: gate's forward, down's backward to its input
  CHECK_THROWS_AS(plan::fp8_largest_operands(c, 0), config_error);
  CHECK_THROWS_WITH(plan::fp8_largest_operands(c, M, {3, 0}), Catch::Contains("tp=3"));
  // A policy without FP8 plans nothing.
  plan::activation_options a;
  a.seq = 256;
  const auto none =
      plan::plan_fp8(c, plan::dtype_sizes::of<precision::bf16_mixed>(), a, {}, c.n_layers);
  CHECK(none.total() == 0);
  const auto some = plan::plan_fp8(c, plan::dtype_sizes::from_name("fp8_mixed"), a, {}, 0);
  CHECK(some.operands == 0);  // a stage without blocks casts nothing
  CHECK_THROWS_AS(plan::plan_fp8(c, plan::dtype_sizes::of<P8>(), a, {}, c.n_layers + 1),
                  config_error);
}

}  // namespace test_plan_fp8
