// The planner under context parallelism: what a training forward leaves
// for its backward on a cp rank (the allocator's bytes after the forward)
// equals the planner's activation_plan::saved and the model's count, and
// is the cp = 1 figure divided by cp; the high-water mark of the forward
// and backward is the planner's peak; the bytes a rank sends on its cp
// group in a training step (its communicator's counters) equal
// plan_cp_bytes, ring and Ulysses, with activation checkpointing, with
// tensor parallelism beside it.
#include <catch2/catch.hpp>

#include <omp.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <mutex>
#include <vector>

#include "tessera/comm/device_mesh.hpp"
#include "tessera/comm/local.hpp"
#include "tessera/nn/context_parallel.hpp"
#include "tessera/nn/llama.hpp"
#include "tessera/nn/tensor_parallel.hpp"
#include "tessera/plan/activations.hpp"
#include "tessera/plan/step.hpp"
#include "tessera/train/trainer.hpp"

namespace test_plan_context_parallel {

using namespace tessera;
using nn::cp_kind;

namespace {

comm::comm_options options() {
  comm::comm_options o;
  o.timeout = std::chrono::seconds(60);
  return o;
}

}  // namespace

TEST_CASE("planned saved activations under cp equal the allocator's bytes", "[plan][cp]") {
  using P = precision::fp32;
  const auto c = nn::llama_config::tiny();
  const std::int64_t B = 2, S = 24;
  for (const int cp : {2, 3})
    for (const cp_kind kind : {cp_kind::ring, cp_kind::ulysses}) {
      if (kind == cp_kind::ulysses && c.n_heads % cp != 0) continue;
      std::mutex mu;
      comm::local_world::run(
          cp,
          [&](comm::local_communicator& g) {
            omp_set_num_threads(1);  // the kernels' per-thread scratch, as planned
            host_memory_resource mr;
            kernels::host_context ctx{&mr};
            ctx.threads = 1;
            nn::llama<P> m(c, {}, ctx, nn::dense_layers{});
            const nn::cp_attention_over<comm::local_communicator, kernels::host_context, float,
                                        float>
                cpa(nn::context_parallel_attention<comm::local_communicator>{&g, kind});
            m.set_context_parallel(&cpa);
            m.init_weights(3);
            const std::int64_t T = S / cp;  // this rank's tokens
            std::vector<std::int32_t> ids(static_cast<std::size_t>(B * T));
            for (std::size_t i = 0; i < ids.size(); ++i)
              ids[i] = static_cast<std::int32_t>(
                  (i * 2654435761u + static_cast<std::size_t>(g.rank())) % 32);
            auto in = kernels::make_tensor<std::int32_t>(ctx, B * T);
            auto tg = kernels::make_tensor<std::int32_t>(ctx, B * T);
            auto loss = kernels::make_tensor<double>(ctx, 1);
            ctx.from_host(in.data(), ids.data(), ids.size() * sizeof(std::int32_t));
            ctx.from_host(tg.data(), ids.data(), ids.size() * sizeof(std::int32_t));
            nn::llama<P>::record r;
            const std::uint64_t before = mr.stats().allocated;
            mr.reset_peak();
            m.forward({in.data(), tg.data(), nullptr, B, T}, r, 1.0f / (B * S), loss.data());
            const std::uint64_t held = mr.stats().allocated - before;
            m.backward(r);
            const std::uint64_t peak = mr.stats().peak_allocated - before;
            plan::activation_options o;
            o.micro_batch = B;
            o.seq = S;
            o.cp = cp;
            o.cp_kind = kind;
            const auto a = plan::plan_activations(c, plan::dtype_sizes::of<P>(), o);
            plan::activation_options whole = o;
            whole.cp = 1;
            const auto one = plan::plan_activations(c, plan::dtype_sizes::of<P>(), whole);
            std::lock_guard<std::mutex> lock(mu);
            INFO("cp " << cp << " " << nn::to_string(kind) << " rank " << g.rank());
            CHECK(held == static_cast<std::uint64_t>(m.record_bytes(B, T)));
            CHECK(a.saved == held);
            CHECK(a.peak == peak);  // the cp layer's workspace and its kernels' scratch included
            CHECK(a.tokens == B * T);
            CHECK(a.saved * static_cast<std::uint64_t>(cp) == one.saved);  // every term per token
          },
          options());
    }
}

TEST_CASE("plan_cp_bytes equals the bytes a cp rank sends in a training step", "[plan][cp]") {
  using P = precision::fp32;
  auto model = nn::llama_config::tiny();
  model.vocab = 256;
  struct setup {
    int cp, tp;
    cp_kind kind;
    bool checkpointing;
  };
  for (const setup su : {setup{2, 1, cp_kind::ring, false}, setup{2, 1, cp_kind::ulysses, false},
                         setup{4, 1, cp_kind::ring, true}, setup{2, 2, cp_kind::ring, false},
                         setup{2, 2, cp_kind::ulysses, true}}) {
    train::train_config cfg;
    cfg.steps = 2;
    cfg.warmup = 1;
    cfg.global_batch = 4;
    cfg.micro_batch = 2;
    cfg.seq = 16;
    cfg.cp = su.cp;
    cfg.tp = su.tp;
    cfg.cp_kind = su.kind;
    cfg.eval_windows = 4;
    if (su.checkpointing) cfg.checkpointing = {nn::activation_checkpointing::full, 2};
    // a corpus of 4096 byte tokens
    const std::string path = "/tmp/tessera_plan_cp_" + std::to_string(::getpid()) + ".tok";
    std::vector<std::uint32_t> toks(4096);
    for (std::size_t i = 0; i < toks.size(); ++i)
      toks[i] = static_cast<std::uint32_t>((i * 2654435761u >> 7) % 256);
    data::write_token_file(path, toks, 256);
    const data::token_file f(path);
    plan::cp_traffic t;
    t.checkpointing = cfg.checkpointing;
    const std::int64_t A = cfg.accum_steps();
    std::mutex mu;
    comm::local_world::run(
        su.cp * su.tp,
        [&](comm::local_communicator& world) {
          auto g = comm::make_groups(
              world, comm::device_mesh(comm::mesh_degrees{.cp = su.cp, .tp = su.tp}));
          using tp_layers = nn::tensor_parallel_layers<comm::local_communicator>;
          train::trainer<P, host, optim::adamw, parallel::zero<0>, comm::local_communicator,
                         tp_layers>
              tr(model, cfg, f, parallel::layout{g, tp_layers{&g.tp}});
          g.cp.reset_stats();
          (void)tr.train_step();
          const std::uint64_t sent = g.cp.stats().of(comm::op_kind::send).bytes;
          const std::uint64_t want =
              plan::plan_cp_bytes(model, cfg.micro_batch, cfg.seq, A, su.cp, su.tp, su.kind, t);
          std::lock_guard<std::mutex> lock(mu);
          INFO("cp " << su.cp << " tp " << su.tp << " " << nn::to_string(su.kind)
                     << (su.checkpointing ? " checkpointed" : "") << " world rank "
                     << world.rank());
          CHECK(want > 0);
          CHECK(sent == want);
        },
        options());
    std::remove(path.c_str());
  }
  CHECK(plan::plan_cp_bytes(model, 2, 16, 1, 1, 1, cp_kind::ring) == 0);
  CHECK_THROWS_WITH(plan::plan_cp_bytes(model, 2, 18, 1, 2, 1, cp_kind::ring),
                    Catch::Contains("T=18 is not divisible by 2*cp=4"));
  CHECK_THROWS_WITH(plan::plan_cp_bytes(model, 2, 16, 1, 8, 1, cp_kind::ulysses),
                    Catch::Contains("cp=8 does not divide nh=4"));
}

}  // namespace test_plan_context_parallel
