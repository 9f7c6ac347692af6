// Tests include/tessera/plan/memory.hpp: seeds/004's ZeRO table and 16 bytes
// per parameter reproduced, and the planner held against what a real model
// and optimizer allocate from a host_memory_resource (persistent state) and
// what one forward_backward adds at its peak (activations).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <vector>

#include "tessera/kernels/attention.hpp"
#include "tessera/kernels/gemm.hpp"
#include "tessera/nn/llama.hpp"
#include "tessera/optim/adamw.hpp"
#include "tessera/plan/memory.hpp"

namespace test_plan_memory {

using namespace tessera;

namespace {
std::vector<std::int32_t> random_tokens(std::int64_t B, std::int64_t T, std::int64_t V,
                                        std::uint64_t seed) {
  rng r(seed);
  std::vector<std::int32_t> t(static_cast<std::size_t>(B * (T + 1)));
  for (auto& x : t) x = static_cast<std::int32_t>(r.next_u64() % static_cast<std::uint64_t>(V));
  return t;
}
double rel_diff(double a, double b) {
  return std::abs(a - b) / std::max(std::abs(b), 1.0);
}
}  // namespace

TEST_CASE("seeds/004's ZeRO table for 7B on 8 GPUs: 104, 36, 24, 13 GiB", "[plan]") {
  const auto d = plan::dtype_sizes::seed004();
  const std::int64_t N = 7'000'000'000;  // the seed's "7B"
  const long expected[] = {104, 36, 24, 13};
  for (int z = 0; z <= 3; ++z) {
    const auto s = plan::plan_state(N, d, plan::optimizer_spec::adamw(), {z, 8});
    const double got = static_cast<double>(s.model_state()) / plan::gib;
    INFO("zero " << z << ": " << got << " GiB");
    // 8 divides 7e9, so the shard arithmetic is exact and equals the seed's float division.
    CHECK(rel_diff(got, plan::seed004_training_memory_gib(7e9, 8, z)) < 1e-15);
    CHECK(std::lround(got) == expected[z]);  // the seed's bar chart labels
  }
  // Exact bytes: 16, 5.5, 3.75 and 2 bytes per parameter.
  CHECK(plan::plan_state(N, d, {}, {0, 8}).model_state() == 112'000'000'000ull);
  CHECK(plan::plan_state(N, d, {}, {1, 8}).model_state() == 38'500'000'000ull);
  CHECK(plan::plan_state(N, d, {}, {2, 8}).model_state() == 26'250'000'000ull);
  CHECK(plan::plan_state(N, d, {}, {3, 8}).model_state() == 14'000'000'000ull);
}

TEST_CASE("the same table from the real llama2_7b layout: 100, 35, 24, 13 GiB", "[plan]") {
  const auto c = nn::llama_config::llama2_7b();
  const auto d = plan::dtype_sizes::seed004();
  const long expected[] = {100, 35, 24, 13};
  for (int z = 0; z <= 3; ++z) {
    // The seed's textbook accounting over the real layout (the engine's own
    // figures, with reduction buffers and full gradients, are tested in
    // tests/parallel/memory.cpp).
    const auto s = plan::plan_state_ideal(c, d, plan::optimizer_spec::adamw(), {z, 8});
    CHECK(s.num_params == 6'738'415'616);
    CHECK(s.flat_elems ==
          s.num_params);  // every 7B tensor is a multiple of the 16-element alignment
    const double got = static_cast<double>(s.model_state()) / plan::gib;
    INFO("zero " << z << ": " << got << " GiB");
    CHECK(rel_diff(got, plan::seed004_training_memory_gib(6738415616.0, 8, z)) < 1e-15);
    CHECK(std::lround(got) == expected[z]);
  }
}

TEST_CASE("bytes per parameter: 16 for seed004 and fp32, 18 for bf16_mixed", "[plan]") {
  const std::int64_t N = 1'000'003;
  auto per_param = [&](const plan::dtype_sizes& d) {
    return static_cast<double>(plan::plan_state(N, d, {}, {}).model_state()) / N;
  };
  CHECK(per_param(plan::dtype_sizes::seed004()) == 16.0);
  CHECK(per_param(plan::dtype_sizes::of<precision::fp32>()) == 16.0);  // 4 + 4 + 2 x 4, no master
  CHECK(per_param(plan::dtype_sizes::of<precision::bf16_mixed>()) == 18.0);  // 2 + 4 + 3 x 4
  CHECK(per_param(plan::dtype_sizes::of<precision::fp64>()) == 32.0);
  // The optimizer's own count: master + moments per parameter.
  auto state = [&](const plan::dtype_sizes& d) {
    auto s = plan::plan_state(N, d, plan::optimizer_spec::adamw(), {});
    return (s.master + s.optimizer) / static_cast<std::uint64_t>(N);
  };
  CHECK(state(plan::dtype_sizes::of<precision::fp32>()) ==
        optim::adamw_optimizer<float, float, float, kernels::host_context>::state_bytes_per_param);
  CHECK(state(plan::dtype_sizes::of<precision::bf16_mixed>()) ==
        optim::adamw_optimizer<bf16, float, float, kernels::host_context>::state_bytes_per_param);
  CHECK(
      state(plan::dtype_sizes::of<precision::fp64>()) ==
      optim::adamw_optimizer<double, double, double, kernels::host_context>::state_bytes_per_param);
}

TEST_CASE("ideal accounting: ZeRO shards are ceil(flat / dp) of the padded flat buffer", "[plan]") {
  const auto c = nn::llama_config::tiny();
  const auto layout = nn::make_llama_layout(c);
  const auto d = plan::dtype_sizes::of<precision::bf16_mixed>();
  for (int dp : {1, 3, 7, 8}) {
    for (int z = 0; z <= 3; ++z) {
      const auto s = plan::plan_state_ideal(c, d, {}, {z, dp});
      const std::int64_t shard = (layout.total() + dp - 1) / dp;
      INFO("dp " << dp << " zero " << z);
      CHECK(s.flat_elems == layout.total());
      CHECK(s.shard_elems == shard);
      CHECK(s.padded_elems == shard * dp);
      const auto rep = static_cast<std::uint64_t>(z == 0 ? s.flat_elems : s.padded_elems);
      const auto sh = static_cast<std::uint64_t>(shard);
      CHECK(s.weights == (z == 3 ? sh : rep) * 2);
      CHECK(s.grads == (z >= 2 ? sh : rep) * 4);
      CHECK(s.master == (z >= 1 ? sh : rep) * 4);
      CHECK(s.optimizer == (z >= 1 ? sh : rep) * 8);
      CHECK((s.gathered > 0) == (z == 3));
    }
  }
}

TEST_CASE("ZeRO-3 gathers the largest unit: a block for Llama 2, the head for Llama 3", "[plan]") {
  const auto d = plan::dtype_sizes::of<precision::bf16_mixed>();
  const auto l2 = nn::llama_config::llama2_7b();
  // Engine: the two adjacent segments held with prefetch (two blocks for
  // Llama 2), in bf16; every 7B segment divides into 8 chunks of 4k elements.
  const auto s2 = plan::plan_state(l2, d, {}, {3, 8, 1});
  CHECK(s2.gather_unit_elems == l2.block_params());
  CHECK(s2.gathered == static_cast<std::uint64_t>(l2.block_params()) * 2 * 2);
  CHECK(s2.reduce_staging == static_cast<std::uint64_t>(s2.padded_elems) * 4);
  const auto l3 = nn::llama_config::llama3_8b();
  const auto s3 = plan::plan_state(l3, d, {}, {3, 8, 0});
  CHECK(s3.gather_unit_elems == l3.vocab * l3.dim + l3.dim);  // final_norm + lm_head
  CHECK(s3.gathered == static_cast<std::uint64_t>(s3.gather_unit_elems) * 2);
  // Ideal: (1 + prefetch) units in bf16 and one unit's gradient in float32.
  const auto i2 = plan::plan_state_ideal(l2, d, {}, {3, 8, 1});
  CHECK(i2.gathered == static_cast<std::uint64_t>(l2.block_params()) * (2 * 2 + 4));
  const auto i3 = plan::plan_state_ideal(l3, d, {}, {3, 8, 0});
  CHECK(i3.gathered == static_cast<std::uint64_t>(i3.gather_unit_elems) * (2 + 4));
  CHECK_THROWS_WITH(plan::plan_state(l2, d, {}, {3, 8, 2}), Catch::Contains("prefetch=2"));
}

TEST_CASE("engine accounting pads each bucket, as parallel::bucket_plan does", "[plan]") {
  // Segments equal the model's own; buckets and shards are bucket_plan's;
  // per-bucket padding differs from padding the whole buffer once.
  const auto c = nn::llama_config::tiny();
  const nn::llama<precision::fp32> m(c);
  const auto segs = plan::llama_segments(c);
  REQUIRE(segs.size() == static_cast<std::size_t>(c.n_layers + 2));
  for (const auto& g : segs) {
    CHECK(g.begin == m.segment_begin(g.id));
    CHECK(g.end == m.segment_end(g.id));
  }
  const auto d = plan::dtype_sizes::of<precision::bf16_mixed>();
  for (int dp : {1, 3, 4}) {
    for (int z = 0; z <= 3; ++z) {
      INFO("dp " << dp << " zero " << z);
      plan::sharding sh{z, dp, 1, 8 * 1024};  // several buckets below ZeRO-3
      const auto s = plan::plan_state(c, d, {}, sh);
      const parallel::bucket_plan bp(segs, dp, dp - 1, 8 * 1024 / 4, z == 3);
      CHECK(s.buckets == static_cast<std::int64_t>(bp.size()));
      CHECK(s.buckets > 1);
      CHECK(s.padded_elems == bp.staging_size());
      CHECK(s.shard_elems == bp.shard_size());
      for (const auto& b : bp.buckets()) CHECK(b.chunk % parallel::chunk_align == 0);
      const auto flat = static_cast<std::uint64_t>(s.flat_elems),
                 pad = static_cast<std::uint64_t>(s.padded_elems),
                 sh_e = static_cast<std::uint64_t>(s.shard_elems);
      const bool single = z == 0 && dp == 1;
      CHECK(s.weights == (z == 3 ? 0 : flat * 2));
      // ZeRO-1/2 update their owned elements of the model's buffer: only
      // ZeRO-3 keeps a parameter shard.
      CHECK(s.param_shard == (z == 3 ? sh_e * 2 : 0));
      // ZeRO-0/1 accumulate into the padded buffer (float32 gradients under
      // bf16_mixed: reduced in place); one rank keeps the model's own.
      CHECK(s.grads == (single ? flat * 4 : 0));
      CHECK(s.reduce_staging == (z >= 2 ? pad * 4 : 0));  // ZeRO-2/3: the window's buckets
      // The padded buffer on ZeRO-0/1 (none on one rank: it reduces
      // nothing), the reduced-gradient shard on ZeRO-2/3.
      CHECK(s.reduce_buffers == ((z <= 1 && !single ? pad : 0) + (z >= 2 ? sh_e : 0)) * 4);
      std::uint64_t largest = 0;  // the update's all-gather: one padded bucket at a time
      for (const auto& b : bp.buckets()) largest = std::max<std::uint64_t>(largest, b.padded);
      CHECK(s.update_gather == (z == 1 || z == 2 ? largest * 2 : 0));
      CHECK(s.master == (z >= 1 ? sh_e : flat) * 4);
      CHECK(s.optimizer == (z >= 1 ? sh_e : flat) * 8);
      CHECK((s.gathered > 0) == (z == 3));
      CHECK((s.reduce_staging > 0) == (z >= 2));
      CHECK((s.update_gather > 0) == (z == 1 || z == 2));
    }
  }
  // tiny at dp 3: per-bucket padding to 4-element chunks exceeds one flat pad.
  const auto e = plan::plan_state(c, d, {}, {1, 3, 1, 8 * 1024});
  CHECK(e.padded_elems > static_cast<std::int64_t>(comm::padded_count(e.flat_elems, 3)));
}

// The planner's saved bytes are the model's own report (llama::record_bytes)
// for every policy and checkpointing policy.
template <precision::policy P>
void check_saved(const nn::llama_config& c, nn::checkpoint_policy ck) {
  nn::llama_options mo;
  mo.checkpointing = ck;
  plan::activation_options ao;
  ao.micro_batch = 3;
  ao.seq = 7;
  ao.model = mo;
  const auto a = plan::plan_activations(c, plan::dtype_sizes::of<P>(), ao);
  CHECK(a.saved == static_cast<std::uint64_t>(nn::llama<P>(c, mo).record_bytes(3, 7)));
}

TEST_CASE("planner's saved bytes equal the model's for every policy", "[plan]") {
  using nn::activation_checkpointing;
  for (const auto& c : {nn::llama_config::tiny(), nn::llama_config::small()})
    for (const nn::checkpoint_policy ck :
         {nn::checkpoint_policy{}, nn::checkpoint_policy{activation_checkpointing::full, 1},
          nn::checkpoint_policy{activation_checkpointing::full, 2}}) {
      INFO(c.name << " checkpointing " << to_string(ck.mode) << " every " << ck.every);
      check_saved<precision::fp32>(c, ck);
      check_saved<precision::bf16_mixed>(c, ck);
      check_saved<precision::bf16_mixed_bf16_grads>(c, ck);
      check_saved<precision::fp64>(c, ck);
    }
}

// Builds model + AdamW over the whole flat buffer from one counted resource,
// checks the persistent bytes, then one training forward and backward's
// peak (inputs, targets and the loss outside the resource, so the resource
// sees exactly the model's allocations).
template <precision::policy P>
void check_measured(const nn::llama_config& c, std::int64_t B, std::int64_t T,
                    std::int64_t ce_chunk, nn::checkpoint_policy ck = {}) {
  using Param = typename P::param_type;
  using Grad = typename P::grad_type;
  using Master = typename P::master_type;
  INFO(c.name << " " << P::name << " B=" << B << " T=" << T << " ce_chunk=" << ce_chunk
              << " checkpointing " << to_string(ck.mode) << " every " << ck.every);
  host_memory_resource mr;
  const kernels::host_context ctx{&mr};
  nn::llama_options mo;
  mo.ce_chunk = ce_chunk;
  mo.checkpointing = ck;
  nn::llama<P> m(c, mo, ctx);
  m.init_weights(3);
  optim::adamw_optimizer<Param, Grad, Master, kernels::host_context> opt({}, m.flat_size(),
                                                                         m.param_ranges(), ctx);
  opt.init_master(m.params());

  const auto d = plan::dtype_sizes::of<P>();
  plan::activation_options ao;
  ao.micro_batch = B;
  ao.seq = T;
  ao.model = mo;
  ao.threads = kernels::detail::attention_max_threads();
  // A bare model and optimizer: one rank under ZeRO-0 is exactly what they
  // allocate (the engine adds nothing there).
  const auto plan = plan::plan_memory(c, d, plan::optimizer_spec::adamw(), {0, 1}, ao);

  // Persistent: weights + grads + master + moments + segment table + RoPE
  // tables. Tolerance 1% (the brief's bound); the components below are exact.
  const auto allocated = static_cast<double>(mr.stats().allocated);
  INFO("allocated " << allocated << " planned " << plan.state.persistent());
  CHECK(rel_diff(allocated, static_cast<double>(plan.state.persistent())) < 0.01);
  CHECK(plan.state.weights == m.flat_size() * sizeof(Param));
  CHECK(plan.state.grads == m.flat_size() * sizeof(Grad));
  CHECK(plan.state.master + plan.state.optimizer + plan.state.segment_table == opt.state_bytes());
  CHECK(plan.state.rope_tables == 2 * static_cast<std::uint64_t>(c.max_seq * c.head_dim() / 2) *
                                      sizeof(typename P::rope_type));
  CHECK(plan.state.persistent() == mr.stats().allocated);  // every byte

  // Activations: the peak of one forward and backward above the persistent
  // floor. Stated tolerance 1%; the planner walks the model's allocation
  // timeline with the modules' byte counts and matches to the byte, so the
  // exact check below flags any change to the model's saved set or
  // temporaries.
  auto tok = random_tokens(B, T, c.vocab, 11);
  std::vector<std::int32_t> in(static_cast<std::size_t>(B * T)), tgt(in.size());
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < T; ++t) {
      in[static_cast<std::size_t>(b * T + t)] = tok[static_cast<std::size_t>(b * (T + 1) + t)];
      tgt[static_cast<std::size_t>(b * T + t)] = tok[static_cast<std::size_t>(b * (T + 1) + t + 1)];
    }
  kernels::gemm_release_workspace();
  mr.reset_peak();
  const std::size_t floor = mr.stats().allocated;
  double loss = 0;
  typename nn::llama<P>::record r;
  m.forward({in.data(), tgt.data(), nullptr, B, T}, r, Grad(1) / static_cast<Grad>(B * T), &loss);
  CHECK(mr.stats().allocated - floor == plan.activations.saved);  // the record, to the byte
  m.backward(r);
  const auto peak = static_cast<double>(mr.stats().peak_allocated - floor);
  INFO("measured activation peak " << peak << " planned " << plan.activations.peak);
  CHECK(mr.stats().allocated == floor);
  CHECK(rel_diff(peak, static_cast<double>(plan.activations.peak)) < 0.01);
  CHECK(peak == static_cast<double>(plan.activations.peak));
  CHECK(plan.activations.peak > plan.activations.saved);
  // The host's bf16 GEMM conversion buffers, outside the resource.
  CHECK(kernels::gemm_workspace_bytes() == plan.activations.host_gemm_workspace);
}

TEST_CASE("measured bytes equal the plan: tiny and small, fp32 and bf16_mixed", "[plan][memory]") {
  const auto tiny = nn::llama_config::tiny(), small = nn::llama_config::small();
  check_measured<precision::fp32>(tiny, 2, 16, 256);
  check_measured<precision::fp32>(tiny, 3, 64, 40);  // CE in chunks
  check_measured<precision::bf16_mixed>(tiny, 2, 16, 256);
  check_measured<precision::fp64>(tiny, 1, 9, 4);
  check_measured<precision::fp32>(small, 2, 64, 256);
  check_measured<precision::bf16_mixed>(small, 2, 64, 32);
  check_measured<precision::bf16_mixed>(small, 1, 256, 256);
  check_measured<precision::bf16_mixed_bf16_grads>(small, 2, 64, 32);
}

TEST_CASE("activation checkpointing: the measured peak drops by what the plan predicts",
          "[plan][memory]") {
  using nn::activation_checkpointing;
  const auto small = nn::llama_config::small(), tiny = nn::llama_config::tiny();
  for (std::int64_t every : {1, 2, 3}) {
    check_measured<precision::fp32>(small, 2, 64, 256, {activation_checkpointing::full, every});
    check_measured<precision::bf16_mixed>(small, 2, 64, 32,
                                          {activation_checkpointing::full, every});
    check_measured<precision::fp64>(tiny, 1, 9, 4, {activation_checkpointing::full, every});
  }
  // The plan's drop, none to full: (L - 1) records without their inputs
  // fewer at the peak (the last block's is recomputed in backward).
  plan::activation_options ao;
  ao.micro_batch = 2;
  ao.seq = 64;
  const auto d = plan::dtype_sizes::of<precision::fp32>();
  const auto none = plan::plan_activations(small, d, ao);
  ao.model.checkpointing = {activation_checkpointing::full, 1};
  const auto full = plan::plan_activations(small, d, ao);
  const auto bb = nn::block_bytes::of(small, 4, 4, 4);
  const auto rest = static_cast<std::uint64_t>(bb.record(128) - bb.input(128));
  CHECK(none.saved - full.saved == static_cast<std::uint64_t>(small.n_layers) * rest);
  CHECK(none.peak > full.peak);
}

TEST_CASE("Korthikanti's 34sbh is reported beside our own count", "[plan]") {
  const auto c = nn::llama_config::llama2_7b();
  plan::activation_options ao;
  ao.seq = 4096;
  const auto a = plan::plan_activations(c, plan::dtype_sizes::of<precision::bf16_mixed>(), ao);
  CHECK(a.korthikanti_34sbh == 34ull * 4096 * 4096 * 32);
  // Our block saves 2(6H + 2KV + 3F) + 4(2 + nh) = 131720 bytes per token per layer vs 34H =
  // 139264; plus the ids (4) and the head's float32 input gradient (4 H) per token.
  CHECK(a.saved == (32ull * 131720 + 4 + 4 * 4096) * 4096);
  CHECK(a.logits_workspace >= 256ull * 32000 * 4);  // chunk x V x float32
}

TEST_CASE("memory plan table and JSON name every row", "[plan]") {
  plan::activation_options ao;
  ao.seq = 4096;
  const auto p = plan::plan_memory(nn::llama_config::llama2_7b(),
                                   plan::dtype_sizes::of<precision::bf16_mixed>(),
                                   plan::optimizer_spec::adamw(), {3, 8}, ao);
  const std::string t = p.to_table();
  for (const char* k : {"weights", "gradients", "master weights", "optimizer state",
                        "activations (saved)", "logits workspace", "total"})
    CHECK(t.find(k) != std::string::npos);
  const auto j = p.to_json();
  CHECK(j["total"].get<std::uint64_t>() == p.total());
  CHECK(j["state"]["weights"].get<std::uint64_t>() == p.state.weights);
  // ZeRO-3: no update all-gather; the gathered units and the window on top of the activations.
  CHECK(p.total() ==
        p.persistent() + p.state.gathered + p.state.reduce_staging + p.activations.peak);
  CHECK(p.persistent() == p.state.persistent() + p.trainer);
  CHECK(t.find("engine") != std::string::npos);
  CHECK(j["state"]["persistent"].get<std::uint64_t>() == p.state.persistent());
}

TEST_CASE("planner rejects bad input with the numbers", "[plan][errors]") {
  const auto c = nn::llama_config::tiny();
  const auto d = plan::dtype_sizes::of<precision::fp32>();
  CHECK_THROWS_WITH(plan::plan_state(c, d, {}, {4, 8}), Catch::Contains("zero stage 4"));
  CHECK_THROWS_WITH(plan::plan_state(c, d, {}, {0, 0}), Catch::Contains("dp=0"));
  plan::activation_options too_long;
  too_long.seq = 65;
  CHECK_THROWS_WITH(plan::plan_activations(c, d, too_long), Catch::Contains("max_seq=64"));
  plan::activation_options no_rows;
  no_rows.micro_batch = 0;
  no_rows.seq = 8;
  CHECK_THROWS_WITH(plan::plan_activations(c, d, no_rows), Catch::Contains("B=0"));
  CHECK_THROWS_WITH(plan::dtype_sizes::from_name("fp8"), Catch::Contains("bf16_mixed"));
  CHECK_THROWS_AS(plan::seed004_training_memory_gib(7e9, 0, 0), config_error);
}

}  // namespace test_plan_memory
