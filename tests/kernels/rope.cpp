// Tests of include/tessera/kernels/rope.hpp: table accuracy against long
// double at long positions, forward against a float64 reference (float64,
// float32, bf16 on the same rounded inputs), the rotate-half convention, and
// the backward against float64 central finite differences; rope_positions:
// context-parallel ranks' tokens rotated at their global positions give the
// whole sequence's bits.

#include "tessera/kernels/rope.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "tessera/core/cp_shard.hpp"

#include "kernel_testing.hpp"

namespace test_kernels_rope {

using namespace tessera;
using namespace tessera::kernels;
using namespace tessera::testing;

TEST_CASE("rope_table is accurate at long positions", "[kernels][rope]") {
  const std::int64_t T = 8192, hd = 128, half = hd / 2;
  std::vector<float> c(T * half), s(T * half);
  for (double theta : {10000.0, 500000.0}) {
    INFO("theta=" << theta);
    rope_table(c.data(), s.data(), T, hd, theta);
    double worst = 0;
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t i = 0; i < half; ++i) {
        const long double f =
            std::pow(static_cast<long double>(theta), -2.0L * static_cast<long double>(i) / hd);
        const long double a = static_cast<long double>(t) * f;
        worst = std::max(worst, static_cast<double>(std::fabs(c[t * half + i] - std::cos(a))));
        worst = std::max(worst, static_cast<double>(std::fabs(s[t * half + i] - std::sin(a))));
      }
    // Requirement after bf16 model conversion: 5e-4. Float32 storage of a
    // value in [-1, 1] is within 2^-25 ~ 3e-8; the double angle at t = 8191 is
    // within ~1e-12: so 1e-7 holds with room.
    CHECK(worst < 1e-7);
    // Position 0 is the identity; i = 0 rotates by t radians.
    CHECK(c[0] == 1.0f);
    CHECK(s[0] == 0.0f);
    CHECK(c[8191 * half] == static_cast<float>(std::cos(8191.0)));
  }
}

TEST_CASE("rope_table from inverse frequencies: theta's give the theta tables bit for bit",
          "[kernels][rope]") {
  const std::int64_t T = 300, hd = 16, half = hd / 2;
  std::vector<double> f(half);
  for (std::int64_t i = 0; i < half; ++i) f[i] = kernels::detail::rope_inv_freq(i, hd, 500000.0);
  for (int pass = 0; pass < 2; ++pass) {
    std::vector<double> c1(T * half), s1(T * half), c2(T * half, -7.0), s2(T * half, -7.0);
    rope_table(c1.data(), s1.data(), T, hd, 500000.0);
    rope_table(c2.data(), s2.data(), T, hd, f.data());
    CHECK(c1 == c2);
    CHECK(s1 == s2);
    std::vector<float> c3(T * half), s3(T * half), c4(T * half), s4(T * half);
    rope_table(c3.data(), s3.data(), T, hd, 500000.0);
    rope_table(c4.data(), s4.data(), T, hd, f.data());
    CHECK(c3 == c4);
    CHECK(s3 == s4);
  }
  // Any frequencies: cos and sin of t f_i, in double.
  const std::vector<double> g = {1.0, 0.25, 3e-3, 1e-6};
  std::vector<double> c(T * 4), s(T * 4);
  rope_table(c.data(), s.data(), T, 8, g.data());
  for (std::int64_t t : {0, 1, 299})
    for (int i = 0; i < 4; ++i) {
      CHECK(c[t * 4 + i] == std::cos(static_cast<double>(t) * g[i]));
      CHECK(s[t * 4 + i] == std::sin(static_cast<double>(t) * g[i]));
    }
  std::vector<double> bad = {1.0, 0.0};
  CHECK_THROWS_WITH(rope_table(c.data(), s.data(), 4, 4, bad.data()),
                    Catch::Contains("inverse frequency 1 is 0, not finite and positive"));
  bad[1] = std::numeric_limits<double>::quiet_NaN();
  CHECK_THROWS_AS(rope_table(c.data(), s.data(), 4, 4, bad.data()), config_error);
}

TEST_CASE("rope_table rejects odd head dims and bad theta", "[kernels][rope]") {
  std::vector<float> c(64), s(64);
  CHECK_THROWS_AS(rope_table(c.data(), s.data(), 4, 7, 10000.0), config_error);
  CHECK_THROWS_WITH(rope_table(c.data(), s.data(), 4, 7, 10000.0), Catch::Contains("hd=7"));
  CHECK_THROWS_AS(rope_table(c.data(), s.data(), 4, 0, 10000.0), config_error);
  CHECK_THROWS_AS(rope_table(c.data(), s.data(), 4, 8, 0.0), config_error);
  std::vector<float> x(64);
  CHECK_THROWS_AS(rope_forward(ctx, x.data(), c.data(), s.data(), 1, 2, 1, 5), config_error);
  CHECK_THROWS_AS(rope_backward(ctx, x.data(), c.data(), s.data(), 1, 2, 1, 5), config_error);
}

namespace {
// Rotate-half reference in float64 with the same float32 tables.
std::vector<double> reference(const std::vector<double>& x, const std::vector<float>& c,
                              const std::vector<float>& s, std::int64_t B, std::int64_t T,
                              std::int64_t nh, std::int64_t hd, std::vector<double>* scale) {
  const std::int64_t half = hd / 2;
  std::vector<double> y(x.size());
  if (scale) scale->assign(x.size(), 0.0);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t h = 0; h < nh; ++h) {
        const std::int64_t o = ((b * T + t) * nh + h) * hd;
        for (std::int64_t i = 0; i < half; ++i) {
          const double cc = c[t * half + i], ss = s[t * half + i];
          const double x1 = x[o + i], x2 = x[o + i + half];
          y[o + i] = x1 * cc - x2 * ss;
          y[o + i + half] = x2 * cc + x1 * ss;
          if (scale) {
            (*scale)[o + i] = std::fabs(x1 * cc) + std::fabs(x2 * ss);
            (*scale)[o + i + half] = std::fabs(x2 * cc) + std::fabs(x1 * ss);
          }
        }
      }
  return y;
}

// |y - ref| <= rel_out |ref| + (1 + rel_out) rel_acc scale: two products and
// one add in the accumulation type (2 u of |x1 c| + |x2 s|), then one rounding
// to storage.
template <class Storage>
void check_forward(double rel_out, double u_acc) {
  std::mt19937_64 rng(31);
  const std::int64_t B = 2, T = 7, nh = 3, hd = 10;
  std::vector<float> c(T * hd / 2), s(T * hd / 2);
  rope_table(c.data(), s.data(), T, hd, 10000.0);
  auto x = random_vector<Storage>(B * T * nh * hd, rng);
  std::vector<double> scale;
  const auto ref = reference(to_double(x), c, s, B, T, nh, hd, &scale);
  rope_forward(ctx, x.data(), c.data(), s.data(), B, T, nh, hd);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double tol = rel_out * std::fabs(ref[i]) + (1 + rel_out) * 2 * u_acc * scale[i];
    REQUIRE(std::fabs(as_double(x[i]) - ref[i]) <= tol);
  }
}
}  // namespace

TEST_CASE("rope_forward matches the rotate-half reference", "[kernels][rope]") {
  SECTION("double") {
    check_forward<double>(0.0, 1.1102230246251565e-16);
  }
  SECTION("float") {
    check_forward<float>(0.0, u_f32);
  }
  SECTION("bf16 on the same rounded inputs") {
    check_forward<bf16>(u_bf16, u_f32);
  }
  SECTION("pairs are (i, i + hd/2) and t = 0 is the identity") {
    const std::int64_t T = 2, hd = 4;
    std::vector<float> c(T * 2), s(T * 2);
    rope_table(c.data(), s.data(), T, hd, 10000.0);
    // t = 0 unchanged; t = 1: pair 0 rotated by 1 rad, pair 1 by 10000^-0.5 rad.
    std::vector<double> x = {1, 2, 3, 4, 1, 0, 0, 0};
    rope_forward(ctx, x.data(), c.data(), s.data(), 1, T, 1, hd);
    CHECK(x[0] == 1);
    CHECK(x[3] == 4);
    CHECK(x[4] == Approx(std::cos(1.0)).epsilon(1e-7));  // x1 cos - x2 sin, x2 = 0
    CHECK(x[6] == Approx(std::sin(1.0)).epsilon(1e-7));  // x2 cos + x1 sin: lands at i + hd/2
    CHECK(x[5] == 0);
    CHECK(x[7] == 0);
  }
}

TEST_CASE("rope_backward matches float64 finite differences", "[kernels][rope]") {
  std::mt19937_64 rng(17);
  const std::int64_t B = 2, T = 5, nh = 2, hd = 8;
  std::vector<float> c(T * hd / 2), s(T * hd / 2);
  rope_table(c.data(), s.data(), T, hd, 500000.0);
  auto x = random_vector<double>(B * T * nh * hd, rng);
  auto w_out = random_vector<double>(x.size(), rng);
  std::vector<double> y(x.size());
  auto loss = [&] {
    y = x;
    rope_forward(ctx, y.data(), c.data(), s.data(), B, T, nh, hd);
    return weighted_sum(y, w_out);
  };
  auto dx = w_out;  // dL/dy, overwritten in place by dL/dx
  rope_backward(ctx, dx.data(), c.data(), s.data(), B, T, nh, hd);
  CHECK(fd_max_error(x, loss, dx) < 1e-6);
}

namespace {
// Documents of lengths 5, 1, 7, 3, 2, 9, ... in turn: global positions, so
// documents cross the cp chunks' boundaries.
std::vector<std::int32_t> doc_starts(std::int64_t B, std::int64_t T) {
  return tessera::testing::packed_doc_starts(B, T, {5, 1, 7, 3, 2, 9});
}
using tessera::testing::shard_rows;

// Forward and backward of the whole batch, then of each rank's tokens of cp
// ranks with rope_positions::of(shard, local doc_start): bit for bit the
// whole batch's rows at the ranks' positions (each token reads the table row
// of its position, and the arithmetic is the same). Every global row is
// checked once over the ranks.
template <class Storage>
void check_cp_positions(bool documents, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const std::int64_t B = 2, T = 24, nh = 3, hd = 10, width = nh * hd;
  std::vector<float> c(T * hd / 2), s(T * hd / 2);
  rope_table(c.data(), s.data(), T, hd, 10000.0);
  const auto x = random_vector<Storage>(static_cast<std::size_t>(B * T * width), rng, -2, 2);
  const auto dy = random_vector<Storage>(x.size(), rng);
  const std::vector<std::int32_t> ds = documents ? doc_starts(B, T) : std::vector<std::int32_t>{};
  auto y = x, dx = dy;
  rope_forward(ctx, y.data(), c.data(), s.data(), B, T, nh, hd, documents ? ds.data() : nullptr);
  rope_backward(ctx, dx.data(), c.data(), s.data(), B, T, nh, hd, documents ? ds.data() : nullptr);
  for (int cp : {1, 2, 3}) {
    std::vector<int> seen(static_cast<std::size_t>(T), 0);
    for (int r = 0; r < cp; ++r) {
      INFO("cp=" << cp << " rank=" << r << " documents=" << documents);
      const cp_shard sh = cp_shard::of(T, cp, r);
      const std::int64_t L = sh.tokens();
      const auto ds_local = documents ? shard_rows(ds, sh, B, 1) : std::vector<std::int32_t>{};
      const rope_positions pos = rope_positions::of(sh, documents ? ds_local.data() : nullptr);
      auto y_local = shard_rows(x, sh, B, width), dx_local = shard_rows(dy, sh, B, width);
      rope_forward(ctx, y_local.data(), c.data(), s.data(), B, L, nh, hd, pos);
      rope_backward(ctx, dx_local.data(), c.data(), s.data(), B, L, nh, hd, pos);
      CHECK(same_bits(y_local, shard_rows(y, sh, B, width)));
      CHECK(same_bits(dx_local, shard_rows(dx, sh, B, width)));
      for (std::int64_t l = 0; l < L; ++l) ++seen[static_cast<std::size_t>(sh.position(l))];
    }
    CHECK(seen == std::vector<int>(static_cast<std::size_t>(T), 1));
  }
}
}  // namespace

TEST_CASE("rope_positions of a cp shard: each rank's tokens get the whole batch's bits",
          "[kernels][rope]") {
  std::uint64_t seed = 40;
  for (bool documents : {false, true}) {
    check_cp_positions<double>(documents, seed++);
    check_cp_positions<float>(documents, seed++);
    check_cp_positions<bf16>(documents, seed++);
  }
}

TEST_CASE("rope_positions: the positions, the defaults and the refusals", "[kernels][rope]") {
  // Head-tail: cp 2 over T = 8 is chunks of 2; rank 0 holds positions 0 1 6 7,
  // rank 1 holds 2 3 4 5. Documents subtract their global start.
  constexpr rope_positions r0 = rope_positions::of(cp_shard{8, 2, 0});
  static_assert(r0.split == 2 && r0.head_offset == 0 && r0.tail_offset == 4);
  const rope_positions r1 = rope_positions::of(cp_shard::of(8, 2, 1));
  const std::int32_t starts[4] = {0, 1, 4, 4};  // (1, 4): global starts of rank 1's tokens
  const rope_positions d1 = rope_positions::of(cp_shard::of(8, 2, 1), starts);
  for (std::int64_t t = 0; t < 4; ++t) {
    CHECK(kernels::detail::rope_position(r0, t, 4) == cp_shard::of(8, 2, 0).position(t));
    CHECK(kernels::detail::rope_position(r1, 4 + t, 4) == 2 + t);  // row b = 1: bt = 4 + t
    CHECK(kernels::detail::rope_position(d1, t, 4) == 2 + t - starts[t]);
  }
  // cp 1 and the defaults: every token at t (or t - doc_start), all equal.
  constexpr rope_positions one = rope_positions::of(cp_shard{6, 1, 0});
  static_assert(one.split == 3 && one.head_offset == 0 && one.tail_offset == 0);
  constexpr rope_positions none{}, null_docs = nullptr;
  static_assert(none.doc_start == nullptr && none.split == 0 && null_docs.tail_offset == 0);
  for (std::int64_t bt = 0; bt < 12; ++bt) {
    CHECK(kernels::detail::rope_position(one, bt, 6) == bt % 6);
    CHECK(kernels::detail::rope_position(none, bt, 6) == bt % 6);
  }
  std::mt19937_64 rng(5);
  const std::int64_t T = 6, hd = 8;
  // Twice T rows: the split-3 shard of a 12-token sequence below reads rows 9-11.
  std::vector<float> c(2 * T * hd / 2), s(2 * T * hd / 2);
  rope_table(c.data(), s.data(), 2 * T, hd, 10000.0);
  const auto x = random_vector<float>(static_cast<std::size_t>(2 * T * hd), rng);
  auto a = x, b = x, d = x;
  rope_forward(ctx, a.data(), c.data(), s.data(), 2, T, 1, hd);
  rope_forward(ctx, b.data(), c.data(), s.data(), 2, T, 1, hd, one);
  rope_forward(ctx, d.data(), c.data(), s.data(), 2, T, 1, hd, nullptr);
  CHECK(same_bits(a, b));
  CHECK(same_bits(a, d));
  CHECK(!same_bits(a, x));

  // split outside [0, T], a negative offset: config_error naming them.
  rope_positions bad = rope_positions::of(cp_shard::of(12, 2, 0));  // split 3: T = 6 expected
  CHECK_NOTHROW(rope_forward(ctx, a.data(), c.data(), s.data(), 1, 6, 1, hd, bad));
  CHECK_THROWS_WITH(rope_forward(ctx, a.data(), c.data(), s.data(), 1, 2, 1, hd, bad),
                    Catch::Contains("split=3 is not in [0, T=2]"));
  bad = rope_positions{};
  bad.tail_offset = -1;
  CHECK_THROWS_WITH(rope_backward(ctx, a.data(), c.data(), s.data(), 1, 2, 1, hd, bad),
                    Catch::Contains("tail_offset=-1 must be >= 0"));
}

}  // namespace test_kernels_rope
