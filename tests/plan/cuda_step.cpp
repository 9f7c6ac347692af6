// Tests plan/cuda_step.hpp on the host: the one-GPU step's state is 18
// bytes per parameter, activations follow the checkpointing policy, and the
// full llama2_7b step at T 4096, micro-batch 1 fits one 141 GB H200.
// (tests/cuda/llama.cpp holds the plan to the device allocator's bytes.)
#include <catch2/catch.hpp>

#include <tessera/nn/llama_layout.hpp>
#include <tessera/plan/cuda_step.hpp>

using namespace tessera;

TEST_CASE("plan_cuda_step: state is 2 + 4 + 4 + 8 bytes per flat element", "[plan]") {
  for (const auto& c : {nn::llama_config::small(), nn::llama_config::llama2_7b(),
                        nn::llama_config::llama3_8b()}) {
    INFO(c.name);
    plan::cuda_step_options o;
    o.seq = 256;
    const auto p = plan::plan_cuda_step(c, o);
    const auto n = static_cast<std::uint64_t>(nn::make_llama_layout(c).total());
    CHECK(p.params == static_cast<std::int64_t>(n));
    CHECK(p.weights == 2 * n);
    CHECK(p.grads == 4 * n);
    CHECK(p.master == 4 * n);
    CHECK(p.moments == 8 * n);
    // Flat elements exceed the parameters only by alignment padding.
    CHECK(n - static_cast<std::uint64_t>(c.num_params()) <
          16 * nn::make_llama_layout(c).entries().size());
    CHECK(p.total() == p.state() + p.activations());
  }
}

TEST_CASE("plan_cuda_step: full checkpointing keeps L block inputs and one record",
          "[plan]") {
  const auto c = nn::llama_config::llama2_7b();
  plan::cuda_step_options o;
  o.seq = 4096;
  o.checkpointing = nn::activation_checkpointing::none;
  const auto none = plan::plan_cuda_step(c, o);
  o.checkpointing = nn::activation_checkpointing::full;
  const auto full = plan::plan_cuda_step(c, o);
  const std::uint64_t N = 4096, H = 4096, F = 11008, KV = 4096, nh = 32, L = 32;
  // Independent count of one block's record: bf16 x_in, xn1, q, att, x_mid,
  // xn2 (N,H), k, v (N,KV), gate, up, h (N,F); float rstd1, rstd2, lse.
  const std::uint64_t record = 2 * N * (6 * H + 2 * KV + 3 * F) + 4 * N * (2 + nh);
  CHECK(none.checkpoints == L * record);
  CHECK(none.work_record == 0);
  CHECK(full.checkpoints == L * N * H * 2);
  CHECK(full.work_record == record - N * H * 2);
  CHECK(none.state() == full.state());
  // Checkpointing saves (L - 1) records without their inputs.
  CHECK(none.activations() - full.activations() == (L - 1) * (record - N * H * 2));
}

TEST_CASE("plan_cuda_step: the full llama2_7b step fits one 141 GB H200", "[plan]") {
  const auto c = nn::llama_config::llama2_7b();
  plan::cuda_step_options o;
  o.micro_batch = 1;
  o.seq = 4096;
  const auto p = plan::plan_cuda_step(c, o);
  const double gb = static_cast<double>(p.total()) / 1e9;
  INFO("planned " << gb << " GB");
  // 18 bytes x 6.74e9 parameters = 121.3 GB of state, a few GB of activations.
  CHECK(gb > 121.0);
  CHECK(gb < 141.0 * 0.95);  // at least 5% margin on 141 GB
  // Without checkpointing 31 more records (~16 GB) leave ~1% margin.
  o.checkpointing = nn::activation_checkpointing::none;
  CHECK(plan::plan_cuda_step(c, o).total() > p.total() + std::uint64_t(15) * 1000000000);
}

TEST_CASE("plan_cuda_step rejects bad sizes", "[plan]") {
  const auto c = nn::llama_config::small();
  plan::cuda_step_options o;
  o.micro_batch = 0;
  CHECK_THROWS_AS(plan::plan_cuda_step(c, o), config_error);
  o.micro_batch = 1;
  o.seq = c.max_seq + 1;
  CHECK_THROWS_AS(plan::plan_cuda_step(c, o), config_error);
  o.seq = -1;
  CHECK_THROWS_AS(plan::plan_cuda_step(c, o), config_error);
  o.seq = 16;
  o.ce_chunk = 0;
  CHECK_THROWS_AS(plan::plan_cuda_step(c, o), config_error);
}
