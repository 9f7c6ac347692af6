// Tests include/tessera/plan/step.hpp: the ZeRO communication volumes against
// the ring helpers of comm/communicator.hpp and against the bytes a
// local_communicator really counts, and the FLOPs/MFU arithmetic against
// nn::flops_per_token and seeds/004's worked example.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <vector>

#include "tessera/comm/local.hpp"
#include "tessera/plan/step.hpp"

namespace test_plan_step {

using namespace tessera;

TEST_CASE("zero 0 sends a ring all-reduce of the gradients: 2(N-1)/N n bytes", "[plan][comm]") {
  for (int N : {1, 2, 4, 8}) {
    const std::int64_t n = 8 * 1000;  // divisible by every N here
    const auto p = plan::plan_comm(n, {0, N});
    REQUIRE(p.collectives.size() == 1);
    CHECK(p.bytes_per_step() == comm::ring_all_reduce_bytes(n, 4, N, 0));
    CHECK(p.bytes_per_step() == static_cast<std::uint64_t>(2 * (N - 1) * n / N * 4));
  }
  // Uneven n: the rank's own and next chunk differ; the plan counts the asked rank.
  for (int r = 0; r < 3; ++r)
    CHECK(plan::plan_comm(1001, {0, 3}, {4, 2, 1, r}).bytes_per_step() ==
          comm::ring_all_reduce_bytes(1001, 4, 3, r));
}

TEST_CASE("ideal: ZeRO stages 1-2 move what data parallel moves, stage 3 1.5x", "[plan][comm]") {
  const auto c = nn::llama_config::llama2_7b();  // flat buffer divisible by 8
  const plan::comm_options same{4, 4, 1, 0};     // parameters gathered in the reduction dtype
  const auto ideal = plan::accounting::ideal;
  const auto dp = plan::plan_comm(c, {0, 8}, same, ideal).bytes_per_step();
  const std::uint64_t psi = static_cast<std::uint64_t>(c.num_params()) * 4;
  CHECK(dp == 2 * 7 * psi / 8);
  CHECK(plan::plan_comm(c, {1, 8}, same, ideal).bytes_per_step() == dp);
  CHECK(plan::plan_comm(c, {2, 8}, same, ideal).bytes_per_step() == dp);
  CHECK(plan::plan_comm(c, {3, 8}, same, ideal).bytes_per_step() == 3 * 7 * psi / 8);
  CHECK(plan::plan_comm(c, {3, 8}, same, ideal).bytes_per_step() * 2 == dp * 3);

  // Each collective is the ring helper's count for one shard.
  const std::size_t chunk = static_cast<std::size_t>(c.num_params()) / 8;
  const auto z3 = plan::plan_comm(c, {3, 8}, {4, 2, 1, 0}, ideal);
  REQUIRE(z3.collectives.size() == 3);
  CHECK(z3.collectives[0].bytes() == comm::ring_scatter_gather_bytes(chunk, 2, 8));
  CHECK(z3.collectives[1].bytes() == comm::ring_scatter_gather_bytes(chunk, 2, 8));
  CHECK(z3.collectives[2].bytes() == comm::ring_scatter_gather_bytes(chunk, 4, 8));
  // bf16 parameters and float32 gradients: (N-1)/N psi (4 + 2) bytes for zero 1.
  CHECK(plan::plan_comm(c, {1, 8}, {4, 2, 1, 0}, ideal).bytes_per_step() == 7 * chunk * (4 + 2));
}

TEST_CASE("engine: ZeRO-1/2 equal data parallel, ZeRO-3 1.5x it within 2%", "[plan][comm]") {
  // The bound, float32 on the wire, one micro-batch: 7B on 8 ranks
  // (head 1.9% of the model: 1.490x) and `small` on 4 (head 3.9%: 1.48x).
  for (const auto& [c, N] :
       {std::pair{nn::llama_config::llama2_7b(), 8}, std::pair{nn::llama_config::small(), 4}}) {
    INFO(c.name);
    const plan::comm_options same{4, 4, 1, 0};
    const auto b0 = static_cast<double>(plan::plan_comm(c, {0, N}, same).bytes_per_step());
    for (int z = 1; z <= 3; ++z) {
      const auto bz = static_cast<double>(plan::plan_comm(c, {z, N}, same).bytes_per_step());
      INFO("zero " << z << " / zero 0 = " << bz / b0);
      CHECK(std::abs(bz / b0 / (z == 3 ? 1.5 : 1.0) - 1) < 0.02);
      if (z < 3) CHECK(bz == b0);  // equal chunks: RS + AG move what the all-reduce moves
    }
  }
}

TEST_CASE("engine: one reduction per step, the head gathered once per micro-batch",
          "[plan][comm]") {
  // Built by hand from bucket_plan for small on 4 ranks, bf16 parameters.
  const auto c = nn::llama_config::small();
  const int N = 4;
  const plan::sharding sh3{3, N};
  const auto bp = plan::engine_buckets(c, sh3, 4);
  std::uint64_t all = 0, head = 0;
  for (const auto& b : bp.buckets()) {
    all += static_cast<std::uint64_t>(b.chunk);
    if (b.last_segment == c.n_layers) head = static_cast<std::uint64_t>(b.chunk);
  }
  const std::uint64_t scalars = 3 * comm::ring_all_reduce_bytes(1, 8, N, 0);
  for (std::int64_t k : {1, 3}) {
    const plan::comm_options o{4, 2, k, 0};
    CHECK(plan::plan_comm(c, sh3, o).bytes_per_step() ==
          scalars + (N - 1) * (all * 4 + k * (all + all - head) * 2));
    // Stages 0-2 send the same bytes for any k (no_sync until the last micro-batch).
    for (int z = 0; z <= 2; ++z)
      CHECK(plan::plan_comm(c, {z, N}, o).bytes_per_step() ==
            plan::plan_comm(c, {z, N}, {4, 2, 1, 0}).bytes_per_step());
  }
}

TEST_CASE("ideal gradient accumulation: zero 0-1 reduce once, zero 2 every micro-batch",
          "[plan][comm]") {
  const std::int64_t n = 4096;
  const plan::comm_options k4{4, 2, 4, 0};
  const plan::comm_options k1{4, 2, 1, 0};
  CHECK(plan::plan_comm(n, {0, 4}, k4).bytes_per_step() ==
        plan::plan_comm(n, {0, 4}, k1).bytes_per_step());
  CHECK(plan::plan_comm(n, {1, 4}, k4).bytes_per_step() ==
        plan::plan_comm(n, {1, 4}, k1).bytes_per_step());
  const std::uint64_t rs = comm::ring_scatter_gather_bytes(1024, 4, 4),
                      ag = comm::ring_scatter_gather_bytes(1024, 2, 4);
  CHECK(plan::plan_comm(n, {2, 4}, k4).bytes_per_step() == 4 * rs + ag);
  CHECK(plan::plan_comm(n, {3, 4}, k4).bytes_per_step() == 4 * (rs + 2 * ag));
}

TEST_CASE("the plan equals the bytes a local communicator counts", "[plan][comm]") {
  // Runs the step's collectives (float32 on the wire for every one) on 4
  // threads over a flat buffer whose size 4 does not divide, and compares
  // every rank's counters with plan_comm for that rank.
  const std::int64_t n = 1003;
  const int N = 4;
  comm::comm_options co;
  co.timeout = std::chrono::seconds(20);
  for (int z = 0; z <= 3; ++z) {
    INFO("zero " << z);
    REQUIRE_NOTHROW(comm::local_world::run(
        N,
        [&](comm::local_communicator& cc) {
          const auto p = plan::plan_comm(n, {z, N}, {4, 4, 2, cc.rank()});
          const std::size_t chunk = comm::padded_count(n, N) / N;
          std::vector<float> full(chunk * N, 1.0f), shard(chunk, 1.0f);
          for (const auto& c : p.collectives)
            for (std::int64_t i = 0; i < c.calls; ++i) {
              if (c.op == comm::op_kind::all_reduce)
                cc.all_reduce(full.data(), static_cast<std::size_t>(n), comm::reduce_op::sum);
              else if (c.op == comm::op_kind::reduce_scatter)
                cc.reduce_scatter(full.data(), shard.data(), chunk, comm::reduce_op::sum);
              else
                cc.all_gather(shard.data(), full.data(), chunk);
            }
          if (cc.bytes_sent() != p.bytes_per_step())
            throw error(tessera::detail::str("rank ", cc.rank(), " sent ", cc.bytes_sent(),
                                             " planned ", p.bytes_per_step()));
        },
        co));
  }
}

TEST_CASE("FLOPs per step reuse nn::flops_per_token; 6ND and MFU", "[plan][flops]") {
  const auto c = nn::llama_config::llama2_7b();
  const auto f = plan::plan_flops(c, 1, 4096, 2, 8);
  CHECK(f.tokens_per_rank == 8192);
  CHECK(f.tokens_global == 65536);
  CHECK(f.flops_per_token == nn::flops_per_token(c, 4096));
  CHECK(f.flops_per_rank == f.flops_per_token * 8192);
  CHECK(f.six_nd == 6.0 * static_cast<double>(c.num_params()) * 65536);
  // The model count exceeds 6N by the attention term and is below it by the
  // embedding lookup: within 15% for 7B at T = 4096.
  CHECK(std::abs(f.flops_per_rank * 8 / f.six_nd - 1) < 0.15);
  CHECK(f.mfu(2.0, 1e15) == Approx(f.flops_per_rank / 2e15).epsilon(1e-15));
  CHECK(f.mfu(0, 1e15) == 0.0);
  CHECK(f.step_seconds(1e15, f.mfu(2.0, 1e15)) == Approx(2.0).epsilon(1e-12));
  // seeds/004, section 11: 7B at 3000 tokens/s/GPU on a 312 TFLOP/s peak is
  // about 40% MFU with 6N FLOPs per token.
  plan::flops_plan seed;
  seed.flops_per_rank = 6 * 7e9 * 3000;  // one second of one GPU
  CHECK(seed.mfu(1.0, 312e12) == Approx(0.40).margin(0.005));
}

TEST_CASE("comm and FLOPs plans reject bad input", "[plan][errors]") {
  CHECK_THROWS_WITH(plan::plan_comm(100, {0, 0}), Catch::Contains("dp=0"));
  CHECK_THROWS_WITH(plan::plan_comm(100, {5, 2}), Catch::Contains("zero stage 5"));
  CHECK_THROWS_WITH(plan::plan_comm(100, {0, 2}, {4, 2, 1, 2}), Catch::Contains("rank=2"));
  CHECK_THROWS_WITH(plan::plan_comm(100, {0, 2}, {4, 2, 0, 0}), Catch::Contains("micro_batches=0"));
  CHECK_THROWS_AS(plan::plan_flops(nn::llama_config::tiny(), 0, 8), config_error);
  CHECK(plan::to_json(plan::plan_comm(100, {3, 2}))["collectives"].size() == 3);
  CHECK(plan::to_table(plan::plan_comm(100, {0, 2})).find("all_reduce") != std::string::npos);
}

}  // namespace test_plan_step
