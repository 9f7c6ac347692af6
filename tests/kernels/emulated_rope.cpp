// RoPE's CUDA kernels (include/tessera/kernels/cuda/rope.cuh), their own
// bodies run by the block emulator (tests/support/cuda_emulator.hpp) through
// the launch functions the GPU path calls, against the host kernels
// (include/tessera/kernels/rope.hpp), in place on fresh random x (B, T, nh,
// hd) with tables from the host rope_table: one pair; hd/2 no multiple of
// the vector width (the one-pair variant) and a multiple of the float
// width only (vector for float, one pair for bf16 and fp16); a misaligned x (the
// one-pair variant); the presets' attention shapes (nh = 32 query heads,
// nkv = 8 key/value heads, hd = 128, Llama 2's theta 10000 and Llama 3's
// 500000) with few tokens; tables of more rows than T; and no pairs (no
// launch). x and the tables are registered as exactly the elements the call
// may touch, so a read or write one element outside fails. Context
// parallelism: each cp rank's tokens (core/cp_shard.hpp) rotated through the
// launch with rope_positions::of(shard, local doc_start) against the host
// kernels on the whole batch, at the rows of the ranks' global positions.
//
// Bit for bit (memcmp), forward and backward, float, bf16 and fp16: the body and
// the host loop call the same functions (kernels/detail/rope.hpp) on the
// same float32 values and round a 16-bit result once, and under the emulator
// both are compiled by the host compiler. (On a GPU the compiler may fuse
// the products into FMAs: tests/cuda/kernels.cpp holds that path to 1e-6
// relative in float32 and bf16_tol against float64.)
#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <tessera/core/cp_shard.hpp>
#include <tessera/kernels/cuda/rope.cuh>
#include <tessera/kernels/rope.hpp>

#include "../support/cuda_emulator.hpp"
#include "kernel_testing.hpp"

namespace test_kernels_emulated_rope {

namespace kc = tessera::kernels::cuda;
namespace hk = tessera::kernels;
using tessera::bf16;
using tessera::cp_shard;
using tessera::fp16;
using namespace tessera::testing;

namespace {

using strings = std::vector<std::string>;

struct shape {
  std::int64_t B, T, nh, hd;
  int offset = 0;               // elements before x (misaligned when odd)
  std::int64_t table_rows = 0;  // rows of the tables (0: T)
  double theta = 10000.0;
  bool documents = false;  // packed documents: positions from doc_start
};

/// doc_start (B, T) of rows cut into documents of lengths 1, 3, 2, 5, 1, 4,
/// ... in turn (the last one cut by the row's end).
std::vector<std::int32_t> doc_starts(std::int64_t B, std::int64_t T) {
  return tessera::testing::packed_doc_starts(B, T, {1, 3, 2, 5, 1, 4});
}

/// Forward and backward of one shape and type: the emulated kernels in
/// place on x and dy against the host kernels on copies.
template <class T>
void rope_case(const shape& s, std::uint64_t seed) {
  INFO("B=" << s.B << " T=" << s.T << " nh=" << s.nh << " hd=" << s.hd << " offset=" << s.offset
            << " table_rows=" << s.table_rows << " theta=" << s.theta
            << " documents=" << s.documents);
  std::mt19937_64 rng(seed);
  const std::int64_t n = s.B * s.T * s.nh * s.hd, half = s.hd / 2;
  const std::int64_t rows = s.table_rows > 0 ? s.table_rows : s.T;
  std::vector<float> cos(static_cast<std::size_t>(rows * half)), sin(cos.size());
  hk::rope_table(cos.data(), sin.data(), rows, s.hd, s.theta);
  const auto x0 = random_vector<T>(static_cast<std::size_t>(n + s.offset), rng, -2, 2);
  const auto dy0 = random_vector<T>(static_cast<std::size_t>(n + s.offset), rng, -1, 1);

  std::vector<T> y_want(x0.begin() + s.offset, x0.end()),
      dx_want(dy0.begin() + s.offset, dy0.end());
  const std::vector<std::int32_t> ds =
      s.documents ? doc_starts(s.B, s.T) : std::vector<std::int32_t>{};
  const std::int32_t* pds = s.documents ? ds.data() : nullptr;
  hk::rope_forward(ctx, y_want.data(), cos.data(), sin.data(), s.B, s.T, s.nh, s.hd, pds);
  hk::rope_backward(ctx, dx_want.data(), cos.data(), sin.data(), s.B, s.T, s.nh, s.hd, pds);
  if (s.documents)  // a document's first token is at position 0: not rotated (cos 1, sin 0)
    for (std::int64_t bt = 0; bt < s.B * s.T; ++bt)
      if (ds[static_cast<std::size_t>(bt)] == bt % s.T)
        for (std::int64_t i = 0; i < s.nh * s.hd; ++i)
          REQUIRE(same_bits(&y_want[static_cast<std::size_t>(bt * s.nh * s.hd + i)],
                            &x0[static_cast<std::size_t>(s.offset + bt * s.nh * s.hd + i)], 1));

  cuda_emulator em(seed);
  auto x = x0, dy = dy0;
  T* px = x.data() + s.offset;
  T* pdy = dy.data() + s.offset;
  const auto bytes = static_cast<std::size_t>(n) * sizeof(T);
  em.add_region(px, bytes, true);
  em.add_region(pdy, bytes, true);
  // The rows the positions 0..T-1 use, not the table's rest.
  em.add_region(cos.data(), static_cast<std::size_t>(s.T * half) * sizeof(float), false);
  em.add_region(sin.data(), static_cast<std::size_t>(s.T * half) * sizeof(float), false);
  strings launched;
  const emulator_launcher launch{&em, std::int64_t(1) << 24, &launched};
  kc::rope_forward_launch(launch, px, static_cast<const float*>(cos.data()),
                          static_cast<const float*>(sin.data()), s.B, s.T, s.nh, s.hd, pds);
  kc::rope_backward_launch(launch, pdy, static_cast<const float*>(cos.data()),
                           static_cast<const float*>(sin.data()), s.B, s.T, s.nh, s.hd, pds);
  CHECK(launched == (n == 0 ? strings{} : strings{"rope_forward", "rope_backward"}));
  // The variant: V pairs an item when hd/2 allows and x is 16-byte aligned
  // (the vectors' storage is), which the grid size shows.
  constexpr int V = kc::detail::vec_width<T>;
  const bool vec = half % V == 0 && s.offset % V == 0;
  const std::int64_t grid = kc::rope_config(s.B, s.T, s.nh, s.hd, vec ? V : 1).grid_x;
  CHECK(static_cast<std::int64_t>(em.blocks_run) == (n == 0 ? 0 : 2 * grid));
  CHECK((s.offset == 0 ||  // (an empty vector's data() may be null: no memcmp of it)
         std::memcmp(x.data(), x0.data(), static_cast<std::size_t>(s.offset) * sizeof(T)) == 0));
  CHECK(same_bits(std::vector<T>(x.begin() + s.offset, x.end()), y_want));
  CHECK(same_bits(std::vector<T>(dy.begin() + s.offset, dy.end()), dx_want));
}

using tessera::testing::shard_rows;

/// The host kernels on the whole (B, T) batch (positions t, or t less the
/// global doc_start), then each rank of cp: its tokens through the emulated
/// launch with rope_positions::of(shard, its rows of doc_start), bit for bit
/// the whole batch's rows at its positions. The tables (T rows: the whole
/// sequence) are registered whole; every rank reads rows beyond its own
/// T/cp.
template <class T>
void rope_cp_case(const shape& s, int cp, std::uint64_t seed) {
  INFO("B=" << s.B << " T=" << s.T << " nh=" << s.nh << " hd=" << s.hd << " cp=" << cp
            << " documents=" << s.documents);
  std::mt19937_64 rng(seed);
  const std::int64_t width = s.nh * s.hd, half = s.hd / 2;
  std::vector<float> cos(static_cast<std::size_t>(s.T * half)), sin(cos.size());
  hk::rope_table(cos.data(), sin.data(), s.T, s.hd, s.theta);
  const auto x = random_vector<T>(static_cast<std::size_t>(s.B * s.T * width), rng, -2, 2);
  const auto dy = random_vector<T>(x.size(), rng, -1, 1);
  const std::vector<std::int32_t> ds =
      s.documents ? doc_starts(s.B, s.T) : std::vector<std::int32_t>{};
  auto y = x, dx = dy;
  hk::rope_forward(ctx, y.data(), cos.data(), sin.data(), s.B, s.T, s.nh, s.hd,
                   s.documents ? ds.data() : nullptr);
  hk::rope_backward(ctx, dx.data(), cos.data(), sin.data(), s.B, s.T, s.nh, s.hd,
                    s.documents ? ds.data() : nullptr);
  for (int r = 0; r < cp; ++r) {
    INFO("rank=" << r);
    const cp_shard sh = cp_shard::of(s.T, cp, r);
    const std::int64_t L = sh.tokens();
    const auto ds_local = s.documents ? shard_rows(ds, sh, s.B, 1) : std::vector<std::int32_t>{};
    const hk::rope_positions pos =
        hk::rope_positions::of(sh, s.documents ? ds_local.data() : nullptr);
    auto x_local = shard_rows(x, sh, s.B, width), dy_local = shard_rows(dy, sh, s.B, width);
    cuda_emulator em(seed + static_cast<std::uint64_t>(r));
    const auto bytes = x_local.size() * sizeof(T);
    em.add_region(x_local.data(), bytes, true);
    em.add_region(dy_local.data(), bytes, true);
    em.add_region(cos.data(), cos.size() * sizeof(float), false);
    em.add_region(sin.data(), sin.size() * sizeof(float), false);
    strings launched;
    const emulator_launcher launch{&em, std::int64_t(1) << 24, &launched};
    kc::rope_forward_launch(launch, x_local.data(), static_cast<const float*>(cos.data()),
                            static_cast<const float*>(sin.data()), s.B, L, s.nh, s.hd, pos);
    kc::rope_backward_launch(launch, dy_local.data(), static_cast<const float*>(cos.data()),
                             static_cast<const float*>(sin.data()), s.B, L, s.nh, s.hd, pos);
    CHECK(launched == strings{"rope_forward", "rope_backward"});
    CHECK(same_bits(x_local, shard_rows(y, sh, s.B, width)));
    CHECK(same_bits(dy_local, shard_rows(dx, sh, s.B, width)));
  }
}

}  // namespace

TEST_CASE("emulated cuda rope forward and backward give the host's bits",
          "[kernels][emulated][rope]") {
  std::uint64_t seed = 1;
  // B, T, nh, hd [, offset, table rows, theta]
  for (const shape& s : {
           shape{1, 1, 1, 2},                          // one pair
           shape{1, 9, 3, 6},                          // hd/2 = 3: one pair an item
           shape{1, 7, 3, 12},                         // hd/2 = 6: one pair an item
           shape{2, 3, 2, 8},                          // hd/2 = 4: vector for float, not bf16
           shape{2, 37, 4, 128},                       // several blocks
           shape{2, 5, 2, 64, 1},                      // misaligned x: one pair an item
           shape{1, 5, 32, 128, 0, 12},                // 7B / 8B query heads, a 12-row table
           shape{2, 3, 8, 128, 0, 0, 500000.0},        // 8B key/value heads, Llama 3's theta
           shape{1, 3, 32, 128, 0, 0, 500000.0},       // 8B query heads
           shape{0, 4, 2, 8},                          // no pairs: no launch
           shape{3, 0, 2, 8},                          // no tokens: no launch
           shape{2, 37, 4, 128, 0, 0, 10000.0, true},  // packed documents, vector items
           shape{2, 11, 3, 6, 0, 0, 10000.0, true},    // packed documents, one pair an item
       }) {
    rope_case<float>(s, seed++);
    rope_case<bf16>(s, seed++);
    rope_case<fp16>(s, seed++);
  }
}

TEST_CASE("emulated cuda rope at cp ranks' global positions gives the whole batch's bits",
          "[kernels][emulated][rope]") {
  std::uint64_t seed = 100;
  // B, T (2 cp divides it), nh, hd; positions 0..T-1 from the host tables.
  for (const shape& s : {
           shape{2, 24, 4, 128},                       // vector items
           shape{2, 12, 3, 6},                         // hd/2 = 3: one pair an item
           shape{2, 24, 4, 128, 0, 0, 10000.0, true},  // packed documents, vector items
           shape{2, 36, 3, 6, 0, 0, 500000.0, true},   // documents, one pair an item
       })
    for (int cp : {2, 3}) {
      rope_cp_case<float>(s, cp, seed++);
      rope_cp_case<bf16>(s, cp, seed++);
      rope_cp_case<fp16>(s, cp, seed++);
    }
}

TEST_CASE("emulated cuda rope refuses bad shapes", "[kernels][emulated][rope]") {
  cuda_emulator em;
  strings launched;
  const emulator_launcher launch{&em, std::int64_t(1) << 24, &launched};
  float* none = nullptr;
  const float* table = nullptr;
  CHECK_THROWS_AS(kc::rope_forward_launch(launch, none, table, table, 1, 1, 1, 7),
                  tessera::config_error);  // hd odd
  CHECK_THROWS_AS(kc::rope_forward_launch(launch, none, table, table, 1, 1, 1, 0),
                  tessera::config_error);  // hd 0
  CHECK_THROWS_AS(kc::rope_backward_launch(launch, none, table, table, -1, 1, 1, 8),
                  tessera::config_error);  // negative B
  CHECK_THROWS_AS(
      kc::rope_backward_launch(launch, static_cast<bf16*>(nullptr), table, table, 1, -2, 1, 8),
      tessera::config_error);                                               // negative T
  hk::rope_positions bad = hk::rope_positions::of(cp_shard::of(12, 2, 0));  // split 3
  CHECK_THROWS_AS(kc::rope_forward_launch(launch, none, table, table, 1, 2, 1, 8, bad),
                  tessera::config_error);  // split > T
  bad = hk::rope_positions{};
  bad.head_offset = -2;
  CHECK_THROWS_AS(kc::rope_backward_launch(launch, none, table, table, 1, 2, 1, 8, bad),
                  tessera::config_error);  // negative offset
  CHECK(launched.empty());
}

}  // namespace test_kernels_emulated_rope
