// The planner under tensor parallelism: one tp rank's model, optimizer and
// engine state (weights, gradients, master weights, AdamW moments, the
// segment table, the RoPE tables) equal what that rank's allocator holds
// after building them, to the byte (the bound is 1%); the blocks' share
// shrinks by tp; plan_tp_bytes is the ring formula of four all-reduces per
// block and micro-batch.
#include <catch2/catch.hpp>

#include <chrono>
#include <mutex>

#include "tessera/comm/local.hpp"
#include "tessera/nn/llama.hpp"
#include "tessera/nn/tensor_parallel.hpp"
#include "tessera/optim/adamw.hpp"
#include "tessera/plan/memory.hpp"
#include "tessera/plan/step.hpp"

namespace test_plan_tensor_parallel {

using namespace tessera;

namespace {

template <precision::policy P>
void check_state(const nn::llama_config& c, int tp) {
  using Param = typename P::param_type;
  using Grad = typename P::grad_type;
  using Master = typename P::master_type;
  std::mutex mu;
  comm::comm_options co;
  co.timeout = std::chrono::seconds(30);
  comm::local_world::run(
      tp,
      [&](comm::local_communicator& g) {
        host_memory_resource mr;
        const kernels::host_context ctx{&mr};
        using layers = nn::tensor_parallel_layers<comm::local_communicator>;
        nn::llama<P, host, layers> m(c, {}, ctx, layers{&g});
        optim::adamw_optimizer<Param, Grad, Master, kernels::host_context> opt(
            {}, m.flat_size(), m.param_ranges(), ctx);
        plan::sharding sh;
        sh.tp = tp;
        sh.tp_rank = g.rank();
        const auto s =
            plan::plan_state(c, plan::dtype_sizes::of<P>(), plan::optimizer_spec::adamw(), sh);
        const auto one = plan::plan_state(c, plan::dtype_sizes::of<P>(),
                                          plan::optimizer_spec::adamw(), plan::sharding{});
        std::lock_guard<std::mutex> lock(mu);
        INFO(c.name << " " << P::name << " tp " << tp << " rank " << g.rank());
        const auto allocated = static_cast<double>(mr.stats().allocated);
        CHECK(std::abs(allocated - static_cast<double>(s.persistent())) <= 0.01 * allocated);
        CHECK(s.persistent() == mr.stats().allocated);  // every byte
        CHECK(s.weights == static_cast<std::uint64_t>(m.flat_size()) * sizeof(Param));
        // The blocks and the vocabulary (padded to a multiple of tp) shrink
        // by tp; the norms do not.
        const std::int64_t norms = (2 * c.n_layers + 1) * c.dim;
        const std::int64_t vocab = 2 * c.vocab * c.dim;
        const std::int64_t blocks = c.num_params() - norms - vocab;
        const std::int64_t Vl = (c.vocab + tp - 1) / tp;
        CHECK(m.num_params() == norms + 2 * Vl * c.dim + blocks / tp);
        CHECK(s.num_params == m.num_params());
        CHECK(s.weights < one.weights);
      },
      co);
}

}  // namespace

TEST_CASE("planned per-rank state under tp equals the allocator's bytes", "[plan][tp]") {
  check_state<precision::fp32>(nn::llama_config::small(), 2);
  check_state<precision::fp64>(nn::llama_config::tiny(), 2);
  auto mha = nn::llama_config::small();
  mha.n_kv_heads = 4;
  check_state<precision::fp32>(mha, 4);
}

TEST_CASE("plan_tp_bytes: the ring formula of every tp all-reduce of a step", "[plan][tp]") {
  const auto c = nn::llama_config::llama2_7b();
  const std::int64_t B = 1, T = 4096, A = 2;
  const double n = static_cast<double>(B * T * c.dim);
  plan::tp_traffic t;
  t.act = 2;       // bf16 activations (NCCL moves them as they are)
  t.act_grad = 4;  // float activation gradients
  t.accum = 4;
  t.ce_chunk = 256;
  for (int tp : {2, 4, 8}) {
    // 2(tp-1)/tp m elements per all-reduce of m elements (seeds/004)
    const double f = 2.0 * (tp - 1) / tp;
    const double per_mb = f * n * 2 * (2 * c.n_layers + 1) + f * n * 4 * (2 * c.n_layers + 1) +
                          f * 4 * 3 * static_cast<double>(B * T);  // 16 chunks of 256 rows
    const double want = per_mb * A + f * 8;
    const auto got = plan::plan_tp_bytes(c, B, T, A, tp, 0, t);
    INFO("tp " << tp);
    CHECK(std::abs(static_cast<double>(got) - want) <= 64.0);  // uneven ring chunks of tiny buffers
  }
  CHECK(plan::plan_tp_bytes(c, B, T, A, 1, 0, t) == 0);
  plan::tp_traffic full = t;
  full.checkpointing = {nn::activation_checkpointing::full, 1};
  const double f2 = 1.0;  // tp 2
  // One more per recomputed block: the recompute reruns the attention
  // output's all-reduce and stops before the down projection (the trainer
  // test measures it).
  CHECK(static_cast<double>(plan::plan_tp_bytes(c, B, T, 1, 2, 0, full) -
                            plan::plan_tp_bytes(c, B, T, 1, 2, 0, t)) ==
        f2 * n * 2 * static_cast<double>(c.n_layers));
  CHECK_THROWS_WITH(plan::plan_tp_bytes(c, B, T, A, 2, 2, t), Catch::Contains("rank 2"));
}

TEST_CASE("plan_tp_bytes: sequence parallelism moves the all-reduces' bytes and more",
          "[plan][tp][sp]") {
  // Korthikanti et al. 2022: an all-reduce is a reduce-scatter plus an
  // all-gather, so replacing each by its halves moves the same ring bytes;
  // the backward also gathers each norm output again (activation elements)
  // and all-reduces the gains' gradients.
  const auto c = nn::llama_config::llama2_7b();
  const std::int64_t B = 1, T = 4096;
  const double n = static_cast<double>(B * T * c.dim), L = static_cast<double>(c.n_layers);
  plan::tp_traffic t;
  t.act = 2;
  t.act_grad = 4;
  plan::tp_traffic sp = t;
  sp.sequence_parallel = true;
  for (int tp : {2, 4, 8}) {
    const double half = static_cast<double>(tp - 1) / tp * n;  // one all-gather or reduce-scatter
    const double extra = 2 * L * half * 2 +                   // the norm outputs gathered again
                         (2 * L + 1) * 2.0 * (tp - 1) / tp * static_cast<double>(c.dim) * 4;
    const double got = static_cast<double>(plan::plan_tp_bytes(c, B, T, 1, tp, 1, sp)) -
                       static_cast<double>(plan::plan_tp_bytes(c, B, T, 1, tp, 1, t));
    INFO("tp " << tp);
    CHECK(std::abs(got - extra) <= 64.0);
  }
  CHECK_THROWS_WITH(plan::plan_tp_bytes(c, B, 4095, 1, 2, 0, sp),
                    Catch::Contains("T=4095") && Catch::Contains("tp=2"));
}

TEST_CASE("plan_kv_replica_bytes: wk and wv summed over the ranks sharing a head",
          "[plan][tp]") {
  auto c = nn::llama_config::llama2_7b();
  c.n_kv_heads = 4;  // tp 8: each head on 2 ranks
  const double n = static_cast<double>(c.head_dim() * c.dim);
  // 2 tensors per block, per micro-batch, a 2-rank ring: 2 (2-1)/2 n floats
  CHECK(static_cast<double>(plan::plan_kv_replica_bytes(c, 3, 8, 5)) ==
        3 * static_cast<double>(c.n_layers) * 2 * n * 4);
  CHECK(plan::plan_kv_replica_bytes(c, 3, 4, 1) == 0);  // tp divides nkv: nothing shared
  CHECK_THROWS_WITH(plan::plan_kv_replica_bytes(c, 1, 6, 0), Catch::Contains("tp=6"));
}

TEST_CASE("planned saved activations under tp, sequence parallelism and replicated heads",
          "[plan][tp][sp]") {
  // What a training forward leaves for its backward, three ways: the
  // allocator's bytes after the forward, the model's count
  // (llama::record_bytes) and the planner's (activation_plan::saved).
  struct setup {
    int tp;
    bool sp;
  };
  for (const setup su : {setup{2, false}, setup{2, true}, setup{4, true}}) {
    const auto c = nn::llama_config::tiny();  // tp 4 > nkv 2: replicated heads
    const std::int64_t B = 2, T = 12;
    std::mutex mu;
    comm::comm_options co;
    co.timeout = std::chrono::seconds(30);
    comm::local_world::run(
        su.tp,
        [&](comm::local_communicator& g) {
          host_memory_resource mr;
          kernels::host_context ctx{&mr};
          ctx.threads = 1;
          using layers = nn::tensor_parallel_layers<comm::local_communicator>;
          layers l{&g};
          l.sequence_parallel = su.sp;
          nn::llama<precision::fp32, host, layers> m(c, {}, ctx, l);
          m.init_weights(3);
          std::vector<std::int32_t> ids(static_cast<std::size_t>(B * T), 5);
          auto in = kernels::make_tensor<std::int32_t>(ctx, B * T);
          auto tg = kernels::make_tensor<std::int32_t>(ctx, B * T);
          auto loss = kernels::make_tensor<double>(ctx, 1);
          ctx.from_host(in.data(), ids.data(), ids.size() * sizeof(std::int32_t));
          ctx.from_host(tg.data(), ids.data(), ids.size() * sizeof(std::int32_t));
          typename nn::llama<precision::fp32, host, layers>::record r;
          const std::uint64_t before = mr.stats().allocated;
          m.forward({in.data(), tg.data(), nullptr, B, T}, r, 1.0f / (B * T), loss.data());
          const std::uint64_t held = mr.stats().allocated - before;
          m.backward(r);
          plan::activation_options o;
          o.micro_batch = B;
          o.seq = T;
          o.tp = su.tp;
          o.sequence_parallel = su.sp;
          const auto a = plan::plan_activations(c, plan::dtype_sizes::of<precision::fp32>(), o);
          std::lock_guard<std::mutex> lock(mu);
          INFO("tp " << su.tp << (su.sp ? " sequence-parallel" : "") << " rank " << g.rank());
          CHECK(held == static_cast<std::uint64_t>(m.record_bytes(B, T)));
          CHECK(a.saved == held);
        },
        co);
  }
}

}  // namespace test_plan_tensor_parallel
