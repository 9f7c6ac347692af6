// Replays the golden trajectories (tests/train/golden_suite.hpp) on one
// rank and on four thread ranks, bit for bit. With TESSERA_GOLDEN_WRITE=1
// it records them instead (tests/train/golden_trajectories.txt.threads).
#include <catch2/catch.hpp>

#include "golden_runs.hpp"
#include "tessera/comm/local.hpp"

using namespace tessera;

namespace {

void check(const std::string& name, const golden::trajectory& t) {
  if (golden::recording()) {
    golden::record("threads", name, t);
    return;
  }
  const std::string diff = golden::compare(name, t);
  INFO(diff);
  CHECK(diff.empty());
}

template <class S>
void dp4(const std::string& name) {
  std::vector<golden::trajectory> per_rank(4);
  comm::local_world::run(4, [&](comm::local_communicator& c) {
    per_rank[static_cast<std::size_t>(c.rank())] = golden::tiny_dp_run<S>(c, 2, "dp4");
  });
  for (int r = 1; r < 4; ++r) REQUIRE(per_rank[static_cast<std::size_t>(r)].size() == per_rank[0].size());
  check(name, per_rank[0]);
}

}  // namespace

TEST_CASE("golden: small preset fp32, 50 steps", "[golden][train]") {
  check("small_fp32", golden::small_run<precision::fp32>());
}

TEST_CASE("golden: small preset bf16_mixed, 50 steps", "[golden][train]") {
  check("small_bf16", golden::small_run<precision::bf16_mixed>());
}

TEST_CASE("golden: tiny on 4 thread ranks under zero<0..3>, 20 steps", "[golden][parallel]") {
  dp4<parallel::zero<0>>("tiny_dp4_zero0");
  dp4<parallel::zero<1>>("tiny_dp4_zero1");
  dp4<parallel::zero<2>>("tiny_dp4_zero2");
  dp4<parallel::zero<3>>("tiny_dp4_zero3");
}

TEST_CASE("golden: tiny resumed at step 25 continues as the run that never stopped",
          "[golden][train]") {
  const golden::trajectory whole = golden::tiny_single_run(0);
  const golden::trajectory resumed = golden::tiny_single_run(25);
  REQUIRE(whole.size() == 50);
  REQUIRE(resumed.size() == 25);
  for (std::size_t i = 0; i < resumed.size(); ++i) {
    CHECK(resumed[i].step == whole[i + 25].step);
    CHECK(resumed[i].loss == whole[i + 25].loss);
    CHECK(resumed[i].grad_norm == whole[i + 25].grad_norm);
    CHECK(resumed[i].lr == whole[i + 25].lr);
  }
  check("tiny_single", whole);
  check("tiny_resume", resumed);
}
