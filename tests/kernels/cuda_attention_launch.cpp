// The flash attention kernels' host-side pieces, without a GPU:
// - launch configurations (include/tessera/kernels/cuda/attention_launch.hpp)
//   for the Llama-2 7B and Llama-3 8B attention shapes: grids within the
//   hardware limits, shared memory within sm_90's 227 KiB and sm_80's 163 KiB,
//   the scratch formula, and the argument checks;
// - the m16n8k16 fragment layouts and the ldmatrix lane addresses: a warp-level
//   mma is emulated from the layout functions, fed by an emulated ldmatrix
//   reading the kernels' swizzled shared tiles, and compared with a plain
//   matmul; the swizzle is a bijection and bank-conflict free;
// - the kernels themselves: the block bodies of kernels/cuda/attention.cuh are
//   plain C++ templates over their warp primitives, so they run here under the
//   block emulator of tests/support/cuda_emulator.hpp (256 fibers a block,
//   lock-step warp collectives, cp.async copies that land only at
//   cp.async.wait_group, shared memory poisoned with NaN, bounds checks on
//   every shared and global access) and are compared with the float64 host
//   attention at the GPU test's tolerances.
// What this cannot show: the PTX instructions' real semantics beyond the PTX
// ISA's description (encoded in attention_launch.hpp), races the fiber
// schedule does not expose, and speed.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <tessera/kernels/attention.hpp>
#include <tessera/kernels/cuda/attention.cuh>
#include <tessera/kernels/cuda/attention_launch.hpp>

#include "../support/cuda_emulator.hpp"
#include "kernel_testing.hpp"

namespace test_kernels_cuda_attention_launch {

namespace kc = tessera::kernels::cuda;
namespace mm = tessera::kernels::cuda::mma_m16n8k16;
using tessera::bf16;
using tessera::fp16;
using namespace tessera::testing;

namespace {

// Llama-2 7B and Llama-3 8B attention of one layer (DESIGN.md, "Model presets").
constexpr std::int64_t S7 = 4096, nh7 = 32, hd7 = 128;

float bf16f(std::uint16_t b) {
  return tessera::detail::bf16_bits_to_float(b);
}

/// Largest |got - want| / max(|want|, rms(want), floor) (tests/cuda/cuda_testing.hpp's
/// max_rel_error, plus `floor`): relative, except that elements far below the
/// typical size are measured against it, and a result that cancels to about
/// zero (dq, dk at S = 1) against `floor`, the size of the terms it sums.
/// NaN gives +inf.
double max_error(const std::vector<double>& got, const std::vector<double>& want,
                 double floor = 1e-300) {
  REQUIRE(got.size() == want.size());
  double ss = 0;
  for (double w : want) ss += w * w;
  const double rms = std::sqrt(ss / static_cast<double>(std::max<std::size_t>(1, want.size())));
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i]) || std::isnan(want[i])) return INFINITY;
    worst = std::max(worst, std::abs(got[i] - want[i]) / std::max({std::abs(want[i]), rms, floor}));
  }
  return worst;
}

}  // namespace

// ---- launch configurations -------------------------------------------------------------------

TEST_CASE("cuda attention launch: 7B shapes fit the grid and shared-memory limits",
          "[kernels][cuda_attention]") {
  for (std::int64_t nkv : {nh7, std::int64_t(8)}) {  // llama2_7b (MHA), llama3_8b (GQA 4:1)
    for (std::int64_t B : {std::int64_t(1), std::int64_t(16)}) {
      INFO("B=" << B << " nkv=" << nkv);
      const auto f = kc::attention_forward_config(B, S7, nh7, nkv, hd7);
      const auto d = kc::attention_backward_d_config(B, S7, nh7, nkv, hd7);
      const auto kv = kc::attention_backward_kv_config(B, S7, nh7, nkv, hd7);
      const auto q = kc::attention_backward_q_config(B, S7, nh7, nkv, hd7);
      for (const auto& c : {f, d, kv, q}) {
        CHECK(kc::attention_launch_fits(c, kc::launch_limits::max_smem_sm90));
        CHECK(kc::attention_launch_fits(c, kc::launch_limits::max_smem_sm80));
        CHECK(c.block == 256);
      }
      CHECK(f.grid_x == B * nh7);
      CHECK(f.grid_y == S7 / 128);  // 32 query tiles of 128
      CHECK(q.grid_x == B * nh7);
      CHECK(q.grid_y == S7 / 128);
      CHECK(kv.grid_x == B * nkv);
      CHECK(kv.grid_y == S7 / 128);          // 32 key tiles of 128
      CHECK(d.grid_x == B * S7 * nh7 / 16);  // 16 rows of hd 128 a block
      // Shared memory (hd 128): forward Q + 2 x (K, V) = 96 KiB; dK/dV K, V + 2 x (Q, dO)
      // of 64 rows + lse, D and the queries' first keys (document mask) = 129.5 KiB;
      // dQ Q, dO + 2 x (K, V) = 128 KiB.
      CHECK(f.dynamic_smem == 96 * 1024);
      CHECK(kv.dynamic_smem == 128 * 1024 + 1024 + 512);
      CHECK(q.dynamic_smem == 128 * 1024);
      CHECK(d.dynamic_smem == 0);
      // Scratch: D, B nh S float32 (512 KiB at B 1).
      CHECK(d.scratch_bytes == static_cast<std::size_t>(B * nh7 * S7 * 4));
      CHECK(kc::attention_backward_scratch_bytes(B, S7, nh7, nkv, hd7) == d.scratch_bytes);
    }
  }
  static_assert(kc::attention_forward_config(1, S7, nh7, 8, hd7).grid_y == 32,
                "usable in constant expressions");
  // Every supported head dimension fits both architectures; smaller hd, less memory.
  for (std::int64_t hd : {32, 64, 128}) {
    CHECK(kc::attention_forward_config(1, 1000, 4, 2, hd).smem <= kc::launch_limits::max_smem_sm80);
    CHECK(kc::attention_backward_kv_config(1, 1000, 4, 2, hd).smem <=
          kc::launch_limits::max_smem_sm80);
    CHECK(kc::attention_backward_q_config(1, 1000, 4, 2, hd).smem <=
          kc::launch_limits::max_smem_sm80);
  }
  CHECK(kc::attention_forward_config(1, 1000, 4, 2, 64).smem == 48 * 1024);
  CHECK(kc::attention_forward_config(1, 1000, 4, 2, 32).smem == 24 * 1024);
  static_assert(kc::attention_forward_traits<128>::smem_bytes <= kc::attention_smem_bound);
  static_assert(kc::attention_backward_kv_traits<128>::smem_bytes <= kc::attention_smem_bound);
  static_assert(kc::attention_backward_q_traits<128>::smem_bytes <= kc::attention_smem_bound);
}

TEST_CASE("cuda attention launch: tails, tiny sizes and argument errors",
          "[kernels][cuda_attention]") {
  CHECK(kc::attention_forward_config(2, 1, 8, 2, 64).grid_y == 1);
  CHECK(kc::attention_forward_config(2, 129, 8, 2, 64).grid_y == 2);
  CHECK(kc::attention_backward_kv_config(2, 333, 8, 2, 64).grid_y == 3);
  CHECK(kc::attention_backward_kv_config(2, 333, 8, 2, 64).grid_x == 4);
  CHECK(kc::attention_backward_d_config(1, 17, 3, 1, 64).grid_x == (17 * 3 + 31) / 32);
  CHECK(kc::attention_backward_scratch_bytes(2, 333, 8, 2, 64) == 2 * 8 * 333 * 4u);
  using tessera::config_error;
  CHECK_THROWS_AS(kc::attention_check_args("f", 1, 16, 8, 3, 64), config_error);  // 3 !| 8
  CHECK_THROWS_AS(kc::attention_check_args("f", 1, 16, 8, 2, 96), config_error);  // hd
  CHECK_THROWS_AS(kc::attention_check_args("f", 0, 16, 8, 2, 64), config_error);
  CHECK_THROWS_AS(kc::attention_check_args("f", 1, 0, 8, 2, 64), config_error);
  CHECK_THROWS_AS(kc::attention_check_args("f", 1, kc::attention_max_S + 1, 8, 2, 64),
                  config_error);
  CHECK_NOTHROW(kc::attention_check_args("f", 1, kc::attention_max_S, 8, 2, 64));
  CHECK_THROWS_WITH(kc::attention_check_args("flash_attention_forward", 1, 16, 8, 2, 80),
                    Catch::Contains("hd=80") && Catch::Contains("32, 64 and 128"));
  CHECK_THROWS_WITH(kc::attention_check_args("f", 1, 16, 8, 3, 64),
                    Catch::Contains("nkv=3") && Catch::Contains("nh=8"));
  alignas(16) static char buf[64];
  CHECK_NOTHROW(kc::attention_check_aligned("f", "d_q", buf, 16));
  CHECK_THROWS_WITH(kc::attention_check_aligned("f", "d_q", buf + 2, 16),
                    Catch::Contains("d_q") && Catch::Contains("16 bytes"));
  CHECK_THROWS_AS(kc::attention_check_aligned("f", "d_q", nullptr, 16), config_error);
  CHECK_THROWS_AS(kc::attention_forward_config(1, 16, 8, 2, 48), config_error);
  // The entry points' checks (the arguments they pack: attention_*_args).
  alignas(16) static std::uint16_t t[4][16 * 2 * 64];
  alignas(16) static float lse[64], d[64];
  CHECK_NOTHROW(kc::detail::attention_forward_args(t[0], lse, t[1], t[2], t[3], 1, 16, 2, 1, 64));
  CHECK_THROWS_WITH(
      kc::detail::attention_forward_args(t[0] + 1, lse, t[1], t[2], t[3], 1, 16, 2, 1, 64),
      Catch::Contains("flash_attention_forward") && Catch::Contains("d_out"));
  CHECK_THROWS_WITH(
      kc::detail::attention_forward_args(t[0], lse, t[1], t[2] + 4, t[3], 1, 16, 2, 1, 64),
      Catch::Contains("d_k") && Catch::Contains("16 bytes"));
  CHECK_THROWS_AS(kc::detail::attention_forward_args(t[0], lse, t[1], t[2], t[3], 1, 16, 2, 1, 80),
                  config_error);
  const std::size_t need = kc::attention_backward_scratch_bytes(1, 16, 2, 1, 64);
  CHECK_NOTHROW(kc::detail::attention_backward_args(t[0], t[1], t[2], t[3], t[1], t[2], t[3], t[0],
                                                    lse, 1, 16, 2, 1, 64, d, need));
  CHECK_THROWS_WITH(kc::detail::attention_backward_args(t[0], t[1], t[2], t[3], t[1], t[2], t[3],
                                                        t[0], lse, 1, 16, 2, 1, 64, d, need - 4),
                    Catch::Contains("scratch_bytes=" + std::to_string(need - 4)) &&
                        Catch::Contains(std::to_string(need)));
  CHECK_THROWS_WITH(kc::detail::attention_backward_args(t[0], t[1], t[2], t[3] + 1, t[1], t[2],
                                                        t[3], t[0], lse, 1, 16, 2, 1, 64, d, need),
                    Catch::Contains("d_dout"));
}

// ---- fragment layouts ------------------------------------------------------------------------

TEST_CASE("cuda attention: m16n8k16 fragment layouts cover each matrix once",
          "[kernels][cuda_attention]") {
  std::set<std::pair<int, int>> a, b, c, l, lt;
  for (int lane = 0; lane < 32; ++lane) {
    for (int i = 0; i < 8; ++i) a.insert({mm::a_coord(lane, i).row, mm::a_coord(lane, i).col});
    for (int i = 0; i < 4; ++i) {
      b.insert({mm::b_coord(lane, i).row, mm::b_coord(lane, i).col});
      c.insert({mm::c_coord(lane, i).row, mm::c_coord(lane, i).col});
    }
    for (int h = 0; h < 2; ++h) {
      l.insert({mm::ldmatrix_coord(lane, h, false).row, mm::ldmatrix_coord(lane, h, false).col});
      lt.insert({mm::ldmatrix_coord(lane, h, true).row, mm::ldmatrix_coord(lane, h, true).col});
    }
  }
  CHECK(a.size() == 256);  // 16 x 16
  CHECK(b.size() == 128);  // 16 x 8
  CHECK(c.size() == 128);  // 16 x 8
  CHECK(l.size() == 64);   // 8 x 8
  CHECK(lt.size() == 64);
  for (auto [r, col] : a) CHECK((r < 16 && col < 16));
  for (auto [r, col] : b) CHECK((r < 16 && col < 8));
  for (auto [r, col] : c) CHECK((r < 16 && col < 8));
  // The PTX ISA's examples: lane 5 (group 1, thread 1) holds a0 = A[1][2], a7 = A[9][11],
  // b3 = B[11][1], c2 = C[9][2].
  CHECK((mm::a_coord(5, 0).row == 1 && mm::a_coord(5, 0).col == 2));
  CHECK((mm::a_coord(5, 7).row == 9 && mm::a_coord(5, 7).col == 11));
  CHECK((mm::b_coord(5, 3).row == 11 && mm::b_coord(5, 3).col == 1));
  CHECK((mm::c_coord(5, 2).row == 9 && mm::c_coord(5, 2).col == 2));
}

TEST_CASE("cuda attention: the swizzle is a bijection, conflict-free, and steps by XOR",
          "[kernels][cuda_attention]") {
  for (int hd : {32, 64, 128}) {
    INFO("hd=" << hd);
    const int rows = 64;
    std::vector<int> seen(static_cast<std::size_t>(rows * hd), 0);
    for (int r = 0; r < rows; ++r)
      for (int col = 0; col < hd; ++col) {
        const int o = kc::attention_smem_offset(r, col, hd);
        REQUIRE((o >= r * hd && o < (r + 1) * hd));  // stays in its row
        ++seen[static_cast<std::size_t>(o)];
        CHECK(o % 8 == col % 8);  // 16-byte chunks move whole
      }
    CHECK(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
    // Every ldmatrix phase (8 lanes, 16 bytes each) of the kernels' three address
    // patterns hits 8 distinct 16-byte bank groups, and stepping kk (or np) from the
    // lane's base by attention_smem_step names the same chunk as the direct formula.
    for (int kk = 0; kk < hd / 16; ++kk)
      for (int pat = 0; pat < 3; ++pat)
        for (int j = 0; j < 4; ++j) {
          std::set<int> groups;
          for (int lane = 8 * j; lane < 8 * j + 8; ++lane) {
            const auto at = [&](int k) {
              return pat == 0   ? mm::ldsm_a(lane, 16, k)
                     : pat == 1 ? mm::ldsm_b(lane, 0, k)
                                : mm::ldsm_bt(lane, 32, k);
            };
            const auto c = at(kk);
            const auto c0 = at(0);
            const int direct = kc::attention_smem_offset(c.row, c.col * 8, hd);
            const int stepped =
                kc::attention_smem_step(kc::attention_smem_offset(c0.row, c0.col * 8, hd), kk);
            CHECK(direct == stepped);
            groups.insert((2 * direct / 16) % 8);
          }
          CHECK(groups.size() == 8);
        }
  }
}

namespace {

// A shared tile of bf16 bits, swizzled as the kernels store it.
struct smem_tile {
  int rows, hd;
  std::vector<std::uint16_t> bits;
  smem_tile(int r, int h) : rows(r), hd(h), bits(static_cast<std::size_t>(r * h)) {}
  void set(int r, int c, float v) {
    bits[static_cast<std::size_t>(kc::attention_smem_offset(r, c, hd))] = bf16(v).bits;
  }
};

// ldmatrix.x4 as the PTX ISA describes it: lane l gives row l % 8 of matrix
// l / 8 (an element offset into `t`); each lane receives, for each matrix j,
// the two elements ldmatrix_coord names, low half first.
std::array<std::array<std::uint32_t, 4>, 32> ldmatrix_x4(const smem_tile& t,
                                                         const std::array<int, 32>& row_offset,
                                                         bool trans) {
  std::array<std::array<std::uint32_t, 4>, 32> r{};
  for (int lane = 0; lane < 32; ++lane)
    for (int j = 0; j < 4; ++j)
      for (int h = 0; h < 2; ++h) {
        const auto c = mm::ldmatrix_coord(lane, h, trans);
        const int off = row_offset[static_cast<std::size_t>(8 * j + c.row)] + c.col;
        r[static_cast<std::size_t>(lane)][static_cast<std::size_t>(j)] |=
            std::uint32_t(t.bits[static_cast<std::size_t>(off)]) << (16 * h);
      }
  return r;
}

// mma.m16n8k16 from the fragment layouts: D = A B + C for one warp.
void warp_mma(std::array<std::array<float, 4>, 32>& d,
              const std::array<std::array<std::uint32_t, 4>, 32>& a,
              const std::array<std::array<std::uint32_t, 2>, 32>& b) {
  double A[16][16] = {}, Bm[16][8] = {};
  for (int lane = 0; lane < 32; ++lane) {
    for (int i = 0; i < 8; ++i) {
      const auto c = mm::a_coord(lane, i);
      A[c.row][c.col] = bf16f(static_cast<std::uint16_t>(
          a[static_cast<std::size_t>(lane)][static_cast<std::size_t>(i / 2)] >> (16 * (i % 2))));
    }
    for (int i = 0; i < 4; ++i) {
      const auto c = mm::b_coord(lane, i);
      Bm[c.row][c.col] = bf16f(static_cast<std::uint16_t>(
          b[static_cast<std::size_t>(lane)][static_cast<std::size_t>(i / 2)] >> (16 * (i % 2))));
    }
  }
  for (int lane = 0; lane < 32; ++lane)
    for (int i = 0; i < 4; ++i) {
      const auto c = mm::c_coord(lane, i);
      double s = 0;
      for (int k = 0; k < 16; ++k) s += A[c.row][k] * Bm[k][c.col];
      d[static_cast<std::size_t>(lane)][static_cast<std::size_t>(i)] += static_cast<float>(s);
    }
}

}  // namespace

TEST_CASE("cuda attention: emulated ldmatrix + mma of the kernels' tiles equals a matmul",
          "[kernels][cuda_attention]") {
  std::mt19937_64 rng(7001);
  std::uniform_real_distribution<double> u(-1, 1);
  for (int hd : {32, 64, 128}) {
    INFO("hd=" << hd);
    // Q K^T: A = Q rows [16, 32) of a (32, hd) tile, B^T = K, an n-major (16, hd) tile;
    // then C (16 x 16) as the A operand of C V, V a k-major (16, hd) tile (ldmatrix.trans).
    smem_tile Q(32, hd), K(16, hd), V(16, hd);
    std::vector<std::vector<double>> q(32, std::vector<double>(hd)), k(16, std::vector<double>(hd)),
        v(16, std::vector<double>(hd));
    auto fill = [&](smem_tile& t, std::vector<std::vector<double>>& m) {
      for (int r = 0; r < t.rows; ++r)
        for (int c = 0; c < hd; ++c) {
          const float x = static_cast<float>(bf16(static_cast<float>(u(rng))));
          m[r][c] = x;
          t.set(r, c, x);
        }
    };
    fill(Q, q);
    fill(K, k);
    fill(V, v);
    std::array<std::array<float, 4>, 32> s0{}, s1{};  // n-tiles 0 and 1 of S = Q K^T
    for (int kk = 0; kk < hd / 16; ++kk) {
      std::array<int, 32> ao{}, bo{};
      for (int lane = 0; lane < 32; ++lane) {
        const auto ca = mm::ldsm_a(lane, 16, kk);
        const auto cb = mm::ldsm_b(lane, 0, kk);
        ao[static_cast<std::size_t>(lane)] = kc::attention_smem_offset(ca.row, ca.col * 8, hd);
        bo[static_cast<std::size_t>(lane)] = kc::attention_smem_offset(cb.row, cb.col * 8, hd);
      }
      const auto af = ldmatrix_x4(Q, ao, false);
      const auto bf = ldmatrix_x4(K, bo, false);
      std::array<std::array<std::uint32_t, 2>, 32> b0{}, b1{};
      for (std::size_t lane = 0; lane < 32; ++lane) {
        b0[lane] = {bf[lane][0], bf[lane][1]};
        b1[lane] = {bf[lane][2], bf[lane][3]};
      }
      warp_mma(s0, af, b0);
      warp_mma(s1, af, b1);
    }
    double err = 0;
    std::vector<std::vector<double>> sref(16, std::vector<double>(16, 0.0));
    for (int r = 0; r < 16; ++r)
      for (int c = 0; c < 16; ++c)
        for (int d = 0; d < hd; ++d) sref[r][c] += q[16 + r][d] * k[c][d];
    for (int lane = 0; lane < 32; ++lane)
      for (int i = 0; i < 4; ++i) {
        const auto c = mm::c_coord(lane, i);
        err =
            std::max(err, std::abs(s0[static_cast<std::size_t>(lane)][static_cast<std::size_t>(i)] -
                                   sref[c.row][c.col]));
        err =
            std::max(err, std::abs(s1[static_cast<std::size_t>(lane)][static_cast<std::size_t>(i)] -
                                   sref[c.row][8 + c.col]));
      }
    CHECK(err < 1e-5);  // float32 sums of exact products

    // C fragments of n-tiles 0, 1 are the A fragment of one k-step (FA-2's register reuse).
    std::array<std::array<std::uint32_t, 4>, 32> pa{};
    std::vector<std::vector<double>> p(16, std::vector<double>(16));
    for (std::size_t lane = 0; lane < 32; ++lane) {
      auto pk = [](float lo, float hi) {
        return std::uint32_t(bf16(lo).bits) | (std::uint32_t(bf16(hi).bits) << 16);
      };
      pa[lane] = {pk(s0[lane][0], s0[lane][1]), pk(s0[lane][2], s0[lane][3]),
                  pk(s1[lane][0], s1[lane][1]), pk(s1[lane][2], s1[lane][3])};
      for (int i = 0; i < 4; ++i) {
        const auto c = mm::c_coord(static_cast<int>(lane), i);
        p[c.row][c.col] = static_cast<float>(bf16(s0[lane][static_cast<std::size_t>(i)]));
        p[c.row][8 + c.col] = static_cast<float>(bf16(s1[lane][static_cast<std::size_t>(i)]));
      }
    }
    double err2 = 0, scale = 0;
    for (int np = 0; np < hd / 16; ++np) {
      std::array<int, 32> vo{};
      for (int lane = 0; lane < 32; ++lane) {
        const auto cv = mm::ldsm_bt(lane, 0, np);
        vo[static_cast<std::size_t>(lane)] = kc::attention_smem_offset(cv.row, cv.col * 8, hd);
      }
      const auto vf = ldmatrix_x4(V, vo, true);
      std::array<std::array<std::uint32_t, 2>, 32> b0{}, b1{};
      for (std::size_t lane = 0; lane < 32; ++lane) {
        b0[lane] = {vf[lane][0], vf[lane][1]};
        b1[lane] = {vf[lane][2], vf[lane][3]};
      }
      std::array<std::array<float, 4>, 32> o0{}, o1{};
      warp_mma(o0, pa, b0);
      warp_mma(o1, pa, b1);
      for (int lane = 0; lane < 32; ++lane)
        for (int i = 0; i < 4; ++i) {
          const auto c = mm::c_coord(lane, i);
          for (int half = 0; half < 2; ++half) {
            const int col = 16 * np + 8 * half + c.col;
            double ref = 0;
            for (int s = 0; s < 16; ++s) ref += p[c.row][s] * v[s][col];
            const float got =
                (half ? o1 : o0)[static_cast<std::size_t>(lane)][static_cast<std::size_t>(i)];
            err2 = std::max(err2, std::abs(got - ref));
            scale = std::max(scale, std::abs(ref));
          }
        }
    }
    CHECK(err2 < 1e-5 * std::max(1.0, scale));
  }
}

namespace {

template <class T>
using emu_ops = tessera::testing::emulator_attention_ops<T>;

template <class T>
std::vector<std::uint16_t> bits_of(const std::vector<T>& v) {
  std::vector<std::uint16_t> b(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) b[i] = v[i].bits;
  return b;
}
template <class T>
std::vector<double> doubles_of_bits(const std::vector<std::uint16_t>& b) {
  std::vector<double> d(b.size());
  for (std::size_t i = 0; i < b.size(); ++i) d[i] = static_cast<float>(T::from_bits(b[i]));
  return d;
}

struct attn_case {
  std::int64_t B, S, nh, nkv, hd;
  const std::int32_t* doc_start = nullptr;  // (B, S) document mask, or none
};

// Forward and backward of the kernels under the emulator.
struct emulated {
  std::vector<std::uint16_t> out, dq, dk, dv;
  std::vector<float> lse, d;
  std::uint64_t ldsm_phases = 0, bank_conflicts = 0, leftover_copies = 0;
};

template <class T, int HD>
emulated run_emulated(const attn_case& c, const std::vector<std::uint16_t>& q,
                      const std::vector<std::uint16_t>& k, const std::vector<std::uint16_t>& v,
                      const std::vector<std::uint16_t>& dout,
                      const std::vector<std::uint16_t>* out_in, const std::vector<float>* lse_in,
                      std::uint64_t schedule_seed) {
  emulated r;
  const auto nq = static_cast<std::size_t>(c.B * c.S * c.nh * c.hd);
  const auto nkv = static_cast<std::size_t>(c.B * c.S * c.nkv * c.hd);
  const auto nl = static_cast<std::size_t>(c.B * c.nh * c.S);
  r.out.assign(nq, 0xFFFF);
  r.lse.assign(nl, std::numeric_limits<float>::quiet_NaN());
  r.dq.assign(nq, 0xFFFF);
  r.dk.assign(nkv, 0xFFFF);
  r.dv.assign(nkv, 0xFFFF);
  r.d.assign(nl, std::numeric_limits<float>::quiet_NaN());
  cuda_emulator em(schedule_seed);
  auto inputs = [&] {
    em.clear_regions();
    em.add_region(q.data(), nq * 2, false);
    em.add_region(k.data(), nkv * 2, false);
    em.add_region(v.data(), nkv * 2, false);
    em.add_region(dout.data(), nq * 2, false);
  };
  auto run = [&](const kc::launch_config& cfg, std::size_t smem, auto block) {
    for (std::int64_t y = 0; y < cfg.grid_y; ++y)
      for (std::int64_t x = 0; x < cfg.grid_x; ++x) {
        const std::string err =
            em.run_block(kc::attention_threads, smem, [&](int tid) { block(x, y, tid); });
        if (!err.empty()) FAIL("block (" << x << ", " << y << "): " << err);
      }
  };
  // Forward: the entry point's checks and arguments (attention_forward_args).
  const kc::detail::attention_forward_params fp =
      kc::detail::attention_forward_args(r.out.data(), r.lse.data(), q.data(), k.data(), v.data(),
                                         c.B, c.S, c.nh, c.nkv, c.hd, c.doc_start);
  inputs();
  em.add_region(r.out.data(), nq * 2, true);
  em.add_region(r.lse.data(), nl * 4, true);
  using ft = kc::attention_forward_traits<HD>;
  const auto fc = kc::attention_forward_config(c.B, c.S, c.nh, c.nkv, c.hd);
  REQUIRE(fc.dynamic_smem == sizeof(typename ft::shared_storage));
  run(fc, fc.dynamic_smem, [&](std::int64_t x, std::int64_t y, int tid) {
    auto& sm = *reinterpret_cast<typename ft::shared_storage*>(em.shared_base());
    kc::detail::attention_forward_block<emu_ops<T>, HD>(fp, x, static_cast<int>(fc.grid_y - 1 - y),
                                                        sm, tid);
  });

  // Backward, from the given out and lse (or the emulated forward's).
  const auto& o = out_in ? *out_in : r.out;
  const auto& lse = lse_in ? *lse_in : r.lse;
  const kc::detail::attention_backward_params bp = kc::detail::attention_backward_args(
      r.dq.data(), r.dk.data(), r.dv.data(), dout.data(), q.data(), k.data(), v.data(), o.data(),
      lse.data(), c.B, c.S, c.nh, c.nkv, c.hd, r.d.data(), r.d.size() * sizeof(float), c.doc_start);
  inputs();
  em.add_region(o.data(), nq * 2, false);
  em.add_region(lse.data(), nl * 4, false);
  em.add_region(r.d.data(), nl * 4, true);
  const auto dc = kc::attention_backward_d_config(c.B, c.S, c.nh, c.nkv, c.hd);
  run(dc, 0, [&](std::int64_t x, std::int64_t, int tid) {
    kc::detail::attention_backward_d_block<emu_ops<T>, HD>(bp, x, tid);
  });
  em.pop_region();
  em.add_region(r.d.data(), nl * 4, false);
  em.add_region(r.dk.data(), nkv * 2, true);
  em.add_region(r.dv.data(), nkv * 2, true);
  using kvt = kc::attention_backward_kv_traits<HD>;
  const auto kvc = kc::attention_backward_kv_config(c.B, c.S, c.nh, c.nkv, c.hd);
  REQUIRE(kvc.dynamic_smem == sizeof(typename kvt::shared_storage));
  run(kvc, kvc.dynamic_smem, [&](std::int64_t x, std::int64_t y, int tid) {
    auto& sm = *reinterpret_cast<typename kvt::shared_storage*>(em.shared_base());
    kc::detail::attention_backward_kv_block<emu_ops<T>, HD>(bp, x, static_cast<int>(y), sm, tid);
  });
  em.pop_region();
  em.pop_region();
  em.add_region(r.dq.data(), nq * 2, true);
  using qt = kc::attention_backward_q_traits<HD>;
  const auto qc = kc::attention_backward_q_config(c.B, c.S, c.nh, c.nkv, c.hd);
  REQUIRE(qc.dynamic_smem == sizeof(typename qt::shared_storage));
  run(qc, qc.dynamic_smem, [&](std::int64_t x, std::int64_t y, int tid) {
    auto& sm = *reinterpret_cast<typename qt::shared_storage*>(em.shared_base());
    kc::detail::attention_backward_q_block<emu_ops<T>, HD>(
        bp, x, static_cast<int>(qc.grid_y - 1 - y), sm, tid);
  });
  r.ldsm_phases = em.ldsm_phases;
  r.bank_conflicts = em.bank_conflicts;
  r.leftover_copies = em.leftover_copies;
  return r;
}

// Tolerances, against float64 of the same bf16 inputs (tests/cuda/attention.cpp
// uses the same values on the GPU). FlashAttention-2 rounds P (and dS) to bf16
// before they multiply V, dO, K or Q: each term is off by up to 2^-9 relative,
// and a sum of terms of both signs can be much smaller than its terms, so the
// error relative to the result's typical size has a long tail. A float64
// attention that rounds only P and the outputs to bf16 shows errors of up to
// 0.8% (out) and 2.0% (dv) on these inputs (S = 200, hd 64, three seeds); the
// emulated kernels show 0.7% and 1.7%. Hence:
// - out: 2^-6; dq, dk, dv: 2^-5 (an indexing or masking bug moves whole rows by
//   O(1); a wrongly included key moves an early row by tens of percent);
// - lse: float32 sums of exact products and of the probabilities: 1e-5.
// dq and dk are measured against at least grad_floor(): 2^-8 of the size of
// their terms (scale |dP| |k| = rms(dout) rms(v) rms(k)), since at S = 1 they
// cancel to zero exactly in float64 and to float32 rounding in the kernel.
// fp16 (11 significant bits against bf16's 8) rounds P, dS and the outputs
// 2^3 times more finely: the emulated kernels show 0.08% (out) and 0.2%
// (dq, dk) on the fp16 cases below, so its tolerances are bf16's times 2^-3.
template <class T>
constexpr double out_tol = std::is_same_v<T, tessera::fp16> ? 1.0 / 512 : 1.0 / 64;
template <class T>
constexpr double grad_tol = std::is_same_v<T, tessera::fp16> ? 1.0 / 256 : 1.0 / 32;
constexpr double lse_tol = 1e-5;
double rms_of(const std::vector<double>& x) {
  double ss = 0;
  for (double v : x) ss += v * v;
  return std::sqrt(ss / static_cast<double>(std::max<std::size_t>(1, x.size())));
}

// Reference: the host's float64 attention on the same rounded inputs.
struct reference {
  std::vector<double> out, lse, dq, dk, dv;
};
reference reference_of(const attn_case& c, const std::vector<double>& q,
                       const std::vector<double>& k, const std::vector<double>& v,
                       const std::vector<double>& dout, const std::vector<double>* out_in,
                       const std::vector<double>* lse_in) {
  reference r;
  r.out.resize(q.size());
  r.lse.resize(static_cast<std::size_t>(c.B * c.nh * c.S));
  tessera::kernels::attention_forward<double>(ctx, r.out.data(), r.lse.data(), q.data(), k.data(),
                                              v.data(), c.B, c.S, c.nh, c.nkv, c.hd, {c.doc_start});
  r.dq.resize(q.size());
  r.dk.resize(k.size());
  r.dv.resize(v.size());
  const auto& o = out_in ? *out_in : r.out;
  const auto& l = lse_in ? *lse_in : r.lse;
  tessera::kernels::attention_backward<double, double>(
      ctx, r.dq.data(), r.dk.data(), r.dv.data(), dout.data(), q.data(), k.data(), v.data(),
      o.data(), l.data(), c.B, c.S, c.nh, c.nkv, c.hd, {c.doc_start});
  return r;
}

template <class T, int HD>
void check_case(const attn_case& c, std::uint64_t seed, bool replay = false) {
  INFO(tessera::dtype_name<T>() << " B=" << c.B << " S=" << c.S << " nh=" << c.nh
                                << " nkv=" << c.nkv << " hd=" << c.hd);
  std::mt19937_64 rng(seed);
  const auto nq = static_cast<std::size_t>(c.B * c.S * c.nh * c.hd);
  const auto nk = static_cast<std::size_t>(c.B * c.S * c.nkv * c.hd);
  // Scores of order 1 after the 1/sqrt(hd) scale: q, k in [-2, 2).
  const auto q = bits_of(random_vector<T>(nq, rng, -2, 2));
  const auto k = bits_of(random_vector<T>(nk, rng, -2, 2));
  const auto v = bits_of(random_vector<T>(nk, rng));
  const auto dout = bits_of(random_vector<T>(nq, rng));
  const auto qd = doubles_of_bits<T>(q), kd = doubles_of_bits<T>(k), vd = doubles_of_bits<T>(v),
             dod = doubles_of_bits<T>(dout);

  // The backward gets the forward's reference out (rounded to T) and lse (to
  // float), as a trainer would hand it the saved ones; the reference uses the same values.
  const reference fwd = reference_of(c, qd, kd, vd, dod, nullptr, nullptr);
  std::vector<std::uint16_t> out_b(nq);
  std::vector<double> out_bd(nq);
  for (std::size_t i = 0; i < nq; ++i) {
    out_b[i] = T(fwd.out[i]).bits;
    out_bd[i] = static_cast<float>(T::from_bits(out_b[i]));
  }
  std::vector<float> lse_f(fwd.lse.begin(), fwd.lse.end());
  std::vector<double> lse_fd(lse_f.begin(), lse_f.end());
  const reference ref = reference_of(c, qd, kd, vd, dod, &out_bd, &lse_fd);

  const emulated g = run_emulated<T, HD>(c, q, k, v, dout, &out_b, &lse_f, 1);
  if (replay) {
    // Another interleaving of the fibers gives the same bits: no result depends on
    // the order in which threads reach their barriers (no race the schedule exposes).
    const emulated g2 = run_emulated<T, HD>(c, q, k, v, dout, &out_b, &lse_f, 2);
    CHECK(g2.out == g.out);
    CHECK(std::memcmp(g2.lse.data(), g.lse.data(), g.lse.size() * 4) == 0);
    CHECK(g2.dq == g.dq);
    CHECK(g2.dk == g.dk);
    CHECK(g2.dv == g.dv);
  }
  const auto to_d = [](const std::vector<std::uint16_t>& b) { return doubles_of_bits<T>(b); };
  CHECK(first_nan(to_d(g.out)) == -1);  // every element written (outputs start as NaN)
  CHECK(first_nan(g.lse) == -1);
  CHECK(first_nan(to_d(g.dq)) == -1);
  CHECK(first_nan(to_d(g.dk)) == -1);
  CHECK(first_nan(to_d(g.dv)) == -1);
  const double e_out = max_error(to_d(g.out), fwd.out);
  // A query with nothing to attend to (document mask) has lse -inf on both
  // sides; the finite ones are compared.
  std::vector<double> g_lse(g.lse.begin(), g.lse.end()), want_lse = fwd.lse;
  for (std::size_t i = 0; i < g_lse.size(); ++i)
    if (std::isinf(want_lse[i])) {
      CHECK(g_lse[i] == want_lse[i]);
      g_lse[i] = want_lse[i] = 0;
    }
  const double e_lse = max_error(g_lse, want_lse);
  const double floor = rms_of(dod) * rms_of(vd) * rms_of(kd) / 256;
  const double e_dq = max_error(to_d(g.dq), ref.dq, floor);
  const double e_dk = max_error(to_d(g.dk), ref.dk, floor);
  const double e_dv = max_error(to_d(g.dv), ref.dv);
  UNSCOPED_INFO("errors: out " << e_out << " lse " << e_lse << " dq " << e_dq << " dk " << e_dk
                               << " dv " << e_dv);
  CHECK(e_out < out_tol<T>);
  CHECK(e_lse < lse_tol);
  CHECK(e_dq < grad_tol<T>);
  CHECK(e_dk < grad_tol<T>);
  CHECK(e_dv < grad_tol<T>);
  CHECK(g.bank_conflicts == 0);
  CHECK(g.ldsm_phases > 0);
  CHECK(g.leftover_copies == 0);
}

// doc_start (B, S) of rows cut into documents of the given lengths.
std::vector<std::int32_t> doc_starts(const std::vector<std::vector<std::int64_t>>& lengths) {
  std::vector<std::int32_t> ds;
  for (const auto& row : lengths) {
    std::int64_t start = 0;
    for (std::int64_t len : row) {
      ds.insert(ds.end(), static_cast<std::size_t>(len), static_cast<std::int32_t>(start));
      start += len;
    }
  }
  return ds;
}

}  // namespace

TEST_CASE("cuda attention kernels under the warp emulator match float64 attention",
          "[kernels][cuda_attention][emulated]") {
  // S not a multiple of any tile (1, 17, 200); GQA 2:1 and MHA; B 2.
  check_case<bf16, 64>({2, 17, 4, 2, 64}, 7101, true);
  check_case<bf16, 64>({1, 200, 2, 1, 64}, 7102);
  check_case<bf16, 64>({2, 1, 2, 2, 64}, 7103);
  check_case<bf16, 128>({1, 133, 2, 2, 128}, 7104);
  check_case<bf16, 32>({1, 70, 4, 1, 32}, 7105);
}

TEST_CASE("cuda attention kernels for fp16 storage under the warp emulator match float64",
          "[kernels][cuda_attention][emulated]") {
  // The same bodies with the f16 mma and fp16 rounding of P, dS and the
  // outputs (precision::fp16_mixed); one case per head dimension, and a
  // replay, at small S to keep the emulation short.
  check_case<fp16, 64>({2, 17, 4, 2, 64}, 7201, true);
  check_case<fp16, 64>({1, 200, 2, 1, 64}, 7202);
  check_case<fp16, 128>({1, 133, 2, 2, 128}, 7204);
  check_case<fp16, 32>({1, 70, 4, 1, 32}, 7205);
}

TEST_CASE("cuda attention kernels with a document mask under the warp emulator match float64",
          "[kernels][cuda_attention][emulated][document_mask]") {
  // The host kernel with the same mask is the reference (it equals attention
  // per document: tests/kernels/attention_document_mask.cpp). Documents that
  // cross the 128-row query tiles and the 64- and 128-row key tiles, a row
  // that starts with a one-token document, runs of length-1 documents, and
  // a last query tile whose document starts after key tile 0 (the dK/dV
  // walk skips it).
  const auto a = doc_starts({{1, 70, 1, 1, 60, 67}});
  check_case<bf16, 64>({1, 200, 2, 1, 64, a.data()}, 7301, true);
  const auto b = doc_starts({{1, 1, 15}, {5, 1, 11}});
  check_case<bf16, 64>({2, 17, 4, 2, 64, b.data()}, 7302);
  const auto c = doc_starts({{64, 1, 68}});
  check_case<bf16, 128>({1, 133, 2, 2, 128, c.data()}, 7303);
  check_case<fp16, 32>({1, 200, 4, 1, 32, a.data()}, 7304);
  // Queries with nothing to attend to (doc_start past t, as a key block at
  // an offset can give): rows 0..149 get out 0 and lse -inf, the first
  // forward and dQ blocks no key tile at all; never NaN.
  const std::vector<std::int32_t> late(200, 150);
  check_case<bf16, 64>({1, 200, 2, 1, 64, late.data()}, 7305);
}

}  // namespace test_kernels_cuda_attention_launch
