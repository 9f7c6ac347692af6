// Holds the planner's engine accounting (plan/memory.hpp, plan/step.hpp)
// against train::trainer on threads (local_communicator):
// for dp 1..4, zero<0..3>, the tiny and small presets, fp32 and bf16_mixed,
// with two accumulated micro-batches and several buckets per rank, each
// rank allocating from its own host_memory_resource:
//
// - persistent bytes, after construction and after each of two steps (so
//   between steps: every transient of the step is freed), equal
//   plan_state(...).persistent() + plan::trainer_bytes(...) within 1% (the
//   issue's bound) and to the byte;
// - the engine's transient buffers at their most (as allocated: the bucket
//   gradient buffers, zero<3>'s gathered segments, zero<1,2>'s update
//   all-gather) equal the planner's reduce_staging, gathered and
//   update_gather to the byte, with the buckets reduced once per step and,
//   under zero<2,3>, every micro-batch;
// - the bytes each rank sends per step (the communicator's counters) equal
//   plan_comm(...) for that rank exactly.
//
// Counted by the allocator and the planner: the model's parameter buffer
// (not under ZeRO-3), its full-size gradient buffer and RoPE tables, the
// engine's padded staging buffer (ZeRO-0/1), reduced-gradient shard and
// parameter shard (ZeRO-1..3), AdamW's moments and master copy (bf16_mixed), the
// engine's optimizer segment table, and the trainer's loader buffers and step
// scalars (plan::trainer_bytes).
// Not counted by either (outside the resource): the token file and sampler
// vectors, the host GEMM conversion buffers (kernels::gemm_workspace_bytes),
// the communicator's message buffers.
#include <catch2/catch.hpp>

#include <omp.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <tessera/comm/local.hpp>
#include <tessera/core/random.hpp>
#include <tessera/data/token_file.hpp>
#include <tessera/plan/memory.hpp>
#include <tessera/plan/step.hpp>
#include <tessera/train/trainer.hpp>

namespace test_parallel_memory {

using namespace tessera;
using comm::local_communicator;
namespace fs = std::filesystem;

namespace {

constexpr std::int64_t A = 2, B = 1, T = 16;  // micro-batches per rank, rows, tokens per row
constexpr double tolerance = 0.01;            // the bound on persistent bytes

// Bucket capacities that give each preset several buckets, some holding two
// segments (tiny: head + last block, first block + embedding).
std::int64_t bucket_bytes_for(const nn::llama_config& c) {
  return c.name == "tiny" ? 12 * 1024 : 1024 * 1024;
}

// A corpus of random tokens below 32 (the tiny preset's vocabulary), one
// file per test case and process.
struct corpus {
  fs::path path;
  explicit corpus(const std::string& name)
      : path(fs::temp_directory_path() /
             ("tessera_plan_mem_" + name + "_" + std::to_string(::getpid()) + ".tok")) {
    std::vector<std::uint32_t> t(20000);
    rng r(7);
    for (auto& x : t) x = static_cast<std::uint32_t>(r.next_u64() % 32);
    data::write_token_file(path, t, 32);
  }
  ~corpus() {
    std::error_code ec;
    fs::remove(path, ec);
  }
};

// Failures are collected, not thrown, so a rank never leaves its peers
// waiting in a collective.
struct failures {
  std::mutex m;
  std::vector<std::string> msgs;
  void add(std::string s) {
    std::lock_guard<std::mutex> g(m);
    msgs.push_back(std::move(s));
  }
};

template <precision::policy P, class S>
void check_rank(const nn::llama_config& mc, const fs::path& tokens, local_communicator& c,
                failures& fail,
                parallel::grad_reduction reduction = parallel::grad_reduction::per_step,
                std::optional<std::int32_t> separator = std::nullopt) {
  host_memory_resource mr;  // this rank's own
  data::token_file f(tokens);
  train::train_config tc;
  tc.steps = 4;
  tc.global_batch = c.size() * B * A;
  tc.micro_batch = B;
  tc.seq = T;
  tc.dp = c.size();
  tc.warmup = 1;
  tc.lr = 1e-3;
  tc.eval_windows = 2;
  tc.document_separator = separator;
  parallel::data_parallel_options dpo;
  dpo.bucket_bytes = bucket_bytes_for(mc);
  dpo.reduction = reduction;
  const bool per_mb = reduction == parallel::grad_reduction::per_micro_batch;
  const kernels::host_context ctx{&mr};
  train::trainer<P, host, optim::adamw, S, local_communicator> tr(mc, tc, f, parallel::layout{c},
                                                                  dpo, &ctx);

  const auto d = plan::dtype_sizes::of<P>();
  const plan::sharding sh{S::stage, c.size(), 1, dpo.bucket_bytes, c.rank(), 1, 0, per_mb, A};
  const auto st = plan::plan_state(mc, d, plan::optimizer_spec::adamw(), sh);
  const auto cp = plan::plan_comm(mc, sh, {d.reduce, d.param, A, c.rank()});
  plan::activation_options ao;
  ao.micro_batch = B;
  ao.seq = T;
  ao.micro_batches = A;
  ao.document_mask = separator.has_value();
  const std::uint64_t token_buffer = plan::trainer_bytes(ao, T, d);
  const std::string who = tessera::detail::str(
      mc.name, " ", P::name, " ", S::name, " dp ", c.size(), " rank ", c.rank(),
      per_mb ? " per micro-batch" : "", separator ? " document mask" : "", ": ");

  auto check_persistent = [&](const char* when) {
    const std::uint64_t got = mr.stats().allocated, want = st.persistent() + token_buffer;
    const double rel =
        std::abs(static_cast<double>(got) - static_cast<double>(want)) / static_cast<double>(want);
    if (!(rel < tolerance) || got != want)
      fail.add(tessera::detail::str(who, when, ": allocated ", got, " B, planned ", want,
                                    " B with trainer buffers of ", token_buffer, " B (rel ", rel,
                                    ")"));
  };
  check_persistent("after construction");
  // The engine's own count of what it keeps (staging, shards, optimizer state).
  const std::uint64_t engine_planned =
      st.param_shard + st.reduce_buffers + st.master + st.optimizer + st.segment_table;
  if (tr.engine().persistent_bytes() != engine_planned)
    fail.add(tessera::detail::str(who, "engine keeps ", tr.engine().persistent_bytes(),
                                  " B, planned ", engine_planned));
  for (int s = 0; s < 2; ++s) {
    c.reset_stats();  // this rank's counters; its own earlier collectives are complete
    tr.train_step();
    if (c.bytes_sent() != cp.bytes_per_step())
      fail.add(tessera::detail::str(who, "step ", s, " sent ", c.bytes_sent(), " B, planned ",
                                    cp.bytes_per_step(), " B"));
    check_persistent(s == 0 ? "after step 1" : "after step 2");
  }
  // The transients at their most over the two steps, as allocated.
  const auto peak = tr.engine().max_transient_bytes();
  if (peak.grad_buckets != st.reduce_staging || peak.gathered != st.gathered ||
      peak.update_gather != st.update_gather)
    fail.add(tessera::detail::str(who, "transients: bucket gradients ", peak.grad_buckets,
                                  " B, gathered ", peak.gathered, " B, update gather ",
                                  peak.update_gather, " B; planned ", st.reduce_staging, ", ",
                                  st.gathered, ", ", st.update_gather));
}

template <precision::policy P>
void check_preset(const nn::llama_config& mc) {
  corpus tokens(mc.name + "_" + P::name);
  comm::comm_options o;
  o.timeout = std::chrono::seconds(60);
  failures fail;
  for (int N = 1; N <= 4; ++N) {
    INFO(mc.name << " " << P::name << " dp " << N);
    // One OpenMP thread per rank thread (see tests/parallel/zero.cpp).
    REQUIRE_NOTHROW(comm::local_world::run(
        N,
        [&](local_communicator& c) {
          omp_set_num_threads(1);
          check_rank<P, parallel::zero<0>>(mc, tokens.path, c, fail);
          check_rank<P, parallel::zero<1>>(mc, tokens.path, c, fail);
          check_rank<P, parallel::zero<2>>(mc, tokens.path, c, fail);
          check_rank<P, parallel::zero<3>>(mc, tokens.path, c, fail);
          check_rank<P, parallel::zero<2>>(mc, tokens.path, c, fail,
                                           parallel::grad_reduction::per_micro_batch);
          check_rank<P, parallel::zero<3>>(mc, tokens.path, c, fail,
                                           parallel::grad_reduction::per_micro_batch);
        },
        o));
  }
  for (const auto& m : fail.msgs) FAIL_CHECK(m);
  CHECK(fail.msgs.empty());
}

}  // namespace

TEST_CASE("per-rank persistent and communicated bytes equal the plan: tiny, fp32",
          "[parallel][plan][memory]") {
  check_preset<precision::fp32>(nn::llama_config::tiny());
}

TEST_CASE("per-rank persistent and communicated bytes equal the plan: tiny, bf16_mixed",
          "[parallel][plan][memory]") {
  check_preset<precision::bf16_mixed>(nn::llama_config::tiny());
}

TEST_CASE("per-rank persistent and communicated bytes equal the plan: small, fp32",
          "[parallel][plan][memory]") {
  check_preset<precision::fp32>(nn::llama_config::small());
}

TEST_CASE("per-rank persistent and communicated bytes equal the plan: small, bf16_mixed",
          "[parallel][plan][memory]") {
  check_preset<precision::bf16_mixed>(nn::llama_config::small());
}

// Packed documents add the step's (A, B, T) document starts to the
// trainer's buffers (plan::activation_options::document_mask).
TEST_CASE("per-rank persistent bytes equal the plan with a document mask: tiny, fp32",
          "[parallel][plan][memory]") {
  corpus tokens("tiny_documents");
  comm::comm_options o;
  o.timeout = std::chrono::seconds(60);
  failures fail;
  for (int N = 1; N <= 2; ++N) {
    INFO("dp " << N);
    REQUIRE_NOTHROW(comm::local_world::run(
        N,
        [&](local_communicator& c) {
          omp_set_num_threads(1);
          const auto mc = nn::llama_config::tiny();
          const auto per_step = parallel::grad_reduction::per_step;
          check_rank<precision::fp32, parallel::zero<0>>(mc, tokens.path, c, fail, per_step, 3);
          check_rank<precision::fp32, parallel::zero<3>>(mc, tokens.path, c, fail, per_step, 3);
        },
        o));
  }
  for (const auto& m : fail.msgs) FAIL_CHECK(m);
  CHECK(fail.msgs.empty());
}

TEST_CASE("the test's buckets: several per rank, some holding two segments",
          "[parallel][plan][memory]") {
  for (const auto& c : {nn::llama_config::tiny(), nn::llama_config::small()}) {
    INFO(c.name);
    const auto bp = plan::engine_buckets(c, {1, 4, 1, bucket_bytes_for(c)}, 4);
    CHECK(bp.size() >= 2);
    bool merged = false;
    for (const auto& b : bp.buckets()) merged = merged || b.first_segment != b.last_segment;
    CHECK(merged);
  }
}

}  // namespace test_parallel_memory
