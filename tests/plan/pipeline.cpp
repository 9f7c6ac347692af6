// The pipeline planner (plan/pipeline.hpp): each chunk's saved bytes of one
// micro-batch equal the stage model's record_bytes(B, T) exactly (fp32 and
// bf16_mixed, pp 2 and 4, with and without full checkpointing; a tp rank's
// under tp 2, with and without sequence parallelism); the
// stages' real parameters add up to the model's and the weight bytes are
// sizeof(param) times the stage models' parameters; the peak activation
// bytes each rank of the pipeline trainer holds between actions (its
// allocator, per action of the traced step) equal the plan's under gpipe,
// 1f1b and zb1 at pp 2 (and interleaved V 2); under ZeRO-3 each rank's
// model state equals the bytes its engines keep (their shards) and its
// gathered bytes the most its engines held gathered over a step, on a dp 2
// x pp 2 float64 mesh under 1f1b, zb1 and interleaved V 2, and a 8B plan
// matches the segment sizes worked out by hand; the bubble simulation
// reproduces parallel::simulate and the closed forms at equal stage costs.
#include <catch2/catch.hpp>

#include <omp.h>

#include <chrono>
#include <cmath>
#include <mutex>
#include <vector>

#include "tessera/comm/device_mesh.hpp"
#include "tessera/comm/local.hpp"
#include "tessera/nn/llama.hpp"
#include "tessera/nn/tensor_parallel.hpp"
#include "tessera/plan/pipeline.hpp"

#include "../train/pp_suite.hpp"

namespace test_plan_pipeline {

using namespace tessera;
using parallel::schedule_kind;

namespace {

plan::pipeline_options pipe(int pp, schedule_kind s, std::int64_t M, std::int64_t B, std::int64_t T,
                            bool full = false, int V = 1) {
  plan::pipeline_options p;
  p.pp = pp;
  p.virtual_stages = V;
  p.schedule = s;
  p.micro_batches = M;
  p.act.micro_batch = B;
  p.act.seq = T;
  if (full) p.act.model.checkpointing = {nn::activation_checkpointing::full, 1};
  return p;
}

template <precision::policy P>
void check_records(int pp, bool full, bool tied = false) {
  const nn::llama_config c = pp_suite::model(4, tied);
  const std::int64_t B = 2, T = 16;
  const auto d = plan::dtype_sizes::of<P>();
  const plan::pipeline_plan pl = plan::plan_pipeline(
      c, d, plan::optimizer_spec::adamw(), {}, pipe(pp, schedule_kind::one_f_one_b, 4, B, T, full));
  REQUIRE(pl.stages.size() == static_cast<std::size_t>(pp));
  std::int64_t params = 0;
  for (const auto& st : pl.stages) {
    REQUIRE(st.chunks.size() == 1);
    const auto& ch = st.chunks[0];
    INFO(P::name << " pp " << pp << " full " << full << " tied " << tied << " stage " << st.stage);
    nn::llama_options o;
    o.stage = ch.range;
    if (full) o.checkpointing = {nn::activation_checkpointing::full, 1};
    nn::llama<P> m(c, o);
    CHECK(ch.saved == static_cast<std::uint64_t>(m.record_bytes(B, T)));
    // The stage model's real parameters: its weight-decay ranges (no padding).
    std::int64_t real = 0;
    for (const auto& r : m.param_ranges()) real += r.end - r.begin;
    CHECK(ch.params == real);
    CHECK(st.weights == sizeof(typename P::param_type) * static_cast<std::uint64_t>(real));
    CHECK(st.grads == sizeof(typename P::grad_type) * static_cast<std::uint64_t>(real));
    params += ch.params;
  }
  // Tied embeddings: the last stage's copy of the (V, H) embedding is
  // counted on that stage, the tensor once in the model's count.
  const std::int64_t copy = tied && pp > 1 ? c.vocab * c.dim : 0;
  CHECK(params == c.num_params() + copy);
  CHECK(params == nn::llama<P>(c, {}).num_params() + copy);
}

// Under tp 2 (and sequence parallelism): each tp rank's stage models.
void check_records_tp(int pp, bool sp) {
  using P = precision::bf16_mixed;
  using layers = nn::tensor_parallel_layers<comm::local_communicator>;
  const nn::llama_config c = pp_suite::model();
  const std::int64_t B = 1, T = 16;
  comm::comm_options co;
  co.timeout = std::chrono::seconds(30);
  std::mutex mu;
  std::vector<std::string> bad;
  comm::local_world::run(
      2,
      [&](comm::local_communicator& g) {
        plan::pipeline_options p = pipe(pp, schedule_kind::zero_bubble_h1, 4, B, T);
        p.act.tp = 2;
        p.act.sequence_parallel = sp;
        plan::sharding sh;
        sh.tp = 2;
        sh.tp_rank = g.rank();
        const auto pl = plan::plan_pipeline(c, plan::dtype_sizes::of<P>(),
                                            plan::optimizer_spec::adamw(), sh, p);
        for (const auto& st : pl.stages) {
          nn::llama_options o;
          o.stage = st.chunks[0].range;
          layers ly{&g};
          ly.sequence_parallel = sp;
          nn::llama<P, host, layers> m(c, o, kernels::default_host_context(), ly);
          std::int64_t real = 0;
          for (const auto& r : m.param_ranges()) real += r.end - r.begin;
          std::lock_guard lk(mu);
          if (st.chunks[0].saved != static_cast<std::uint64_t>(m.record_bytes(B, T)) ||
              st.params != real)
            bad.push_back(tessera::detail::str(
                "tp rank ", g.rank(), " stage ", st.stage, ": saved ", st.chunks[0].saved, " vs ",
                m.record_bytes(B, T), ", params ", st.params, " vs ", real));
        }
      },
      co);
  INFO("pp " << pp << " sp " << sp);
  for (const auto& b : bad) FAIL_CHECK(b);
  CHECK(bad.empty());
}

// One rank of the pipeline trainer: the most bytes held between actions of
// a traced step above what was allocated before it.
struct measured {
  std::mutex mu;
  std::vector<std::int64_t> peak, before, after;
  std::vector<std::string> trace;
};

template <precision::policy P>
void check_trainer_peak(schedule_kind s, int V = 1) {
  const int K = 2;
  const std::int64_t M = 8;
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("pp_plan", 0)};
  data::token_file f(corpus.path);
  pp_suite::layout l;
  l.pp = K;
  l.schedule = s;
  l.virtual_stages = V;
  l.micro_batches = M;
  const train::train_config cfg = pp_suite::config(l, 2);
  measured got;
  got.peak.assign(K, 0);
  got.before = got.after = got.peak;
  got.trace.resize(K);
  comm::comm_options co;
  co.timeout = std::chrono::seconds(60);
  comm::local_world::run(
      K,
      [&](comm::local_communicator& world) {
        omp_set_num_threads(1);
        auto g = comm::make_groups(world, comm::device_mesh(1, 1, K));
        train::trainer<P, host, optim::adamw, parallel::zero<0>, comm::local_communicator> tr(
            pp_suite::model(), cfg, f, parallel::layout{g.dp, nn::dense_layers{}, g.pp});
        tr.set_tracing(true);
        const auto before = static_cast<std::int64_t>(tr.context().resource().stats().allocated);
        (void)tr.train_step();
        std::int64_t peak = 0;
        std::string trace;
        for (const auto& t : tr.executor().timeline()) {
          peak = std::max(peak, t.allocated - before);
          trace += tessera::detail::str(parallel::to_string(t.a.kind), " ", t.a.micro_batch, " c",
                                        t.a.chunk, ": ", t.allocated - before, "\n");
        }
        std::lock_guard lk(got.mu);
        const auto k = static_cast<std::size_t>(tr.pp_rank());
        got.peak[k] = peak;
        got.before[k] = before;
        got.after[k] = static_cast<std::int64_t>(tr.context().resource().stats().allocated);
        got.trace[k] = trace;
      },
      co);
  plan::pipeline_options p = pipe(K, s, M, cfg.micro_batch, cfg.seq, false, V);
  const plan::pipeline_plan pl = plan::plan_pipeline(pp_suite::model(), plan::dtype_sizes::of<P>(),
                                                     plan::optimizer_spec::adamw(), {}, p);
  for (int k = 0; k < K; ++k) {
    const auto u = static_cast<std::size_t>(k);
    const auto want = static_cast<double>(pl.stages[u].peak_activation_bytes);
    INFO(P::name << " " << parallel::to_string(s) << " V " << V << " rank " << k << ": measured "
                 << got.peak[u] << " B, planned " << want << " B (records alone "
                 << pl.stages[u].peak_record_bytes << ")\n"
                 << got.trace[u]);
    CHECK(got.after[u] == got.before[u]);  // the step returns what it allocated
    CHECK(std::abs(static_cast<double>(got.peak[u]) - want) <= 0.01 * want);
    CHECK(static_cast<double>(got.peak[u]) == want);  // exact, in fact
  }
}

// ZeRO-3 on a dp 2 x pp 2 mesh (world 4, float64): on every rank, after a
// step, each chunk's engine keeps its shards (parameters, reduced
// gradients, optimizer state) in the plan's model-state bytes and held at
// most the plan's gathered bytes at once. The tiny model's segments need
// no padding at dp 2 (every bucket's padded size is its real size, which
// the test checks), so the engine's bytes are the ideal plan's exactly.
void check_trainer_zero3(schedule_kind s, int V = 1) {
  using P = precision::fp64;
  const int dp = 2, K = 2;
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("pp_plan_zero3", 0)};
  data::token_file f(corpus.path);
  pp_suite::layout l;
  l.dp = dp;
  l.pp = K;
  l.schedule = s;
  l.virtual_stages = V;
  l.micro_batches = 4;
  const train::train_config cfg = pp_suite::config(l, 1);
  plan::sharding sh;
  sh.zero = 3;
  sh.dp = dp;
  const plan::pipeline_plan pl = plan::plan_pipeline(
      pp_suite::model(), plan::dtype_sizes::of<P>(), plan::optimizer_spec::adamw(), sh,
      pipe(K, s, l.micro_batches, cfg.micro_batch, cfg.seq, false, V));
  std::mutex mu;
  std::vector<std::string> bad;
  comm::comm_options co;
  co.timeout = std::chrono::seconds(60);
  comm::local_world::run(
      dp * K,
      [&](comm::local_communicator& world) {
        omp_set_num_threads(1);
        auto g = comm::make_groups(world, comm::device_mesh(dp, 1, K));
        train::trainer<P, host, optim::adamw, parallel::zero<3>, comm::local_communicator> tr(
            pp_suite::model(), cfg, f, parallel::layout{g.dp, nn::dense_layers{}, g.pp});
        (void)tr.train_step();
        const plan::pipeline_stage_plan& st = pl.stages[static_cast<std::size_t>(tr.pp_rank())];
        std::uint64_t weights = 0, grads = 0, opt = 0, gathered = 0, buckets = 0;
        std::vector<std::string> mine;
        const auto where = [&](int c) {
          return tessera::detail::str(parallel::to_string(s), " V ", V, " world rank ",
                                      world.rank(), " stage ", st.stage, " chunk ", c, ": ");
        };
        for (int c = 0; c < tr.chunks(); ++c) {
          const auto& e = tr.engine(c);
          const auto& ch = st.chunks[static_cast<std::size_t>(c)];
          if (e.plan().staging_size() != ch.params)
            mine.push_back(tessera::detail::str(where(c), "padded buckets ",
                                                e.plan().staging_size(), ", plan's parameters ",
                                                ch.params, " (the test wants no padding)"));
          const auto shard = static_cast<std::uint64_t>(e.plan().shard_size());
          weights += shard * sizeof(P::param_type);
          grads += shard * sizeof(P::grad_type);
          // AdamW's two moments over the shard (float64 keeps no master
          // copy); its segment table, 40 bytes a range, the ideal plan leaves out.
          if (e.optimizer().size() != e.plan().shard_size())
            mine.push_back(tessera::detail::str(where(c), "optimizer over ", e.optimizer().size(),
                                                " elements, shard ", shard));
          opt += static_cast<std::uint64_t>(e.optimizer().size()) * sizeof(P::master_type) * 2;
          const std::uint64_t held = e.max_transient_bytes().gathered;
          if (held != ch.gathered)
            mine.push_back(tessera::detail::str(where(c), "held ", held, " B gathered at most (",
                                                e.max_segments_held(), " segments), planned ",
                                                ch.gathered, " B"));
          gathered = std::max(gathered, held);
          // The gradient buckets of the window: the chunk's whole gradient.
          buckets += e.max_transient_bytes().grad_buckets;
          if (e.persistent_bytes() !=
              shard * (sizeof(P::param_type) + sizeof(P::grad_type)) + e.optimizer().state_bytes())
            mine.push_back(tessera::detail::str(where(c), "keeps ", e.persistent_bytes(),
                                                " B besides its shards"));
        }
        // The buckets: all of them at once from the first backward on, but
        // for GPipe's last stage, whose head (fused with its forward) may
        // finish its reduction before the blocks' backward opens theirs:
        // the plan is a bound there, met or not as the timing goes.
        const bool buckets_ok =
            s == schedule_kind::gpipe ? buckets <= st.reduce_staging : buckets == st.reduce_staging;
        if (weights != st.weights || grads != st.grads || opt != st.master + st.optimizer ||
            gathered != st.gathered || !buckets_ok)
          mine.push_back(tessera::detail::str(
              where(-1), "engines' weights ", weights, " grads ", grads, " optimizer ", opt,
              " gathered ", gathered, " buckets ", buckets, "; planned ", st.weights, " ",
              st.grads, " ", st.master + st.optimizer, " ", st.gathered, " ", st.reduce_staging));
        std::lock_guard lk(mu);
        bad.insert(bad.end(), mine.begin(), mine.end());
      },
      co);
  for (const auto& b : bad) FAIL_CHECK(b);
  CHECK(bad.empty());
}

}  // namespace

TEST_CASE("pipeline plan: each stage's saved bytes are its model's record_bytes", "[plan][pp]") {
  for (int pp : {2, 4})
    for (bool full : {false, true}) {
      check_records<precision::fp32>(pp, full);
      check_records<precision::bf16_mixed>(pp, full);
    }
  check_records<precision::fp32>(1, false, true);
  check_records<precision::fp32>(2, false, true);
  check_records<precision::bf16_mixed>(4, true, true);
}

TEST_CASE("pipeline plan: a tp rank's saved bytes and parameters, with sequence parallelism",
          "[plan][pp][tp]") {
  for (int pp : {2, 4})
    for (bool sp : {false, true}) check_records_tp(pp, sp);
}

TEST_CASE("pipeline plan: the trainer's allocator holds the planned peak activation bytes",
          "[plan][pp][train]") {
  for (schedule_kind s :
       {schedule_kind::gpipe, schedule_kind::one_f_one_b, schedule_kind::zero_bubble_h1}) {
    check_trainer_peak<precision::fp32>(s);
    check_trainer_peak<precision::bf16_mixed>(s);
  }
  check_trainer_peak<precision::fp32>(schedule_kind::interleaved, 2);
}

TEST_CASE("pipeline plan: in-flight counts, p2p bytes, ZeRO shards", "[plan][pp]") {
  const nn::llama_config c = nn::llama_config::llama2_7b();
  const auto d = plan::dtype_sizes::from_name("bf16_mixed");
  const std::int64_t M = 8, T = 4096;
  const auto pl = plan::plan_pipeline(c, d, plan::optimizer_spec::adamw(), {1, 4},
                                      pipe(4, schedule_kind::one_f_one_b, M, 1, T));
  const std::uint64_t msg = static_cast<std::uint64_t>(T * c.dim) * 2;
  for (const auto& st : pl.stages) {
    const int k = st.stage;
    CHECK(st.peak_in_flight == std::min<std::int64_t>(4 - k, M));
    // 1F1B holds K - k micro-batches' records at most.
    CHECK(st.peak_record_bytes ==
          static_cast<std::uint64_t>(st.peak_in_flight) * st.chunks[0].saved);
    const std::int64_t sends = (k > 0 ? M : 0) + (k < 3 ? M : 0);
    CHECK(st.sends == sends);
    const std::uint64_t grad = static_cast<std::uint64_t>(T * c.dim) * d.act_grad;
    CHECK(st.p2p_bytes == (k < 3 ? M * msg : 0) + (k > 0 ? M * grad : 0));
    // ZeRO-1 over dp 4: master and moments a quarter (rounded up).
    const auto n = static_cast<std::uint64_t>(st.params);
    CHECK(st.optimizer == (n + 3) / 4 * 4 * 2);
    CHECK(st.master == (n + 3) / 4 * 4);
    CHECK(st.grads == n * 4);
  }
  // zb1 holds 1F1B's in-flight count; interleaved, more.
  const auto zb = plan::plan_pipeline(c, d, plan::optimizer_spec::adamw(), {},
                                      pipe(4, schedule_kind::zero_bubble_h1, M, 1, T));
  for (const auto& st : zb.stages) CHECK(st.peak_in_flight == std::min<std::int64_t>(4, M));
  CHECK_THROWS_WITH(plan::plan_pipeline(c, d, plan::optimizer_spec::adamw(), {3, 4, 2},
                                        pipe(4, schedule_kind::one_f_one_b, M, 1, T)),
                    Catch::Contains("prefetch=2"));
  CHECK_THROWS_WITH(plan::plan_pipeline(c, d, plan::optimizer_spec::adamw(), {},
                                        pipe(3, schedule_kind::interleaved, M, 1, T, false, 2)),
                    Catch::Contains("multiple of pp=3"));
}

TEST_CASE("pipeline plan: ZeRO-3 shards and gathered segments are the trainer's engines'",
          "[plan][pp][train][zero3]") {
  check_trainer_zero3(schedule_kind::gpipe);
  check_trainer_zero3(schedule_kind::one_f_one_b);
  check_trainer_zero3(schedule_kind::zero_bubble_h1);
  check_trainer_zero3(schedule_kind::interleaved, 2);
}

TEST_CASE("pipeline plan: ZeRO-3 of 8B on 4 stages, by hand", "[plan][pp][zero3]") {
  // Llama 3 8B: its embedding and head (V H each) outweigh a block, so the
  // end stages gather a block beside them, not two of their largest segment.
  const nn::llama_config c = nn::llama_config::llama3_8b();
  const auto d = plan::dtype_sizes::from_name("bf16_mixed");
  const std::int64_t H = c.dim, F = c.ffn_dim, V = c.vocab, KV = c.n_kv_heads * c.head_dim();
  const std::int64_t block = 2 * H + 2 * H * H + 2 * H * KV + 3 * H * F;  // norms, q o, k v, SwiGLU
  const std::int64_t embedding = V * H, head = H + V * H;                 // + the final norm
  REQUIRE(embedding > block);
  const auto p = pipe(4, schedule_kind::one_f_one_b, 8, 1, 4096);
  const auto u = [](std::int64_t x) { return static_cast<std::uint64_t>(x); };
  for (int prefetch : {1, 0}) {
    const auto pl = plan::plan_pipeline(c, d, plan::optimizer_spec::adamw(), {3, 4, prefetch}, p);
    const auto z1 = plan::plan_pipeline(c, d, plan::optimizer_spec::adamw(), {1, 4, prefetch}, p);
    std::int64_t total = 0;
    for (const auto& st : pl.stages) {
      INFO("prefetch " << prefetch << " stage " << st.stage);
      const auto& r = st.chunks[0].range;
      const std::int64_t n = (r.last_block - r.first_block) * block +
                             (r.embedding ? embedding : 0) + (r.head ? head : 0);
      CHECK(st.params == n);
      total += n;
      const std::uint64_t shard = u((n + 3) / 4);
      CHECK(st.weights == shard * 2);  // bf16 weights, a quarter each
      CHECK(st.grads == shard * d.grad);
      CHECK(st.master == shard * 4);
      CHECK(st.optimizer == shard * 4 * 2);
      // The largest pair a stage's engine holds: the embedding or the head
      // beside its block on the end stages, two blocks between them.
      const std::int64_t pair = r.embedding ? embedding + block : r.head ? head + block : 2 * block;
      const std::int64_t one = r.embedding ? embedding : r.head ? head : block;
      CHECK(st.gathered == u(prefetch ? pair : one) * 2);
      CHECK(st.chunks[0].gathered == st.gathered);
      CHECK(st.gathered <=
            2 * u(std::max({block, r.embedding ? embedding : 0, r.head ? head : 0})) * 2);
      // Beside ZeRO-1: the weights and gradients shrink by dp, and the
      // gathered segments stay out of the model state.
      const auto& s1 = z1.stages[static_cast<std::size_t>(st.stage)];
      CHECK(s1.gathered == 0);
      CHECK(st.model_state() ==
            s1.model_state() - (s1.weights - st.weights) - (s1.grads - st.grads));
      CHECK(st.peak_activation_bytes == s1.peak_activation_bytes);
    }
    CHECK(total == c.num_params());
  }
}

TEST_CASE(
    "pipeline plan: the bubble at equal stage costs is parallel::simulate's and the "
    "closed form",
    "[plan][pp]") {
  for (auto [s, K, M, V] :
       {std::tuple{schedule_kind::gpipe, 4, 8, 1}, std::tuple{schedule_kind::one_f_one_b, 4, 8, 1},
        std::tuple{schedule_kind::one_f_one_b, 8, 3, 1},
        std::tuple{schedule_kind::interleaved, 4, 8, 2},
        std::tuple{schedule_kind::zero_bubble_h1, 4, 8, 1}}) {
    INFO(parallel::to_string(s) << " K " << K << " M " << M << " V " << V);
    const parallel::pipeline_shape shape{K, M, V};
    std::vector<std::vector<parallel::action>> lists;
    for (int k = 0; k < K; ++k) lists.push_back(parallel::make_schedule(s, k, shape));
    plan::virtual_stage_costs costs;
    costs.forward.assign(static_cast<std::size_t>(K * V), 1.0 / V);
    costs.backward_input = costs.backward_weight = costs.forward;
    const auto mine = plan::simulate_stages(lists, V, costs);
    const parallel::stage_costs unit{};
    const auto ref = parallel::simulate(lists, V, unit);
    CHECK(mine.step_time == Approx(ref.step_time).epsilon(1e-12));
    CHECK(mine.bubble_fraction == Approx(ref.bubble_fraction).epsilon(1e-12));
    CHECK(mine.bubble_fraction == Approx(plan::bubble_closed_form(s, shape)).epsilon(1e-12));
  }
  // With the head on the last stage the simulated bubble exceeds the closed form.
  const auto pl = plan::plan_pipeline(
      nn::llama_config::llama2_7b(), plan::dtype_sizes::from_name("bf16_mixed"),
      plan::optimizer_spec::adamw(), {}, pipe(4, schedule_kind::one_f_one_b, 8, 1, 4096));
  CHECK(pl.bubble_closed_form == Approx(3.0 / 11));
  CHECK(pl.bubble_fraction >= pl.bubble_closed_form);
  CHECK(pl.bubble_fraction < 0.5);
}

}  // namespace test_plan_pipeline
