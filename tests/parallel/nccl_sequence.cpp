// The NCCL sequence of real training steps, without a GPU: the trainer runs
// on thread ranks over the recording communicator of
// tests/comm/nccl_recording.hpp (local_communicator underneath, with
// nccl_communicator's group_p2p, so the pipeline executor takes its NCCL
// path), which records every operation's NCCL calls (comm/nccl_calls.hpp:
// the list nccl_communicator issues) beside what the host communicator
// executed. Two recorded optimizer steps per layout; nccl_recording::check
// holds them against the host's own record (the same operations in the
// same order, the NCCL counts, datatypes and reductions those operations
// imply, the bytes the host moved) and replays them on NCCL's rules (the
// same collectives on every member of a group, every send meeting its
// receive in issue order with the same count and tag, one stream per rank
// completing). Each layout then holds the calls against figures computed
// apart from the recording: the bucket plan's chunks for ZeRO 0..3, the
// planner's tensor-parallel bytes (sequence parallelism, replicated
// key/value heads; under bf16 activations the planner's GPU bytes, the
// collectives moving ncclBfloat16), the pipeline's message count
// 2 M (K V - 1) and its message groups (schedule.hpp's message_groups), and
// on the (2, 2, 2) mesh all of them at once, from the splits of the world
// on.
#include <catch2/catch.hpp>

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include <tessera/comm/device_mesh.hpp>
#include <tessera/comm/local.hpp>
#include <tessera/nn/tensor_parallel.hpp>
#include <tessera/plan/step.hpp>

#include "../comm/nccl_replay.hpp"
#include "../train/pp_suite.hpp"

namespace test_parallel_nccl_sequence {

using namespace tessera;
using comm::nccl_call;
using comm::nccl_fn;
using nccl_recording::rank_log;
using rec = nccl_recording::recording<comm::local_communicator>;
using logs_t = std::vector<std::shared_ptr<rank_log>>;
using tp_layers = nn::tensor_parallel_layers<rec>;
using P = precision::fp32;
constexpr int steps = 2;  // recorded optimizer steps

namespace {

comm::comm_options options() {
  comm::comm_options o;
  o.timeout = std::chrono::seconds(60);
  return o;
}

// Runs body(world, its log) on n thread ranks and checks the logs: every
// problem fails the test, named.
template <class Body>
nccl_recording::report record(int n, logs_t& logs, Body&& body) {
  logs.clear();
  for (int r = 0; r < n; ++r) logs.push_back(std::make_shared<rank_log>());
  REQUIRE_NOTHROW(comm::local_world::run(
      n,
      [&](comm::local_communicator& c) {
        omp_set_num_threads(1);
        const auto log = logs[static_cast<std::size_t>(c.rank())];
        rec w(std::move(c), log);
        body(w, *log);
      },
      options()));
  nccl_recording::report rep = nccl_recording::check(logs);
  const std::size_t shown = std::min<std::size_t>(rep.problems.size(), 20);
  for (std::size_t i = 0; i < shown; ++i) FAIL_CHECK(rep.problems[i]);
  REQUIRE(rep.problems.empty());
  REQUIRE(rep.calls > 0);
  return rep;
}

template <class Trainer>
void recorded_steps(Trainer& tr, rank_log& log) {
  log.start();
  for (int s = 0; s < steps; ++s) tr.train_step();
  log.stop();
}

// The counts of the calls of `fn` among `calls`, in order.
std::vector<std::size_t> counts(const std::vector<nccl_call>& calls, nccl_fn fn) {
  std::vector<std::size_t> out;
  for (const nccl_call& c : calls)
    if (c.fn == fn) out.push_back(c.count);
  return out;
}
// `v` repeated `times` times.
std::vector<std::size_t> repeated(const std::vector<std::size_t>& v, int times) {
  std::vector<std::size_t> out;
  for (int i = 0; i < times; ++i) out.insert(out.end(), v.begin(), v.end());
  return out;
}
// The ring bytes world rank r's calls on group g send (the host communicators' formulas).
std::uint64_t bytes_of(const nccl_recording::report& rep, const logs_t& logs, int r,
                       std::uint64_t g) {
  const auto& m = rep.members.at(g);
  const int gr = static_cast<int>(std::find(m.begin(), m.end(), r) - m.begin());
  std::uint64_t b = 0;
  for (const nccl_call& c : rep.calls_of(logs, r, g))
    b += nccl_recording::detail::ring_bytes(c, static_cast<int>(m.size()), gr);
  return b;
}

// The ids of one rank's groups (recording::id), kv 0 without a key/value
// replica group.
struct group_ids {
  std::uint64_t tp = 0, dp = 0, pp = 0, kv = 0;
  template <class Groups, class Trainer>
  static group_ids of(const Groups& g, Trainer& tr) {
    group_ids i{g.tp.id(), g.dp.id(), g.pp.id(), 0};
    if constexpr (std::is_same_v<decltype(tr.model().kv_replica_group()), const rec*>)
      if (const rec* kv = tr.model().kv_replica_group()) i.kv = kv->id();
    return i;
  }
};

// The bucket plan's figures of one rank (parallel/buckets.hpp).
struct plan_figures {
  std::vector<std::size_t> padded, chunk;  // per bucket, in reduction order
};
template <class Engine>
plan_figures figures(const Engine& e) {
  plan_figures f;
  for (const parallel::bucket& b : e.plan().buckets()) {
    f.padded.push_back(static_cast<std::size_t>(b.padded));
    f.chunk.push_back(static_cast<std::size_t>(b.chunk));
  }
  return f;
}

}  // namespace

TEST_CASE("nccl sequence: data parallel under ZeRO 0..3 is the host's and NCCL's",
          "[parallel][nccl][dp]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("nccl_dp", 0)};
  data::token_file f(corpus.path);
  const int dp = 4;  // G = 12, B = 1: A = 3 micro-batches per rank
  auto run = [&]<class S>(S, parallel::data_parallel_options dpo) {
    INFO(S::name << " reduction " << parallel::to_string(dpo.reduction));
    logs_t logs;
    std::vector<plan_figures> plan(dp);
    const auto rep = record(dp, logs, [&](rec& w, rank_log& log) {
      train::trainer<P, host, optim::adamw, S, rec> tr(
          trainer_suite::model(), trainer_suite::config(dp), f, parallel::layout{w}, dpo);
      plan[static_cast<std::size_t>(w.rank())] = figures(tr.engine());
      recorded_steps(tr, log);
    });
    for (int r = 0; r < dp; ++r) {
      INFO("world rank " << r);
      const auto calls = rep.calls_of(logs, r, nccl_recording::world_id);
      const plan_figures& p = plan[static_cast<std::size_t>(r)];
      // Every gradient bucket reduced once per step (per micro-batch: A
      // times), all-reduced whole (zero<0>) or reduce-scattered into its
      // chunk (zero<1..3>); nothing else moves a bucket's size.
      const int reductions =
          steps * (dpo.reduction == parallel::grad_reduction::per_micro_batch ? 3 : 1);
      std::vector<std::size_t> rs = counts(calls, nccl_fn::reduce_scatter);
      std::vector<std::size_t> ag = counts(calls, nccl_fn::all_gather);
      std::vector<std::size_t> big_ar;
      for (std::size_t n : counts(calls, nccl_fn::all_reduce))
        if (n > 1) big_ar.push_back(n);
      if constexpr (S::stage == 0) {
        CHECK(big_ar == repeated(p.padded, steps));
        CHECK(rs.empty());
        CHECK(ag.empty());
      } else {
        CHECK(big_ar.empty());
        std::vector<std::size_t> want = p.chunk;
        std::sort(want.begin(), want.end());
        std::sort(rs.begin(), rs.end());
        CHECK(rs == [&] {
          auto w2 = repeated(want, reductions);
          std::sort(w2.begin(), w2.end());
          return w2;
        }());
        if constexpr (S::stage == 3) {
          // every block gathered before its forward and its backward, each
          // micro-batch; a chunk per gather
          for (std::size_t n : ag)
            CHECK(std::find(p.chunk.begin(), p.chunk.end(), n) != p.chunk.end());
          CHECK(ag.size() >= static_cast<std::size_t>(steps * 3) * p.chunk.size());
        } else {
          // the updated parameters all-gathered once per step, a bucket at a time
          std::vector<std::size_t> got = ag, all = repeated(p.chunk, steps);
          std::sort(got.begin(), got.end());
          std::sort(all.begin(), all.end());
          CHECK(got == all);
        }
      }
      // No point-to-point traffic without a pipeline.
      CHECK(counts(calls, nccl_fn::send).empty());
    }
  };
  run(parallel::zero<0>{}, {});
  run(parallel::zero<1>{}, {});
  run(parallel::zero<2>{}, {});
  run(parallel::zero<3>{}, {});
  parallel::data_parallel_options per_mb;
  per_mb.reduction = parallel::grad_reduction::per_micro_batch;
  run(parallel::zero<2>{}, per_mb);
}

namespace {

// Two recorded steps of the dp x tp mesh under precision P (ZeRO-1), and
// the tp group's calls against the planner.
template <class P>
void tp_case(const data::token_file& f, int dp, int tp, bool sp) {
  INFO("dp " << dp << " tp " << tp << (sp ? " sp" : ""));
  const comm::device_mesh mesh(dp, tp, 1);
  const train::train_config cfg = tp_suite::config(dp, tp, steps, sp);
  logs_t logs;
  std::vector<group_ids> ids(static_cast<std::size_t>(dp * tp));
  const auto rep = record(dp * tp, logs, [&](rec& w, rank_log& log) {
    auto g = comm::make_groups(w, mesh);
    train::trainer<P, host, optim::adamw, parallel::zero<1>, rec, tp_layers> tr(
        trainer_suite::model(), cfg, f, parallel::layout{g.dp, tp_layers{&g.tp}});
    ids[static_cast<std::size_t>(w.rank())] = group_ids::of(g, tr);
    recorded_steps(tr, log);
  });
  plan::tp_traffic t;
  // NCCL moves each tensor in its own type (a bf16 activation as ncclBfloat16).
  t.act = sizeof(typename P::param_type);
  t.act_grad = sizeof(typename P::act_grad_type);
  t.accum = sizeof(typename P::accum_type);
  t.grad = sizeof(typename P::grad_type);
  t.ce_chunk = cfg.ce_chunk;
  t.sequence_parallel = sp;
  const int rep_kv = nn::kv_replicas(trainer_suite::model(), tp);
  for (int r = 0; r < dp * tp; ++r) {
    INFO("world rank " << r);
    const group_ids& id = ids[static_cast<std::size_t>(r)];
    const std::uint64_t tpg = id.tp;
    CHECK(rep.members.at(tpg) == mesh.tp_group(r));
    const int tr_rank = mesh.coord(r).tp;
    // The tp group's NCCL calls send what the planner says, to the byte.
    CHECK(bytes_of(rep, logs, r, tpg) ==
          steps * plan::plan_tp_bytes(trainer_suite::model(), cfg.micro_batch, cfg.seq,
                                      cfg.accum_steps(), tp, tr_rank, t));
    const auto calls = rep.calls_of(logs, r, tpg);
    // Sequence parallelism trades the block's all-reduces for
    // reduce-scatters and all-gathers of rows / tp.
    const auto rs = counts(calls, nccl_fn::reduce_scatter);
    CHECK(rs.empty() == !sp);
    CHECK(counts(calls, nccl_fn::all_gather).empty() == !sp);
    for (std::size_t n : rs) CHECK(n % static_cast<std::size_t>(trainer_suite::model().dim) == 0);
    // The key/value replicas' group (tp / nkv ranks holding one head).
    if (rep_kv > 1) {
      std::vector<int> kv;
      for (int q : mesh.tp_group(r))
        if (mesh.coord(q).tp / rep_kv == tr_rank / rep_kv) kv.push_back(q);
      const std::uint64_t kvg = id.kv;
      CHECK(rep.members.at(kvg) == kv);
      CHECK(bytes_of(rep, logs, r, kvg) ==
            steps * plan::plan_kv_replica_bytes(trainer_suite::model(), cfg.accum_steps(), tp,
                                                tr_rank, t.grad));
    }
  }
  if constexpr (sizeof(typename P::param_type) == 2) {
    // The activations' all-reduces (or reduce-scatters and all-gathers)
    // travel as ncclBfloat16, as over nccl_communicator.
    for (int r = 0; r < dp * tp; ++r) {
      const auto calls = rep.calls_of(logs, r, ids[static_cast<std::size_t>(r)].tp);
      CHECK(std::count_if(calls.begin(), calls.end(),
                          [](const nccl_call& c) { return c.dt == comm::dtype::bf16; }) > 0);
    }
  }
}

}  // namespace

TEST_CASE(
    "nccl sequence: tensor parallel (sequence parallel, kv replicas) is the host's and "
    "NCCL's",
    "[parallel][nccl][tp]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("nccl_tp", 0)};
  data::token_file f(corpus.path);
  // tp 2 with and without sequence parallelism under dp 2; tp 4 > nkv 2, so
  // each key/value head sits on a replica group of 2.
  tp_case<P>(f, 2, 2, true);
  tp_case<P>(f, 2, 2, false);
  tp_case<P>(f, 1, 4, true);
  // 16-bit activations and their gradients: bf16 on NCCL (the host
  // recorder runs them in float).
  tp_case<precision::bf16_mixed_bf16_grads>(f, 1, 4, true);
}

namespace {

// The pipeline's figures on a recorded run of layout `l`: every rank's
// sends and receives against 2 M (K V - 1) messages per step over the
// ranks, each of B T H elements, and each rank's groups against its
// schedule's message groups.
void check_pipeline(const nccl_recording::report& rep, const logs_t& logs,
                    const pp_suite::layout& l, const std::vector<std::size_t>& groups_per_step,
                    const std::vector<group_ids>& ids) {
  const comm::device_mesh mesh(l.dp, l.tp, l.pp);
  const train::train_config cfg = pp_suite::config(l, steps);
  const auto H = static_cast<std::size_t>(pp_suite::model(l.layers).dim);
  const std::size_t rows = static_cast<std::size_t>(cfg.micro_batch * cfg.seq) /
                           static_cast<std::size_t>(l.sequence_parallel ? l.tp : 1);
  for (int dpi = 0; dpi < l.dp; ++dpi)
    for (int tpi = 0; tpi < l.tp; ++tpi) {
      std::size_t sends = 0, recvs = 0;
      for (int k = 0; k < l.pp; ++k) {
        const int r = mesh.rank_of({dpi, tpi, k});
        INFO("world rank " << r);
        const std::uint64_t ppg = ids[static_cast<std::size_t>(r)].pp;
        CHECK(rep.members.at(ppg) == mesh.pp_group(r));
        const auto calls = rep.calls_of(logs, r, ppg);
        for (const nccl_call& c : calls) {
          if (c.fn != nccl_fn::send && c.fn != nccl_fn::recv) continue;
          CHECK(c.count == rows * H);  // one micro-batch's hidden states
          CHECK(c.dt == comm::dtype::f32);
          (c.fn == nccl_fn::send ? sends : recvs) += 1;
        }
        std::size_t launches = 0;
        for (const auto& lc : logs[static_cast<std::size_t>(r)]->launches)
          launches += lc.group == ppg && lc.grouped;
        CHECK(launches == steps * groups_per_step[static_cast<std::size_t>(r)]);
      }
      const auto M = static_cast<std::size_t>(l.micro_batches);
      const auto KV = static_cast<std::size_t>(l.pp * l.virtual_stages);
      CHECK(sends == steps * 2 * M * (KV - 1));
      CHECK(recvs == sends);
    }
}

template <class S, class Layers>
void pipeline_case(const pp_suite::layout& l, bool record_construction = false) {
  INFO(l.name() << " " << S::name);
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("nccl_pp", 0)};
  data::token_file f(corpus.path);
  const int n = l.dp * l.tp * l.pp;
  const comm::device_mesh mesh(l.dp, l.tp, l.pp);
  logs_t logs;
  std::vector<std::size_t> groups(static_cast<std::size_t>(n));
  std::vector<group_ids> ids(static_cast<std::size_t>(n));
  const auto rep = record(n, logs, [&](rec& w, rank_log& log) {
    if (record_construction) log.start();
    auto g = comm::make_groups(w, mesh);
    Layers layers{};
    if constexpr (Layers::tensor_parallel) layers.group = &g.tp;
    train::trainer<P, host, optim::adamw, S, rec, Layers> tr(pp_suite::model(l.layers),
                                                             pp_suite::config(l, steps), f,
                                                             parallel::layout{g.dp, layers, g.pp});
    groups[static_cast<std::size_t>(w.rank())] = parallel::message_groups(tr.actions()).size();
    ids[static_cast<std::size_t>(w.rank())] = group_ids::of(g, tr);
    if (record_construction) {
      for (int s = 0; s < steps; ++s) tr.train_step();
      log.stop();
    } else {
      recorded_steps(tr, log);
    }
  });
  check_pipeline(rep, logs, l, groups, ids);
}

pp_suite::layout pipe(int dp, int tp, int pp, parallel::schedule_kind s, int V = 1,
                      std::int64_t M = 4, bool sp = false) {
  pp_suite::layout l;
  l.dp = dp;
  l.tp = tp;
  l.pp = pp;
  l.schedule = s;
  l.virtual_stages = V;
  l.micro_batches = M;
  l.sequence_parallel = sp;
  l.layers = pp * V >= 4 ? pp * V : 4;
  return l;
}

}  // namespace

TEST_CASE("nccl sequence: pipelines (1F1B, interleaved, GPipe, ZB-H1) are the host's and NCCL's",
          "[parallel][nccl][pp]") {
  using parallel::schedule_kind;
  using Z1 = parallel::zero<1>;
  pipeline_case<Z1, nn::dense_layers>(pipe(1, 1, 2, schedule_kind::one_f_one_b));
  pipeline_case<Z1, nn::dense_layers>(pipe(1, 1, 4, schedule_kind::one_f_one_b, 1, 6));
  pipeline_case<Z1, nn::dense_layers>(pipe(1, 1, 2, schedule_kind::interleaved, 2));
  pipeline_case<Z1, nn::dense_layers>(pipe(1, 1, 4, schedule_kind::interleaved, 2, 8));
  pipeline_case<Z1, nn::dense_layers>(pipe(1, 1, 2, schedule_kind::gpipe));
  pipeline_case<Z1, nn::dense_layers>(pipe(1, 1, 4, schedule_kind::zero_bubble_h1));
}

TEST_CASE(
    "nccl sequence: the (2, 2, 2) mesh, from the world's splits on, is the host's and "
    "NCCL's",
    "[parallel][nccl][mesh]") {
  using parallel::schedule_kind;
  // dp x tp x pp = 2 x 2 x 2 with sequence parallelism, ZeRO-1, 1F1B and
  // interleaved: the splits of make_groups and the trainer's construction
  // recorded too.
  pipeline_case<parallel::zero<1>, tp_layers>(pipe(2, 2, 2, schedule_kind::one_f_one_b, 1, 4, true),
                                              true);
  pipeline_case<parallel::zero<2>, tp_layers>(pipe(2, 2, 2, schedule_kind::interleaved, 2, 4));
}

}  // namespace test_parallel_nccl_sequence
