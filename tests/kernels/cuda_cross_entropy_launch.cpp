// The fused LM head + cross-entropy on the GPU, the parts a host can check
// (include/tessera/kernels/cuda/launch.hpp, section "fused LM head and
// cross-entropy"): the scratch layout and its byte formula, the recommended
// chunk for the Llama vocabularies, and the launch configurations within the
// hardware limits at the 7B shapes; and the online softmax normaliser of the
// row kernel (kernels/detail/cross_entropy.hpp: ce_online_update and
// ce_online_combine), run here as the kernel runs it: 256 threads over a
// strided partition, merged in a tree. No CUDA headers or runtime needed.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include <tessera/kernels/cuda/launch.hpp>
#include <tessera/kernels/detail/cross_entropy.hpp>

namespace test_kernels_cuda_cross_entropy_launch {

namespace kc = tessera::kernels::cuda;

namespace {
// Llama-2 7B (DESIGN.md, "Model presets"): micro-batch 16 x 4096 tokens.
constexpr std::int64_t H = 4096, V = 32000, N = 16 * 4096;
constexpr std::int64_t V3 = 128256;  // Llama-3 8B vocabulary
constexpr std::size_t MiB = std::size_t(1) << 20;
}  // namespace

TEST_CASE("cuda lm_head_cross_entropy: recommended chunk keeps the float logits near 256 MiB",
          "[kernels][cuda_launch][cross_entropy]") {
  static_assert(kc::lm_head_cross_entropy_default_chunk(V) == 2048, "usable at compile time");
  CHECK(kc::lm_head_cross_entropy_default_chunk(V3) == 512);
  for (std::int64_t v : {std::int64_t(1), std::int64_t(1000), std::int64_t(997), V, V3,
                         std::int64_t(1) << 22, std::int64_t(1) << 30}) {
    INFO("V=" << v);
    const std::int64_t c = kc::lm_head_cross_entropy_default_chunk(v);
    CHECK(c >= 1);
    // Within the budget (or one row when a single row exceeds it).
    CHECK((c == 1 || static_cast<std::size_t>(c * v) * sizeof(float) <= 256 * MiB));
    if (c >= 64) {
      CHECK(c % 64 == 0);  // whole GEMM tiles
      // Rounding down to 64 rows loses less than 64 rows' worth of the budget.
      CHECK(static_cast<std::size_t>((c + 64) * v) * sizeof(float) > 256 * MiB);
    }
  }
  CHECK(kc::lm_head_cross_entropy_default_chunk(std::int64_t(1) << 22) == 16);  // no 64-rounding
  CHECK(kc::lm_head_cross_entropy_default_chunk(std::int64_t(1) << 30) == 1);
  CHECK_THROWS_AS(kc::lm_head_cross_entropy_default_chunk(0), tessera::config_error);
}

TEST_CASE("cuda lm_head_cross_entropy: scratch layout and byte formula",
          "[kernels][cuda_launch][cross_entropy]") {
  // 7B at the recommended chunk: 2048 x 32000 floats (250 MiB), the bf16
  // gradient block (125 MiB) and N doubles (512 KiB), each 256-byte aligned.
  const auto s = kc::lm_head_ce_scratch_layout(N, V, H, 2048);
  CHECK(s.rows == 2048);
  CHECK(s.logits == 0);
  CHECK(s.dlogits == std::size_t(2048) * V * 4);
  CHECK(s.row_loss == s.dlogits + std::size_t(2048) * V * 2);
  CHECK(s.bytes == s.row_loss + std::size_t(N) * 8);
  CHECK(s.bytes == kc::lm_head_cross_entropy_scratch_bytes(N, V, H, 2048));
  CHECK(s.bytes < 377 * MiB);
  // Llama 3 at its recommended chunk: about the same (376 MiB).
  CHECK(kc::lm_head_cross_entropy_scratch_bytes(N, V3, H, 512) < 377 * MiB);

  // Odd sizes: every region starts on a 256-byte boundary and holds its data.
  for (auto [n, v, chunk] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{67, 997, 7},
                             {5, 1, 1},
                             {1, 32000, 3},
                             {0, 13, 4},
                             {1000, 1001, 999}}) {
    INFO("N=" << n << " V=" << v << " chunk=" << chunk);
    const auto l = kc::lm_head_ce_scratch_layout(n, v, 64, chunk);
    const std::int64_t rows = std::min(chunk, std::max<std::int64_t>(n, 1));
    CHECK(l.rows == rows);
    for (std::size_t off : {l.logits, l.dlogits, l.row_loss, l.bytes})
      CHECK(off % kc::lm_head_ce_scratch_align == 0);
    CHECK(l.dlogits >= l.logits + static_cast<std::size_t>(rows * v) * 4);
    CHECK(l.row_loss >= l.dlogits + static_cast<std::size_t>(rows * v) * 2);
    CHECK(l.bytes >= l.row_loss + static_cast<std::size_t>(std::max<std::int64_t>(n, 1)) * 8);
    CHECK(l.bytes < l.row_loss + static_cast<std::size_t>(std::max<std::int64_t>(n, 1)) * 8 + 256);
  }
  // A chunk above N costs what chunk = N costs; H does not enter.
  CHECK(kc::lm_head_cross_entropy_scratch_bytes(10, 999, 64, 1000) ==
        kc::lm_head_cross_entropy_scratch_bytes(10, 999, 64, 10));
  CHECK(kc::lm_head_cross_entropy_scratch_bytes(10, 999, 64, 4) ==
        kc::lm_head_cross_entropy_scratch_bytes(10, 999, 4096, 4));
  // More rows per chunk, more scratch; the N-row loss array grows with N only.
  CHECK(kc::lm_head_cross_entropy_scratch_bytes(100, 999, 64, 8) >
        kc::lm_head_cross_entropy_scratch_bytes(100, 999, 64, 7));

  CHECK_THROWS_AS(kc::lm_head_cross_entropy_scratch_bytes(-1, V, H, 1), tessera::config_error);
  CHECK_THROWS_AS(kc::lm_head_cross_entropy_scratch_bytes(N, 0, H, 1), tessera::config_error);
  CHECK_THROWS_AS(kc::lm_head_cross_entropy_scratch_bytes(N, V, 0, 1), tessera::config_error);
  CHECK_THROWS_AS(kc::lm_head_cross_entropy_scratch_bytes(N, V, H, 0), tessera::config_error);
}

TEST_CASE("cuda lm_head_cross_entropy: launch configurations within the hardware limits",
          "[kernels][cuda_launch][cross_entropy]") {
  const kc::launch_config all[] = {
      kc::lm_head_ce_row_config(2048, V), kc::lm_head_ce_row_config(512, V3),
      kc::lm_head_ce_row_config(1, 1),    kc::lm_head_ce_loss_config(N),
      kc::lm_head_ce_zero_rows_config(N), kc::lm_head_ce_zero_rows_config(0),
      kc::lm_head_ce_loss_config(0),
  };
  for (const auto& c : all) {
    CHECK(c.valid());
    CHECK(c.smem <= kc::launch_limits::default_smem);
    CHECK(c.block == kc::lm_head_ce_threads);
  }
  // One block per row of the chunk; the loss is added by one block.
  CHECK(kc::lm_head_ce_row_config(2048, V).grid_x == 2048);
  CHECK(kc::lm_head_ce_row_config(0, V).grid_x == 1);
  CHECK(kc::lm_head_ce_loss_config(N).grid_x == 1);
  CHECK(kc::lm_head_ce_zero_rows_config(N).grid_x == N);
  // Rows beyond the grid limit are taken by the grid-stride loop.
  CHECK(kc::lm_head_ce_row_config(std::int64_t(1) << 33, 2).grid_x ==
        kc::launch_limits::max_grid_x);
  CHECK_THROWS_AS(kc::lm_head_ce_row_config(4, 0), tessera::config_error);
  CHECK_THROWS_AS(kc::lm_head_ce_loss_config(-1), tessera::config_error);
  CHECK_THROWS_AS(kc::lm_head_ce_zero_rows_config(-1), tessera::config_error);
}

namespace {
using state = tessera::kernels::detail::ce_online<float>;

/// The row kernel's normaliser on the host: thread t of 256 folds logits
/// [t*W, t*W + W), [t*W + 256 W, ...) with ce_online_update, then the states
/// merge pairwise in a tree with ce_online_combine (CUB's tree differs; any
/// order meets the same bound).
state block_normaliser(const std::vector<float>& z, int W) {
  std::vector<state> st(256, state{-INFINITY, 0.f});
  const auto V = static_cast<std::int64_t>(z.size());
  for (int t = 0; t < 256; ++t)
    for (std::int64_t i = std::int64_t(t) * W; i < V; i += 256 * W)
      for (int k = 0; k < W && i + k < V; ++k)
        st[t] = tessera::kernels::detail::ce_online_update(st[t], z[i + k]);
  for (int width = 1; width < 256; width *= 2)
    for (int t = 0; t + width < 256; t += 2 * width)
      st[t] = tessera::kernels::detail::ce_online_combine(st[t], st[t + width]);
  return st[0];
}
}  // namespace

TEST_CASE("cuda lm_head_cross_entropy: the online normaliser equals max and sum of exp",
          "[kernels][cuda_launch][cross_entropy]") {
  std::mt19937_64 rng(41);
  std::normal_distribution<double> d(0.0, 4.0);
  for (std::int64_t V : {std::int64_t(1), std::int64_t(3), std::int64_t(255), std::int64_t(997),
                         std::int64_t(32000)})
    for (int W : {1, 4}) {
      INFO("V=" << V << " W=" << W);
      std::vector<float> z(static_cast<std::size_t>(V));
      for (auto& v : z) v = static_cast<float>(d(rng));
      if (V > 300) z[256] = -INFINITY;  // the first logit of thread 64 (W = 1) or 16 (W = 4)
      const state s = block_normaliser(z, W);
      float mx = -INFINITY;
      for (float v : z) mx = std::max(mx, v);
      double sum = 0;
      for (float v : z) sum += std::exp(static_cast<double>(v) - mx);
      CHECK(s.max == mx);  // the max is exact
      // float32 exp and adds of V terms in a tree (and a few rescalings):
      // a few ulps of the sum, far below 1e-5.
      CHECK(std::abs(s.sum - sum) <= 1e-5 * sum);
    }
  // Empty states merge to an empty state (no exp(-inf - -inf) = NaN); an
  // empty side adds nothing; a NaN logit makes the sum NaN.
  const state empty{-INFINITY, 0.f};
  const state e2 = tessera::kernels::detail::ce_online_combine(empty, empty);
  CHECK(e2.sum == 0.f);
  CHECK(std::isinf(e2.max));
  const state one = tessera::kernels::detail::ce_online_update(empty, 2.5f);
  CHECK(one.max == 2.5f);
  CHECK(one.sum == 1.f);
  CHECK(tessera::kernels::detail::ce_online_combine(empty, one).sum == 1.f);
  CHECK(tessera::kernels::detail::ce_online_combine(one, empty).sum == 1.f);
  CHECK(tessera::kernels::detail::ce_online_update(empty, -INFINITY).sum == 0.f);
  CHECK(std::isnan(
      tessera::kernels::detail::ce_online_update(one, std::numeric_limits<float>::quiet_NaN())
          .sum));
  CHECK(std::isnan(
      tessera::kernels::detail::ce_online_update(empty, std::numeric_limits<float>::quiet_NaN())
          .sum));
}

}  // namespace test_kernels_cuda_cross_entropy_launch
