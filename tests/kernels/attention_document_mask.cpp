// Tests of the document mask of include/tessera/kernels/attention.hpp
// (kernels::attention_mask): attention over packed documents equals
// attention run on each document alone, forward and backward (float64,
// 1e-12), over tiles that cut documents anywhere, a row that starts with a
// one-token document, and documents of length 1; a query with nothing to
// attend to gives 0 (never NaN); a mask of one document per row gives the
// bits of no mask.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include <tessera/kernels/attention.hpp>

namespace test_kernels_attention_document_mask {

namespace {

using tessera::kernels::attention_backward;
using tessera::kernels::attention_forward;
using tessera::kernels::attention_mask;
using tessera::kernels::attention_tiles;
using tessera::kernels::host_context;

constexpr double nan = std::numeric_limits<double>::quiet_NaN();

std::vector<double> random_vector(std::int64_t n, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<double> x(static_cast<std::size_t>(n));
  for (auto& e : x) e = u(gen);
  return x;
}

// doc_start (B, S) of rows cut into documents of the given lengths (each
// row's lengths sum to S).
std::vector<std::int32_t> doc_starts(const std::vector<std::vector<std::int64_t>>& lengths) {
  std::vector<std::int32_t> ds;
  for (const auto& row : lengths) {
    std::int64_t start = 0;
    for (std::int64_t len : row) {
      for (std::int64_t i = 0; i < len; ++i) ds.push_back(static_cast<std::int32_t>(start));
      start += len;
    }
  }
  return ds;
}

struct result {
  std::vector<double> out, lse, dq, dk, dv;
};

// Forward and backward of (B, S) rows, poisoned outputs first.
result run(const host_context& ctx, const std::vector<double>& q, const std::vector<double>& k,
           const std::vector<double>& v, const std::vector<double>& dout, std::int64_t B,
           std::int64_t S, std::int64_t nh, std::int64_t nkv, std::int64_t hd,
           attention_mask mask) {
  result r;
  r.out.assign(q.size(), nan);
  r.lse.assign(static_cast<std::size_t>(B * nh * S), nan);
  attention_forward<double>(ctx, r.out.data(), r.lse.data(), q.data(), k.data(), v.data(), B, S, nh,
                            nkv, hd, mask);
  r.dq.assign(q.size(), nan);
  r.dk.assign(k.size(), nan);
  r.dv.assign(v.size(), nan);
  attention_backward<double, double>(ctx, r.dq.data(), r.dk.data(), r.dv.data(), dout.data(),
                                     q.data(), k.data(), v.data(), r.out.data(), r.lse.data(), B, S,
                                     nh, nkv, hd, mask);
  return r;
}

// Rows [t0, t0 + len) of row b of a (B, S, n, hd) tensor, as a (1, len, n, hd) one.
std::vector<double> rows_of(const std::vector<double>& x, std::int64_t b, std::int64_t S,
                            std::int64_t n, std::int64_t hd, std::int64_t t0, std::int64_t len) {
  const auto first = x.begin() + (b * S + t0) * n * hd;
  return {first, first + len * n * hd};
}

// Packed attention of `lengths` against each document run alone (B = 1,
// S = its length, plain causal); returns the largest absolute difference
// over out, lse, dq, dk, dv.
double packed_vs_separate(const std::vector<std::vector<std::int64_t>>& lengths, std::int64_t S,
                          std::int64_t nh, std::int64_t nkv, std::int64_t hd,
                          attention_tiles tiles) {
  const std::int64_t B = static_cast<std::int64_t>(lengths.size());
  const host_context ctx{&tessera::host::default_resource(), 0, tiles};
  const auto q = random_vector(B * S * nh * hd, 11), k = random_vector(B * S * nkv * hd, 12),
             v = random_vector(B * S * nkv * hd, 13), dout = random_vector(B * S * nh * hd, 14);
  const std::vector<std::int32_t> ds = doc_starts(lengths);
  REQUIRE(static_cast<std::int64_t>(ds.size()) == B * S);
  const result packed = run(ctx, q, k, v, dout, B, S, nh, nkv, hd, {ds.data()});
  double worst = 0;
  auto diff = [&](double a, double b) {
    REQUIRE(std::isfinite(a));  // every element written, none NaN
    worst = std::max(worst, std::abs(a - b));
  };
  for (std::int64_t b = 0; b < B; ++b) {
    std::int64_t t0 = 0;
    for (std::int64_t len : lengths[static_cast<std::size_t>(b)]) {
      const result one = run(ctx, rows_of(q, b, S, nh, hd, t0, len),
                             rows_of(k, b, S, nkv, hd, t0, len), rows_of(v, b, S, nkv, hd, t0, len),
                             rows_of(dout, b, S, nh, hd, t0, len), 1, len, nh, nkv, hd, {});
      for (std::int64_t t = 0; t < len; ++t) {
        for (std::int64_t i = 0; i < nh * hd; ++i) {
          const auto at = static_cast<std::size_t>((b * S + t0 + t) * nh * hd + i);
          const auto a1 = static_cast<std::size_t>(t * nh * hd + i);
          diff(packed.out[at], one.out[a1]);
          diff(packed.dq[at], one.dq[a1]);
        }
        for (std::int64_t i = 0; i < nkv * hd; ++i) {
          const auto at = static_cast<std::size_t>((b * S + t0 + t) * nkv * hd + i);
          const auto a1 = static_cast<std::size_t>(t * nkv * hd + i);
          diff(packed.dk[at], one.dk[a1]);
          diff(packed.dv[at], one.dv[a1]);
        }
        for (std::int64_t h = 0; h < nh; ++h)
          diff(packed.lse[static_cast<std::size_t>((b * nh + h) * S + t0 + t)],
               one.lse[static_cast<std::size_t>(h * len + t)]);
      }
      t0 += len;
    }
  }
  return worst;
}

}  // namespace

TEST_CASE("attention with a document mask equals attention per document (float64)",
          "[kernels][attention][document_mask]") {
  // Row 0: documents that end inside, at and across tile edges; row 1: a
  // one-token document first (a window that starts with a separator), then
  // runs of length-1 documents; row 2: one document (plain causal).
  const std::int64_t S = 37;
  const std::vector<std::vector<std::int64_t>> lengths = {
      {5, 3, 8, 1, 16, 4}, {1, 1, 1, 9, 1, 1, 20, 2, 1}, {37}};
  const std::int64_t nh = 4, nkv = 2, hd = 16;
  // Small tiles (many tiles per document, fully masked ones skipped), tiles
  // that are not divisors of the document edges, and the default tiles.
  for (const attention_tiles tiles :
       {attention_tiles{4, 4}, attention_tiles{8, 16}, attention_tiles{5, 7}, attention_tiles{}}) {
    const double worst = packed_vs_separate(lengths, S, nh, nkv, hd, tiles);
    INFO("tiles q=" << tiles.q << " k=" << tiles.k << ": worst |packed - separate| = " << worst);
    // float64: the same sums in the same order up to added zeros; 1e-12 is
    // the project's float64 tolerance (DESIGN.md principle 6).
    CHECK(worst <= 1e-12);
  }
}

TEST_CASE("attention with a document mask: every document of length 1",
          "[kernels][attention][document_mask]") {
  const std::int64_t S = 9;
  const std::vector<std::vector<std::int64_t>> lengths = {std::vector<std::int64_t>(9, 1)};
  const double worst = packed_vs_separate(lengths, S, 2, 1, 8, attention_tiles{4, 4});
  INFO("worst |packed - separate| = " << worst);
  CHECK(worst <= 1e-12);
}

TEST_CASE("attention with a document mask: a query with nothing to attend to gives 0, not NaN",
          "[kernels][attention][document_mask]") {
  // doc_start above t (a key block that holds none of the query's keys, as a
  // context-parallel ring will pass): rows 0..5 see nothing, rows 6.. see
  // keys 6..t.
  const std::int64_t B = 1, S = 13, nh = 2, nkv = 1, hd = 8;
  std::vector<std::int32_t> ds(static_cast<std::size_t>(S), 6);
  const auto q = random_vector(B * S * nh * hd, 21), k = random_vector(B * S * nkv * hd, 22),
             v = random_vector(B * S * nkv * hd, 23), dout = random_vector(B * S * nh * hd, 24);
  const host_context ctx{&tessera::host::default_resource(), 0, attention_tiles{4, 4}};
  const result r = run(ctx, q, k, v, dout, B, S, nh, nkv, hd, {ds.data()});
  for (std::int64_t t = 0; t < S; ++t)
    for (std::int64_t h = 0; h < nh; ++h) {
      const double lse = r.lse[static_cast<std::size_t>(h * S + t)];
      if (t < 6)
        CHECK(lse == -std::numeric_limits<double>::infinity());
      else
        CHECK(std::isfinite(lse));
      for (std::int64_t d = 0; d < hd; ++d) {
        const auto i = static_cast<std::size_t>((t * nh + h) * hd + d);
        CHECK(std::isfinite(r.out[i]));
        CHECK(std::isfinite(r.dq[i]));
        if (t < 6) {
          CHECK(r.out[i] == 0.0);
          CHECK(r.dq[i] == 0.0);
        }
      }
    }
  for (std::size_t i = 0; i < r.dk.size(); ++i) {
    CHECK(std::isfinite(r.dk[i]));
    CHECK(std::isfinite(r.dv[i]));
    if (i < static_cast<std::size_t>(6 * nkv * hd)) {  // keys 0..5: no query sees them
      CHECK(r.dk[i] == 0.0);
      CHECK(r.dv[i] == 0.0);
    }
  }
}

TEST_CASE("attention with one document per row gives the bits of no mask",
          "[kernels][attention][document_mask]") {
  const std::int64_t B = 2, S = 45, nh = 4, nkv = 2, hd = 40;
  const auto q = random_vector(B * S * nh * hd, 31), k = random_vector(B * S * nkv * hd, 32),
             v = random_vector(B * S * nkv * hd, 33), dout = random_vector(B * S * nh * hd, 34);
  const std::vector<std::int32_t> zeros(static_cast<std::size_t>(B * S), 0);
  for (const attention_tiles tiles : {attention_tiles{8, 8}, attention_tiles{}}) {
    const host_context ctx{&tessera::host::default_resource(), 0, tiles};
    const result plain = run(ctx, q, k, v, dout, B, S, nh, nkv, hd, {});
    const result one = run(ctx, q, k, v, dout, B, S, nh, nkv, hd, {zeros.data()});
    CHECK(plain.out == one.out);
    CHECK(plain.lse == one.lse);
    CHECK(plain.dq == one.dq);
    CHECK(plain.dk == one.dk);
    CHECK(plain.dv == one.dv);
  }
}

}  // namespace test_kernels_attention_document_mask
