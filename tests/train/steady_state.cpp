// Tests that a steady-state training step on the host reuses its memory:
// the trainer's own context caches its blocks (host_caching_resource), so
// after the first steps a step makes no system allocation and touches
// (almost) no new page. The counts are printed.
#include <catch2/catch.hpp>

#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "tessera/train/trainer.hpp"

#include "trainer_suite.hpp"

namespace test_train_steady_state {

using namespace tessera;
namespace fs = std::filesystem;

namespace {

long minor_faults() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

// The main job's step (small preset, G = B = 16, T = 128) and one with
// gradient accumulation (A = 4): warm-up steps, then `measured` steps
// counted.
template <class P>
void steady_state(int micro_batch, const char* label) {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("steady", 0)};
  data::token_file f(corpus.path);
  auto mc = nn::llama_config::small();
  mc.vocab = 256;
  train::train_config t;
  t.steps = 20;
  t.global_batch = 16;
  t.micro_batch = micro_batch;
  t.seq = 128;
  t.warmup = 2;
  t.eval_windows = 4;
  train::trainer<P> tr(mc, t, f);
  auto* mr = dynamic_cast<host_caching_resource*>(&tr.context().resource());
  REQUIRE(mr != nullptr);
  for (int s = 0; s < 3; ++s) tr.train_step();

  constexpr int measured = 5;
  const caching_stats before = mr->detailed_stats();
  const long faults0 = minor_faults();
  for (int s = 0; s < measured; ++s) tr.train_step();
  const long faults = minor_faults() - faults0;
  const caching_stats after = mr->detailed_stats();
  const std::size_t allocs = after.system_allocs - before.system_allocs;
  const std::size_t frees = after.system_frees - before.system_frees;
  const double faults_per_step = static_cast<double>(faults) / measured;
  std::printf("steady state (%s, %s): %zu system allocations, %zu system frees, %.1f minor page "
              "faults per step over %d steps; %zu block allocations per step, %.1f MiB reserved\n",
              P::name, label, allocs, frees, faults_per_step, measured,
              (after.base.num_allocs - before.base.num_allocs) / measured,
              static_cast<double>(after.base.reserved) / (1 << 20));
  CHECK(allocs == 0);
  CHECK(frees == 0);
  CHECK(faults_per_step < 100.0);
  // The blocks are really reused: the step allocates, and nothing leaks.
  CHECK(after.base.num_allocs > before.base.num_allocs);
  CHECK(after.base.allocated == before.base.allocated);
}

}  // namespace

TEST_CASE("a steady-state host step makes no system allocation and under 100 page faults",
          "[train][memory]") {
  steady_state<precision::fp32>(16, "B 16");
  steady_state<precision::fp32>(4, "B 4, A 4");
  steady_state<precision::bf16_mixed>(16, "B 16");
}

TEST_CASE("host_caching_resource reuses a freed block and counts the system", "[core][memory]") {
  host_caching_resource mr;
  void* a = mr.allocate(3u << 20);
  CHECK(reinterpret_cast<std::uintptr_t>(a) % 512 == 0);
  CHECK(mr.stats().allocated == 3u << 20);
  CHECK(mr.stats().reserved == 20u << 20);  // a large-pool segment
  mr.deallocate(a, 3u << 20);
  void* b = mr.allocate(3u << 20);
  CHECK(b == a);
  CHECK(mr.detailed_stats().system_allocs == 1);
  mr.deallocate(b, 3u << 20);
  mr.empty_cache();
  CHECK(mr.stats().reserved == 0);
  CHECK(mr.detailed_stats().system_frees == 1);
  CHECK_THROWS_AS(mr.allocate(64, 1024), config_error);
}

}  // namespace test_train_steady_state
