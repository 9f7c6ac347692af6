// Tests plan/cuda_step.hpp on the host: the one-GPU step's state is 18
// bytes per parameter, activations follow the checkpointing policy and the
// activation-gradient type, fp16_mixed plans as bf16_mixed_bf16_grads and
// fp8_mixed as bf16_mixed plus the CUDA FP8 linear's buffers and scales,
// and the full llama2_7b step at T 4096, micro-batch 1 fits one 141 GB
// H200. (tests/cuda/llama.cpp holds the plan to the device allocator's
// bytes.)
#include <catch2/catch.hpp>

#include <tessera/kernels/detail/adamw.hpp>
#include <tessera/nn/llama_layout.hpp>
#include <tessera/nn/transformer_block.hpp>
#include <tessera/plan/cuda_step.hpp>

namespace test_plan_cuda_step {

using namespace tessera;

TEST_CASE("plan_cuda_step: state is 2 + 4 + 4 + 8 bytes per flat element", "[plan]") {
  for (const auto& c :
       {nn::llama_config::small(), nn::llama_config::llama2_7b(), nn::llama_config::llama3_8b()}) {
    INFO(c.name);
    plan::cuda_step_options o;
    o.seq = 256;
    const auto p = plan::plan_cuda_step(c, o);
    const auto n = static_cast<std::uint64_t>(nn::make_llama_layout(c).total());
    CHECK(p.state.flat_elems == static_cast<std::int64_t>(n));
    CHECK(p.state.weights == 2 * n);
    CHECK(p.state.grads == 4 * n);
    CHECK(p.state.master == 4 * n);
    CHECK(p.state.optimizer == 8 * n);
    CHECK(p.state.reduce_buffers == 0);  // one rank: nothing staged for a reduction
    // One 40-byte optimizer segment per tensor (kernels::optimizer_segment).
    CHECK(p.state.segment_table ==
          sizeof(kernels::optimizer_segment) * nn::make_llama_layout(c).entries().size());
    CHECK(sizeof(kernels::optimizer_segment) == 40);
    // Flat elements exceed the parameters only by alignment padding.
    CHECK(n - static_cast<std::uint64_t>(c.num_params()) <
          16 * nn::make_llama_layout(c).entries().size());
    CHECK(p.context == std::uint64_t(32) << 20);  // the cuBLASLt workspace
    // The loader's two device buffers (inputs and targets of N int32 each),
    // the step's scalars: norm, one loss, the clip coefficient.
    CHECK(p.trainer == 2 * 2 * 256 * 4 + 2 * 8 + 4);
  }
}

TEST_CASE("plan_cuda_step: full checkpointing keeps L block inputs", "[plan]") {
  const auto c = nn::llama_config::llama2_7b();
  plan::cuda_step_options o;
  o.seq = 4096;
  o.checkpointing = {};
  const auto none = plan::plan_cuda_step(c, o);
  o.checkpointing = {nn::activation_checkpointing::full, 1};
  const auto full = plan::plan_cuda_step(c, o);
  const std::uint64_t N = 4096, H = 4096, F = 11008, KV = 4096, nh = 32, L = 32;
  // Independent count of one block's record: bf16 x_in, xn1, q, att, x_mid,
  // xn2 (N,H), k, v (N,KV), gate, up, h (N,F); float rstd1, rstd2, lse.
  const std::uint64_t record = 2 * N * (6 * H + 2 * KV + 3 * F) + 4 * N * (2 + nh);
  // The rest of the record: ids (4 N) and the head's bf16 input gradient (2 N H).
  const std::uint64_t rest = 4 * N + 2 * N * H;
  CHECK(none.activations.saved == L * record + rest);
  CHECK(full.activations.saved == L * N * H * 2 + rest);
  CHECK(none.state.model_state() == full.state.model_state());
  // Checkpointing holds L records without their inputs fewer; at the peak,
  // the block being recomputed holds one again.
  CHECK(none.activations.peak > full.activations.peak + (L - 2) * (record - N * H * 2));
}

TEST_CASE("plan_cuda_step: float32 activation gradients cost their bytes", "[plan]") {
  const auto c = nn::llama_config::small();
  plan::cuda_step_options o;
  o.seq = 256;
  o.micro_batch = 4;
  const auto bf16g = plan::plan_cuda_step(c, o);
  o.precision = "bf16_mixed";
  const auto f32g = plan::plan_cuda_step(c, o);
  const auto N = static_cast<std::int64_t>(4 * 256);
  // The head's input gradient is float32: 2 more bytes per element in the record.
  CHECK(f32g.activations.saved - bf16g.activations.saved ==
        static_cast<std::uint64_t>(N * c.dim * 2));
  CHECK(f32g.activations.peak > bf16g.activations.peak);
  CHECK(f32g.state.model_state() == bf16g.state.model_state());
}

TEST_CASE("plan_cuda_step: fp16_mixed plans as bf16_mixed_bf16_grads", "[plan]") {
  // 16-bit weights, activations and activation gradients, 2 bytes each, and
  // float32 gradients, master weights and moments: the same bytes.
  static_assert(sizeof(precision::fp16_mixed::param_type) == 2 &&
                sizeof(precision::fp16_mixed::act_grad_type) == 2);
  for (const auto& c : {nn::llama_config::small(), nn::llama_config::llama2_7b()}) {
    INFO(c.name);
    plan::cuda_step_options o;
    o.seq = 256;
    o.micro_batch = 2;
    const auto bf = plan::plan_cuda_step(c, o);
    o.precision = "fp16_mixed";
    const auto fp = plan::plan_cuda_step(c, o);
    CHECK(fp.rows() == bf.rows());
    CHECK(fp.total() == bf.total());
    CHECK(fp.fp8.total() == 0);
  }
}

TEST_CASE("plan_cuda_step: fp8_mixed adds the CUDA FP8 linear's buffers to bf16_mixed", "[plan]") {
  // fp8_mixed stores its policy's types, bf16_mixed's: bf16 weights and
  // activations, float32 activation gradients.
  static_assert(std::is_same_v<precision::fp8_mixed::param_type, bf16> &&
                std::is_same_v<precision::fp8_mixed::act_grad_type, float>);
  for (const auto& c : {nn::llama_config::llama2_7b(), nn::llama_config::llama3_8b()}) {
    INFO(c.name);
    plan::cuda_step_options o;
    o.seq = 4096;
    o.precision = "bf16_mixed";
    const auto bf = plan::plan_cuda_step(c, o);
    o.precision = "fp8_mixed";
    const auto p = plan::plan_cuda_step(c, o);
    const auto n = static_cast<std::uint64_t>(nn::make_llama_layout(c).total());
    CHECK(p.state.weights == 2 * n);
    CHECK(p.state.model_state() == bf.state.model_state());
    CHECK(p.activations.peak == bf.activations.peak);
    // Independently of the layout: M = 4096 tokens; for both presets the
    // largest GEMM's operands are a SwiGLU gate or up layer's backward to
    // its input, dy (M, F) and W (F, H) (F > H >= the query and key/value
    // widths, and M = 4096 >= H): one byte each, one GEMM at a time.
    const std::uint64_t M = 4096, H = static_cast<std::uint64_t>(c.dim),
                        F = static_cast<std::uint64_t>(c.ffn_dim),
                        L = static_cast<std::uint64_t>(c.n_layers);
    CHECK(p.fp8.operands == M * F + F * H);
    // Fifteen device floats per linear (scale, inverse, step amax, amax,
    // evaluation scale of x, W, dy); the histories are host memory.
    CHECK(p.fp8.scalars == L * 7 * 15 * 4);
    CHECK(p.fp8.state == 0);
    CHECK(p.fp8.blocks == c.n_layers);
    CHECK(p.persistent() == bf.persistent() + p.fp8.scalars);
    CHECK(p.total() == bf.total() + p.fp8.scalars + p.fp8.operands);
    CHECK(p.to_table().find("fp8 operand copies") != std::string::npos);
    CHECK(p.to_json()["fp8"]["operands"].get<std::uint64_t>() == p.fp8.operands);
  }
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
  // Without checkpointing the records take ~16 GB more.
  o.checkpointing = {};
  CHECK(plan::plan_cuda_step(c, o).total() > p.total() + std::uint64_t(15) * 1000000000);
}

TEST_CASE("plan_cuda_step rejects bad sizes and host-only policies", "[plan]") {
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
  o.ce_chunk = 16;
  o.precision = "fp32";
  CHECK_THROWS_WITH(plan::plan_cuda_step(c, o), Catch::Contains("16-bit weights"));
  o.precision = "bf16_mixed";
  // Every optimizer policy runs on the GPU; an unknown name is refused
  // with the list.
  for (const char* name : {"sgd", "lion", "adafactor", "muon"}) {
    o.optimizer = name;
    CHECK_NOTHROW(plan::plan_cuda_step(c, o));
  }
  o.optimizer = "rmsprop";
  CHECK_THROWS_WITH(plan::plan_cuda_step(c, o),
                    Catch::Contains("unknown optimizer 'rmsprop'") &&
                        Catch::Contains("adamw, sgd, lion, adafactor, muon"));
}

}  // namespace test_plan_cuda_step
