// Launch configurations of the CUDA kernels (include/tessera/kernels/cuda/launch.hpp),
// checked on the host for the Llama-2 7B shapes: grids within the hardware
// limits, shared memory under 48 KiB (no opt-in needed, far below sm_90's
// 227 KiB), scratch sizes, and the device-independent partitions that make
// the reductions deterministic. No CUDA headers or runtime needed.
#include <catch2/catch.hpp>

#include <tessera/kernels/cuda/launch.hpp>

namespace test_kernels_cuda_launch {

namespace kc = tessera::kernels::cuda;

namespace {
// Llama-2 7B (DESIGN.md, "Model presets"): micro-batch 16 x 4096 tokens.
constexpr std::int64_t H = 4096, F = 11008, V = 32000, N = 16 * 4096;
constexpr std::int64_t params_7b = 6738415616;  // Llama-2 7B parameter count
}  // namespace

TEST_CASE("cuda launch: every 7B configuration is within the hardware limits",
          "[kernels][cuda_launch]") {
  const kc::launch_config all[] = {
      kc::rmsnorm_row_config(N, H),         kc::rmsnorm_dweight_partial_config(N, H),
      kc::rmsnorm_dweight_reduce_config(H), kc::elementwise_config(N * F, 8),
      kc::elementwise_config(params_7b, 1), kc::grad_norm_partial_config(params_7b),
      kc::embedding_forward_config(N, H),   kc::embedding_backward_config(N, V, H),
      kc::embedding_local_ids_config(N),    kc::grad_norm_final_config(),
      kc::clip_coefficient_config(),        kc::fp8_amax_partial_config(N * F),
      kc::fp8_amax_final_config(),          kc::fp8_update_scale_config(),
      kc::fp8_transpose_config(N, F),
  };
  for (const auto& c : all) {
    CHECK(c.valid());
    CHECK(c.smem <= kc::launch_limits::max_smem_sm90);
    CHECK(c.smem <= kc::launch_limits::max_smem_sm80);
    CHECK(c.smem <= kc::launch_limits::default_smem);
  }
  static_assert(kc::rmsnorm_row_config(N, H).valid(), "usable in constant expressions");
}

TEST_CASE("cuda launch: RMSNorm rows, dweight chunks and scratch", "[kernels][cuda_launch]") {
  const auto r = kc::rmsnorm_row_config(N, H);
  CHECK(r.grid_x == N);
  CHECK(r.block == 256);
  const auto p = kc::rmsnorm_dweight_partial_config(N, H);
  CHECK(p.grid_x == N / 256);  // 256 chunks of 256 rows
  CHECK(p.grid_y == H / 256);
  CHECK(p.scratch_bytes == static_cast<std::size_t>(256 * H * 4));  // 4 MiB
  CHECK(kc::rmsnorm_backward_scratch_bytes(N, H) == p.scratch_bytes);
  CHECK(kc::rmsnorm_dweight_reduce_config(H).grid_x == 16);
  // Rows beyond the grid limit are taken by the grid-stride loop.
  CHECK(kc::rmsnorm_row_config(std::int64_t(1) << 33, 8).grid_x == kc::launch_limits::max_grid_x);
  // Odd sizes: one partial chunk, one partial column block.
  const auto o = kc::rmsnorm_dweight_partial_config(257, 300);
  CHECK(o.grid_x == 2);
  CHECK(o.grid_y == 2);
  CHECK(kc::rmsnorm_row_config(0, 4).grid_x == 1);
  CHECK_THROWS_AS(kc::rmsnorm_row_config(4, 0), tessera::config_error);
}

TEST_CASE("cuda launch: element-wise grids cap and loop for 7B-sized buffers",
          "[kernels][cuda_launch]") {
  const auto s = kc::elementwise_config(N * F, 8);  // SwiGLU over (B*T, F) bf16, 8 per access
  CHECK(s.grid_x == (N * F + 2047) / 2048);
  CHECK(s.grid_x <= kc::elementwise_max_blocks);
  const auto a = kc::elementwise_config(params_7b, 1);  // AdamW over every parameter
  CHECK(a.grid_x == kc::elementwise_max_blocks);        // capped: threads loop, 64-bit indices
  CHECK(kc::elementwise_config(0, 4).grid_x == 1);
  CHECK_THROWS_AS(kc::elementwise_config(-1, 4), tessera::config_error);
}

TEST_CASE("cuda launch: the gradient-norm partition depends on n only", "[kernels][cuda_launch]") {
  const auto g = kc::grad_norm_partial_config(params_7b);
  CHECK(g.grid_x == kc::grad_norm_max_blocks);
  CHECK(g.scratch_bytes == 1024 * sizeof(double));
  CHECK(kc::grad_sum_squares_scratch_bytes(params_7b) == 8192);
  CHECK(kc::grad_norm_partial_config(1).grid_x == 1);
  CHECK(kc::grad_norm_partial_config(2048 * 3 + 1).grid_x == 4);
  // Stage 2 and the clip coefficient: one block, one thread; no scratch.
  const auto f = kc::grad_norm_final_config();
  CHECK(f.grid_x * f.grid_y == 1);
  CHECK(f.block == kc::grad_norm_threads);
  CHECK(f.smem == kc::grad_norm_smem_bound);
  CHECK(f.scratch_bytes == 0);
  const auto c = kc::clip_coefficient_config();
  CHECK(c.grid_x * c.grid_y * c.block == 1);
  CHECK(c.smem == 0);
  CHECK(c.scratch_bytes == 0);
}

TEST_CASE("cuda launch: the FP8 amax partition and the cast-transpose tiles",
          "[kernels][cuda_launch]") {
  // The amax of the FFN activation (N, F): 1024 partial maxima, 4 KiB of scratch.
  const auto a = kc::fp8_amax_partial_config(N * F);
  CHECK(a.grid_x == kc::fp8_amax_max_blocks);
  CHECK(kc::fp8_amax_scratch_bytes(N * F) == 1024 * sizeof(float));
  CHECK(kc::fp8_amax_partial_config(2049).grid_x == 2);
  CHECK(kc::fp8_amax_final_config().grid_x == 1);
  CHECK(kc::fp8_amax_final_config().smem == kc::fp8_amax_smem_bound);
  CHECK(kc::fp8_update_scale_config().block == 1);
  CHECK_THROWS_AS(kc::fp8_amax_partial_config(-1), tessera::config_error);
  // x (N, H) and (N, F) transposed: one block per 32 x 32 tile, column
  // tiles in x, row tiles in y, the tile's floats (padded) in shared memory.
  const auto t = kc::fp8_transpose_config(N, H);
  CHECK(t.grid_x == H / 32);
  CHECK(t.grid_y == N / 32);
  CHECK(t.smem == 32 * 33 * sizeof(float));
  CHECK(kc::fp8_transpose_config(33, 65).grid_x == 3);
  CHECK(kc::fp8_transpose_config(33, 65).grid_y == 2);
  // Beyond 65535 row tiles the blocks loop over the rest.
  CHECK(kc::fp8_transpose_config(std::int64_t(1) << 22, 8).grid_y == kc::launch_limits::max_grid_y);
  CHECK(kc::fp8_transpose_config(0, 0).valid());
  CHECK_THROWS_AS(kc::fp8_transpose_config(-1, 4), tessera::config_error);
}

TEST_CASE("cuda launch: embedding backward owns disjoint vocabulary rows",
          "[kernels][cuda_launch]") {
  const auto e = kc::embedding_backward_config(N, V, H);
  CHECK(e.grid_x * kc::embedding_backward_rows >= V);
  CHECK((e.grid_x - 1) * kc::embedding_backward_rows < V);
  CHECK(e.grid_x == 500);
  CHECK(e.grid_y == 4);
  CHECK(e.smem <= 6 * 1024);
  CHECK(kc::embedding_forward_config(N, H).grid_x == N);
  CHECK_THROWS_AS(kc::embedding_backward_config(N, 0, H), tessera::config_error);
  // Local ids: one id a thread; ragged N rounds up, huge N loops (grid-stride).
  CHECK(kc::embedding_local_ids_config(N).grid_x == N / kc::embedding_threads);
  CHECK(kc::embedding_local_ids_config(N + 1).grid_x == N / kc::embedding_threads + 1);
  CHECK(kc::embedding_local_ids_config(0).grid_x == 1);
  CHECK(kc::embedding_local_ids_config(std::int64_t(1) << 40).grid_x ==
        kc::launch_limits::max_grid_x);
  CHECK(kc::embedding_local_ids_config(N).block == kc::embedding_threads);
  CHECK(kc::embedding_local_ids_config(N).smem == 0);
  CHECK_THROWS_AS(kc::embedding_local_ids_config(-1), tessera::config_error);
}

TEST_CASE("cuda launch: RoPE over the 7B attention shapes", "[kernels][cuda_launch]") {
  // q and k of one 7B layer: B 1, T 4096, 32 heads of 128; 64 pairs a head.
  constexpr std::int64_t B = 1, T = 4096, nh = 32, hd = 128;
  constexpr std::int64_t pairs = B * T * nh * hd / 2;  // 8388608
  const auto b = kc::rope_config(B, T, nh, hd, 8);     // bf16: 8 pairs an item
  CHECK(b.valid());
  CHECK(b.block == kc::rope_threads);
  CHECK(b.grid_x == pairs / (256 * 8));  // 4096 blocks, one item a thread
  CHECK(b.smem == 0);
  CHECK(b.scratch_bytes == 0);
  const auto f = kc::rope_config(B, T, nh, hd, 4);  // float: 4 pairs an item
  CHECK(f.valid());
  CHECK(f.grid_x == pairs / (256 * 4));
  const auto s = kc::rope_config(B, T, nh, hd, 1);  // scalar path
  CHECK(s.valid());
  CHECK(s.grid_x == pairs / 256);
  // The micro-batch of 16 sequences still fits without looping.
  CHECK(kc::rope_config(16, T, nh, hd, 8).grid_x == 16 * pairs / 2048);
  // Huge tensors cap the grid; threads loop.
  CHECK(kc::rope_config(std::int64_t(1) << 20, T, nh, hd, 1).grid_x == kc::elementwise_max_blocks);
  CHECK(kc::rope_config(0, T, nh, hd, 8).grid_x == 1);
  static_assert(kc::rope_config(B, T, nh, hd, 8).valid(), "usable in constant expressions");
  CHECK_THROWS_AS(kc::rope_config(B, T, nh, 127, 8), tessera::config_error);
  CHECK_THROWS_AS(kc::rope_config(B, T, nh, 0, 8), tessera::config_error);
  CHECK_THROWS_AS(kc::rope_config(-1, T, nh, hd, 8), tessera::config_error);
  CHECK_THROWS_AS(kc::rope_config(B, T, nh, hd, 0), tessera::config_error);
}

}  // namespace test_kernels_cuda_launch
