// Tests of the blocks of context-parallel (ring) attention in
// include/tessera/kernels/attention.hpp: attention_forward and
// attention_backward over a query chunk and a key chunk at global offsets
// (attention_span), and attention_merge. A sequence split over cp ranks,
// contiguously or head-tail (2 cp chunks, rank r holding r and 2 cp - 1 - r),
// and run block by block in ring order, merged by log-sum-exp, equals
// single-rank attention in float64 (1e-12), forward and backward, with and
// without a document mask, over tiles that do not divide the chunks. One
// block against a naive float64 block; blocks wholly in the future or past;
// the merge's -inf cases bit for bit; the default span's bits; the argument
// checks; the scratch the planner counts.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include <tessera/kernels/attention.hpp>

namespace test_kernels_attention_blocks {

namespace {

using tessera::bf16;
using tessera::kernels::attention_backward;
using tessera::kernels::attention_dq;
using tessera::kernels::attention_forward;
using tessera::kernels::attention_mask;
using tessera::kernels::attention_merge;
using tessera::kernels::attention_span;
using tessera::kernels::attention_tiles;
using tessera::kernels::host_context;

constexpr double nan = std::numeric_limits<double>::quiet_NaN();
constexpr double inf = std::numeric_limits<double>::infinity();

std::vector<double> random_vector(std::int64_t n, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<double> x(static_cast<std::size_t>(n));
  for (auto& e : x) e = u(gen);
  return x;
}

template <class T>
std::vector<T> cast(const std::vector<double>& x) {
  std::vector<T> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = tessera::to<T>(x[i]);
  return y;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// doc_start (B, S) of rows cut into documents of the given lengths (each
// row's lengths sum to S): global first-key positions.
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

// Rows [t0, t0 + len) of every batch row of a (B, S, w) tensor (w elements a
// row), as a (B, len, w) one.
template <class U>
std::vector<U> rows_of(const std::vector<U>& x, std::int64_t B, std::int64_t S, std::int64_t w,
                       std::int64_t t0, std::int64_t len) {
  std::vector<U> y;
  for (std::int64_t b = 0; b < B; ++b) {
    const auto first = x.begin() + (b * S + t0) * w;
    y.insert(y.end(), first, first + len * w);
  }
  return y;
}

// Rows [t0, t0 + len) of every (b, h) of a (B, nh, S) tensor, as (B, nh, len).
std::vector<double> lse_rows_of(const std::vector<double>& x, std::int64_t B, std::int64_t nh,
                                std::int64_t S, std::int64_t t0, std::int64_t len) {
  return rows_of(x, B * nh, S, 1, t0, len);
}

// A whole sequence: inputs (B, S, ., hd) in float64 and the single-rank results.
struct problem {
  std::int64_t B, S, nh, nkv, hd;
  std::vector<double> q, k, v, dout;
  std::vector<std::int32_t> ds;  // (B, S) global doc_start, or empty: no mask
  std::vector<double> out, lse, dq, dk, dv;

  const std::int32_t* doc_start() const { return ds.empty() ? nullptr : ds.data(); }
};

problem make_problem(const host_context& ctx, std::int64_t B, std::int64_t S, std::int64_t nh,
                     std::int64_t nkv, std::int64_t hd, std::vector<std::int32_t> ds) {
  problem p{B, S, nh, nkv, hd, {}, {}, {}, {}, std::move(ds), {}, {}, {}, {}, {}};
  p.q = random_vector(B * S * nh * hd, 41);
  p.k = random_vector(B * S * nkv * hd, 42);
  p.v = random_vector(B * S * nkv * hd, 43);
  p.dout = random_vector(B * S * nh * hd, 44);
  p.out.assign(p.q.size(), nan);
  p.lse.assign(static_cast<std::size_t>(B * nh * S), nan);
  attention_forward<double>(ctx, p.out.data(), p.lse.data(), p.q.data(), p.k.data(), p.v.data(), B,
                            S, nh, nkv, hd, {p.doc_start()});
  p.dq.assign(p.q.size(), nan);
  p.dk.assign(p.k.size(), nan);
  p.dv.assign(p.v.size(), nan);
  attention_backward<double, double>(ctx, p.dq.data(), p.dk.data(), p.dv.data(), p.dout.data(),
                                     p.q.data(), p.k.data(), p.v.data(), p.out.data(), p.lse.data(),
                                     B, S, nh, nkv, hd, {p.doc_start()});
  return p;
}

// How a sequence is cut: chunk c holds positions [start[c], start[c + 1]);
// rank r holds the chunks ranks[r], in order.
struct layout {
  std::vector<std::int64_t> start;
  std::vector<std::vector<std::size_t>> ranks;
  std::int64_t length(std::size_t c) const { return start[c + 1] - start[c]; }
};

layout contiguous(std::int64_t S, std::int64_t cp) {
  layout l;
  for (std::int64_t r = 0; r <= cp; ++r) l.start.push_back(r * (S / cp));
  for (std::int64_t r = 0; r < cp; ++r) l.ranks.push_back({static_cast<std::size_t>(r)});
  return l;
}

// Head-tail load balancing: 2 cp chunks, rank r holds r and 2 cp - 1 - r.
layout head_tail(std::int64_t S, std::int64_t cp) {
  layout l;
  const std::int64_t c = S / (2 * cp);
  for (std::int64_t i = 0; i <= 2 * cp; ++i) l.start.push_back(i * c);
  for (std::int64_t r = 0; r < cp; ++r)
    l.ranks.push_back({static_cast<std::size_t>(r), static_cast<std::size_t>(2 * cp - 1 - r)});
  return l;
}

struct worst_errors {
  double out = 0, lse = 0, dq = 0, dk = 0, dv = 0;
};

double worst_diff(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double w = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i] == b[i]) continue;    // equal infinities included
    REQUIRE(std::isfinite(a[i]));  // written, and not NaN
    w = std::max(w, std::abs(a[i] - b[i]));
  }
  return w;
}

// Every rank runs its query chunks against every key chunk in ring order
// (step i: the chunks of rank r - i), forward merged from out 0, lse -inf;
// then the backward of every block from the merged out and lse, dq
// accumulated per query chunk and each key chunk's dk, dv summed over the
// ranks. Returns the worst differences from single-rank attention.
worst_errors ring(const host_context& ctx, const problem& p, const layout& l) {
  const std::int64_t B = p.B, nh = p.nh, nkv = p.nkv, hd = p.hd, S = p.S;
  const std::size_t cp = l.ranks.size();
  std::vector<double> out(p.out.size(), nan), lse(p.lse.size(), nan), dq(p.dq.size(), nan);
  std::vector<double> dk(p.dk.size(), 0.0), dv(p.dv.size(), 0.0);
  for (std::size_t r = 0; r < cp; ++r)
    for (std::size_t qc : l.ranks[r]) {
      const std::int64_t q0 = l.start[qc], Sq = l.length(qc);
      const auto q = rows_of(p.q, B, S, nh * hd, q0, Sq);
      const auto dout = rows_of(p.dout, B, S, nh * hd, q0, Sq);
      const auto ds = p.ds.empty() ? p.ds : rows_of(p.ds, B, S, 1, q0, Sq);
      const attention_mask mask{ds.empty() ? nullptr : ds.data()};
      std::vector<double> o_acc(q.size(), 0.0),
          lse_acc(static_cast<std::size_t>(B * nh * Sq), -inf);
      std::vector<double> o_part(q.size()), lse_part(lse_acc.size());
      // Forward.
      for (std::size_t i = 0; i < cp; ++i)
        for (std::size_t kc : l.ranks[(r + cp - i) % cp]) {
          const std::int64_t k0 = l.start[kc], Sk = l.length(kc);
          const auto k = rows_of(p.k, B, S, nkv * hd, k0, Sk),
                     v = rows_of(p.v, B, S, nkv * hd, k0, Sk);
          std::fill(o_part.begin(), o_part.end(), nan);
          std::fill(lse_part.begin(), lse_part.end(), nan);
          attention_forward<double, double>(ctx, o_part.data(), lse_part.data(), q.data(), k.data(),
                                            v.data(), B, Sq, nh, nkv, hd, mask, {q0, k0, Sk});
          for (double x : o_part) REQUIRE(std::isfinite(x));
          for (double x : lse_part) REQUIRE(!std::isnan(x));
          attention_merge(ctx, o_acc.data(), lse_acc.data(), o_part.data(), lse_part.data(), B, Sq,
                          nh, hd);
        }
      // Backward, from the merged (final) out and lse.
      std::vector<double> dq_acc(q.size(), 0.0);
      for (std::size_t i = 0; i < cp; ++i)
        for (std::size_t kc : l.ranks[(r + cp - i) % cp]) {
          const std::int64_t k0 = l.start[kc], Sk = l.length(kc);
          const auto k = rows_of(p.k, B, S, nkv * hd, k0, Sk),
                     v = rows_of(p.v, B, S, nkv * hd, k0, Sk);
          std::vector<double> dk_part(k.size(), nan), dv_part(v.size(), nan);
          attention_backward<double, double>(ctx, dq_acc.data(), dk_part.data(), dv_part.data(),
                                             dout.data(), q.data(), k.data(), v.data(),
                                             o_acc.data(), lse_acc.data(), B, Sq, nh, nkv, hd, mask,
                                             {q0, k0, Sk}, attention_dq::accumulate);
          for (std::int64_t b = 0; b < B; ++b)
            for (std::int64_t j = 0; j < Sk * nkv * hd; ++j) {
              const auto at = static_cast<std::size_t>((b * S + k0) * nkv * hd + j);
              const auto from = static_cast<std::size_t>(b * Sk * nkv * hd + j);
              REQUIRE(std::isfinite(dk_part[from]));
              REQUIRE(std::isfinite(dv_part[from]));
              dk[at] += dk_part[from];
              dv[at] += dv_part[from];
            }
        }
      // The chunk's rows back into the whole sequence's.
      for (std::int64_t b = 0; b < B; ++b) {
        std::copy_n(o_acc.begin() + b * Sq * nh * hd, Sq * nh * hd,
                    out.begin() + (b * S + q0) * nh * hd);
        std::copy_n(dq_acc.begin() + b * Sq * nh * hd, Sq * nh * hd,
                    dq.begin() + (b * S + q0) * nh * hd);
        for (std::int64_t h = 0; h < nh; ++h)
          std::copy_n(lse_acc.begin() + (b * nh + h) * Sq, Sq, lse.begin() + (b * nh + h) * S + q0);
      }
    }
  return {worst_diff(out, p.out), worst_diff(lse, p.lse), worst_diff(dq, p.dq),
          worst_diff(dk, p.dk), worst_diff(dv, p.dv)};
}

// One block in float64 from its definition (materialised scores over global
// positions): out, lse of the block's queries against its keys, and the
// backward from the given final out and lse (dq written).
struct naive_block {
  std::vector<double> out, lse, dq, dk, dv;
};

naive_block naive(const std::vector<double>& q, const std::vector<double>& k,
                  const std::vector<double>& v, const std::vector<double>& dout,
                  const std::vector<double>& out_final, const std::vector<double>& lse_final,
                  const std::int32_t* ds, std::int64_t B, std::int64_t S, std::int64_t nh,
                  std::int64_t nkv, std::int64_t hd, attention_span span) {
  const std::int64_t Sk = span.Sk;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  naive_block n;
  n.out.assign(q.size(), 0.0);
  n.lse.assign(static_cast<std::size_t>(B * nh * S), -inf);
  n.dq.assign(q.size(), 0.0);
  n.dk.assign(k.size(), 0.0);
  n.dv.assign(v.size(), 0.0);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < nh; ++h) {
      const std::int64_t g = h / (nh / nkv);
      const auto qi = [&](std::int64_t t) { return ((b * S + t) * nh + h) * hd; };
      const auto ki = [&](std::int64_t s) { return ((b * Sk + s) * nkv + g) * hd; };
      for (std::int64_t t = 0; t < S; ++t) {
        const std::int64_t first = ds ? ds[b * S + t] : 0;
        std::vector<double> sc(static_cast<std::size_t>(Sk), -inf);
        double mx = -inf;
        for (std::int64_t s = 0; s < Sk; ++s) {
          const std::int64_t key = span.k0 + s;
          if (key > span.q0 + t || key < first) continue;
          double x = 0;
          for (std::int64_t d = 0; d < hd; ++d) x += q[qi(t) + d] * k[ki(s) + d];
          sc[s] = x * scale;
          mx = std::max(mx, sc[s]);
        }
        if (mx == -inf) continue;  // nothing to attend to: out 0, lse -inf, no gradient
        double sum = 0;
        for (std::int64_t s = 0; s < Sk; ++s) sum += std::exp(sc[s] - mx);
        n.lse[(b * nh + h) * S + t] = mx + std::log(sum);
        for (std::int64_t s = 0; s < Sk; ++s)
          for (std::int64_t d = 0; d < hd; ++d)
            n.out[qi(t) + d] += std::exp(sc[s] - mx) / sum * v[ki(s) + d];
        // Backward from the final out and lse.
        double D = 0;
        for (std::int64_t d = 0; d < hd; ++d) D += dout[qi(t) + d] * out_final[qi(t) + d];
        const double L = lse_final[(b * nh + h) * S + t];
        for (std::int64_t s = 0; s < Sk; ++s) {
          if (sc[s] == -inf) continue;
          const double P = std::exp(sc[s] - L);
          double dP = 0;
          for (std::int64_t d = 0; d < hd; ++d) dP += dout[qi(t) + d] * v[ki(s) + d];
          const double dS = P * (dP - D) * scale;
          for (std::int64_t d = 0; d < hd; ++d) {
            n.dq[qi(t) + d] += dS * k[ki(s) + d];
            n.dk[ki(s) + d] += dS * q[qi(t) + d];
            n.dv[ki(s) + d] += P * dout[qi(t) + d];
          }
        }
      }
    }
  return n;
}

}  // namespace

TEST_CASE("ring attention over cp ranks equals single-rank attention (float64)",
          "[kernels][attention][attention_blocks]") {
  // S = 56: contiguous chunks of 28 (cp 2) and 14 (cp 4), head-tail chunks
  // of 14 (cp 2) and 7 (cp 4), none a multiple of the tiles 3 and 5 (nor 4
  // and 8); the default tiles hold a whole chunk.
  const std::int64_t B = 2, S = 56, nh = 4, nkv = 2, hd = 40;
  // Documents crossing chunk edges, one of length 1 (at 14, a chunk edge
  // under every layout), one starting at a chunk's first row (21, 28);
  // row 1: a one-token document first, and a run of them at 21.
  const std::vector<std::vector<std::int64_t>> lengths = {{5, 9, 1, 6, 7, 13, 15},
                                                          {1, 20, 1, 1, 33}};
  for (const bool documents : {false, true})
    for (const attention_tiles tiles :
         {attention_tiles{3, 5}, attention_tiles{4, 8}, attention_tiles{}}) {
      const host_context ctx{&tessera::host::default_resource(), 0, tiles};
      const problem p = make_problem(ctx, B, S, nh, nkv, hd,
                                     documents ? doc_starts(lengths) : std::vector<std::int32_t>{});
      for (const std::int64_t cp : {2, 4})
        for (const bool balanced : {false, true}) {
          const worst_errors e = ring(ctx, p, balanced ? head_tail(S, cp) : contiguous(S, cp));
          INFO("documents " << documents << ", tiles q=" << tiles.q << " k=" << tiles.k
                            << ", cp=" << cp << (balanced ? " head-tail" : " contiguous")
                            << ": worst |ring - single| out " << e.out << " lse " << e.lse << " dq "
                            << e.dq << " dk " << e.dk << " dv " << e.dv);
          // float64: the same function summed in another order (per block,
          // then merged); the project's float64 tolerance (DESIGN.md
          // principle 6).
          CHECK(e.out <= 1e-12);
          CHECK(e.lse <= 1e-12);
          CHECK(e.dq <= 1e-12);
          CHECK(e.dk <= 1e-12);
          CHECK(e.dv <= 1e-12);
        }
    }
}

TEST_CASE("ring attention over chunks of uneven lengths, one of a single token (float64)",
          "[kernels][attention][attention_blocks]") {
  const std::int64_t B = 2, S = 45, nh = 4, nkv = 2, hd = 16;
  layout l;
  l.start = {0, 5, 6, 23, 31, 45};
  for (std::size_t c = 0; c < 5; ++c) l.ranks.push_back({c});
  const std::vector<std::vector<std::int64_t>> lengths = {{6, 17, 22}, {3, 1, 1, 2, 38}};
  for (const bool documents : {false, true}) {
    const host_context ctx{&tessera::host::default_resource(), 0, attention_tiles{3, 5}};
    const problem p = make_problem(ctx, B, S, nh, nkv, hd,
                                   documents ? doc_starts(lengths) : std::vector<std::int32_t>{});
    const worst_errors e = ring(ctx, p, l);
    INFO("documents " << documents << ": worst |ring - single| out " << e.out << " lse " << e.lse
                      << " dq " << e.dq << " dk " << e.dk << " dv " << e.dv);
    CHECK(e.out <= 1e-12);
    CHECK(e.lse <= 1e-12);
    CHECK(e.dq <= 1e-12);
    CHECK(e.dk <= 1e-12);
    CHECK(e.dv <= 1e-12);
  }
}

TEST_CASE("an attention block at global offsets equals a naive float64 block",
          "[kernels][attention][attention_blocks]") {
  // A whole sequence of 40 tokens; blocks of its queries and keys: keys
  // overlapping the queries' diagonal from either side, wholly in the past,
  // wholly in the future, touching at one position.
  const std::int64_t B = 2, Sg = 40, nh = 4, nkv = 2, hd = 8;
  const std::vector<std::vector<std::int64_t>> lengths = {{3, 12, 1, 9, 15}, {20, 1, 19}};
  struct block {
    std::int64_t q0, S, k0, Sk;
  };
  for (const bool documents : {false, true})
    for (const attention_tiles tiles : {attention_tiles{3, 5}, attention_tiles{}}) {
      const host_context ctx{&tessera::host::default_resource(), 0, tiles};
      const problem p = make_problem(ctx, B, Sg, nh, nkv, hd,
                                     documents ? doc_starts(lengths) : std::vector<std::int32_t>{});
      for (const block blk :
           {block{10, 13, 4, 11}, block{10, 13, 17, 9}, block{25, 11, 2, 17}, block{5, 9, 20, 7},
            block{12, 7, 18, 4}, block{12, 7, 19, 4}, block{0, 40, 0, 40}, block{33, 7, 0, 1}}) {
        const attention_span span{blk.q0, blk.k0, blk.Sk};
        const std::int64_t S = blk.S;
        const auto q = rows_of(p.q, B, Sg, nh * hd, blk.q0, S);
        const auto dout = rows_of(p.dout, B, Sg, nh * hd, blk.q0, S);
        const auto out_final = rows_of(p.out, B, Sg, nh * hd, blk.q0, S);
        const auto lse_final = lse_rows_of(p.lse, B, nh, Sg, blk.q0, S);
        const auto k = rows_of(p.k, B, Sg, nkv * hd, blk.k0, blk.Sk);
        const auto v = rows_of(p.v, B, Sg, nkv * hd, blk.k0, blk.Sk);
        const auto ds = p.ds.empty() ? p.ds : rows_of(p.ds, B, Sg, 1, blk.q0, S);
        const std::int32_t* dsp = ds.empty() ? nullptr : ds.data();
        const naive_block n =
            naive(q, k, v, dout, out_final, lse_final, dsp, B, S, nh, nkv, hd, span);

        std::vector<double> out(q.size(), nan), lse(static_cast<std::size_t>(B * nh * S), nan);
        attention_forward<double, double>(ctx, out.data(), lse.data(), q.data(), k.data(), v.data(),
                                          B, S, nh, nkv, hd, {dsp}, span);
        std::vector<double> dq(q.size(), nan), dk(k.size(), nan), dv(v.size(), nan);
        attention_backward<double, double>(ctx, dq.data(), dk.data(), dv.data(), dout.data(),
                                           q.data(), k.data(), v.data(), out_final.data(),
                                           lse_final.data(), B, S, nh, nkv, hd, {dsp}, span);
        INFO("documents " << documents << ", tiles q=" << tiles.q << " k=" << tiles.k
                          << ", queries " << blk.q0 << "+" << S << ", keys " << blk.k0 << "+"
                          << blk.Sk);
        CHECK(worst_diff(out, n.out) <= 1e-12);
        CHECK(worst_diff(lse, n.lse) <= 1e-12);  // -inf where the naive block has -inf
        CHECK(worst_diff(dq, n.dq) <= 1e-12);
        CHECK(worst_diff(dk, n.dk) <= 1e-12);
        CHECK(worst_diff(dv, n.dv) <= 1e-12);
      }
    }
}

TEST_CASE("an attention block wholly in the future writes out 0 and lse -inf, gradients 0",
          "[kernels][attention][attention_blocks]") {
  const std::int64_t B = 2, S = 9, Sk = 6, nh = 2, nkv = 1, hd = 8;
  const auto q = random_vector(B * S * nh * hd, 51), k = random_vector(B * Sk * nkv * hd, 52),
             v = random_vector(B * Sk * nkv * hd, 53), dout = random_vector(B * S * nh * hd, 54);
  const host_context ctx{&tessera::host::default_resource(), 0, attention_tiles{4, 4}};
  const attention_span span{7, 16, Sk};  // queries 7..15, keys 16..21
  std::vector<double> out(q.size(), nan), lse(static_cast<std::size_t>(B * nh * S), nan);
  attention_forward<double, double>(ctx, out.data(), lse.data(), q.data(), k.data(), v.data(), B, S,
                                    nh, nkv, hd, {}, span);
  for (double x : out) CHECK(x == 0.0);
  for (double x : lse) CHECK(x == -inf);
  // Backward with any finite final out and lse: nothing flows.
  const auto out_final = random_vector(B * S * nh * hd, 55),
             lse_final = random_vector(B * nh * S, 56);
  std::vector<double> dk(k.size(), nan), dv(v.size(), nan);
  std::vector<double> dq(q.size(), nan);
  attention_backward<double, double>(ctx, dq.data(), dk.data(), dv.data(), dout.data(), q.data(),
                                     k.data(), v.data(), out_final.data(), lse_final.data(), B, S,
                                     nh, nkv, hd, {}, span);
  for (double x : dq) CHECK(x == 0.0);
  for (double x : dk) CHECK(x == 0.0);
  for (double x : dv) CHECK(x == 0.0);
  // Accumulating leaves dq's bits as they were.
  const auto dq0 = random_vector(B * S * nh * hd, 57);
  std::vector<double> dq1 = dq0;
  attention_backward<double, double>(ctx, dq1.data(), dk.data(), dv.data(), dout.data(), q.data(),
                                     k.data(), v.data(), out_final.data(), lse_final.data(), B, S,
                                     nh, nkv, hd, {}, span, attention_dq::accumulate);
  CHECK(same_bits(dq1, dq0));
}

TEST_CASE("attention_merge: -inf is exact, large gaps are stable, the order matches a naive sum",
          "[kernels][attention][attention_blocks]") {
  const host_context ctx{};
  // Rows (B 1, S 6, nh 1, hd 3): finite with finite, empty block, empty
  // accumulator, both empty, gaps of 1400 and 0.
  const double neg0 = -0.0;
  std::vector<double> o_acc = {0.25, neg0, -1.5, 0.5, -0.75, 2.0, 0.0,  0.0, 0.0,
                               0.0,  0.0,  0.0,  0.1, 0.2,   0.3, -0.4, 0.6, 0.8};
  std::vector<double> lse_acc = {1.25, 3.0, -inf, -inf, 700.0, -2.0};
  const std::vector<double> o_part = {0.5, 0.125, 1.0, 0.0, 0.0, 0.0, 0.3, -0.2, 0.9,
                                      0.0, 0.0,   0.0, 0.7, 0.8, 0.9, 0.5, 0.25, -1.0};
  const std::vector<double> lse_part = {-0.5, -inf, 2.5, -inf, -700.0, -2.0};
  const auto o0 = o_acc;
  attention_merge(ctx, o_acc.data(), lse_acc.data(), o_part.data(), lse_part.data(), 1, 6, 1, 3);
  // Row 0: the definition, in long double.
  const long double L = std::log(std::exp(1.25L) + std::exp(-0.5L));
  CHECK(std::abs(lse_acc[0] - static_cast<double>(L)) <= 1e-15);
  for (int d = 0; d < 3; ++d) {
    const long double want = o0[d] * std::exp(1.25L - L) + o_part[d] * std::exp(-0.5L - L);
    CHECK(std::abs(o_acc[d] - static_cast<double>(want)) <= 1e-15);
  }
  // Row 1: an empty block keeps the accumulator's bits (-0.0 included).
  CHECK(lse_acc[1] == 3.0);
  CHECK(std::memcmp(&o_acc[3], &o0[3], 3 * sizeof(double)) == 0);
  // Row 2: an empty accumulator takes the block's bits.
  CHECK(lse_acc[2] == 2.5);
  CHECK(std::memcmp(&o_acc[6], &o_part[6], 3 * sizeof(double)) == 0);
  // Row 3: both empty: out 0, lse -inf.
  CHECK(lse_acc[3] == -inf);
  for (int d = 9; d < 12; ++d) CHECK(o_acc[d] == 0.0);
  // Row 4: a gap of 1400 (exp would overflow): the larger side, unchanged.
  CHECK(lse_acc[4] == 700.0);
  for (int d = 12; d < 15; ++d) CHECK(o_acc[d] == o0[d]);
  // Row 5: equal lse: log 2 above, the mean.
  CHECK(std::abs(lse_acc[5] - (-2.0 + std::log(2.0))) <= 1e-15);
  for (int d = 15; d < 18; ++d) CHECK(std::abs(o_acc[d] - 0.5 * (o0[d] + o_part[d])) <= 1e-15);
  for (double x : o_acc) CHECK(!std::isnan(x));
}

TEST_CASE("the default attention span gives the bits of an explicit whole-sequence span",
          "[kernels][attention][attention_blocks]") {
  // Same call, one with the default span, one with {0, 0, S}: every output
  // bit equal, float64, float32 and bf16 (16-bit and float gradients), with
  // and without documents. (That the default reproduces the kernels before
  // spans existed is checked by the golden trajectories and the existing
  // attention tests, which pass unchanged.)
  const std::int64_t B = 2, S = 37, nh = 4, nkv = 2, hd = 40;
  const std::vector<std::vector<std::int64_t>> lengths = {{5, 3, 8, 1, 20}, {1, 1, 35}};
  const std::vector<std::int32_t> ds = doc_starts(lengths);
  const auto qd = random_vector(B * S * nh * hd, 61), kd = random_vector(B * S * nkv * hd, 62),
             vd = random_vector(B * S * nkv * hd, 63), dod = random_vector(B * S * nh * hd, 64);
  auto check = [&]<class T, class G>(const host_context& ctx, attention_mask mask) {
    using A = tessera::accum_t<T>;
    const auto q = cast<T>(qd), k = cast<T>(kd), v = cast<T>(vd);
    const auto dout = cast<G>(dod);
    std::vector<T> out[2];
    std::vector<A> lse[2];
    std::vector<G> dq[2], dk[2], dv[2];
    for (int i = 0; i < 2; ++i) {
      const attention_span span = i == 0 ? attention_span{} : attention_span{0, 0, S};
      out[i].resize(q.size());
      lse[i].resize(static_cast<std::size_t>(B * nh * S));
      attention_forward<T>(ctx, out[i].data(), lse[i].data(), q.data(), k.data(), v.data(), B, S,
                           nh, nkv, hd, mask, span);
      dq[i].resize(q.size());
      dk[i].resize(k.size());
      dv[i].resize(v.size());
      attention_backward<T, G>(ctx, dq[i].data(), dk[i].data(), dv[i].data(), dout.data(), q.data(),
                               k.data(), v.data(), out[i].data(), lse[i].data(), B, S, nh, nkv, hd,
                               mask, span);
    }
    CHECK(same_bits(out[0], out[1]));
    CHECK(same_bits(lse[0], lse[1]));
    CHECK(same_bits(dq[0], dq[1]));
    CHECK(same_bits(dk[0], dk[1]));
    CHECK(same_bits(dv[0], dv[1]));
  };
  for (const attention_tiles tiles : {attention_tiles{3, 5}, attention_tiles{}})
    for (const attention_mask mask : {attention_mask{}, attention_mask{ds.data()}}) {
      const host_context ctx{&tessera::host::default_resource(), 0, tiles};
      check.operator()<double, double>(ctx, mask);
      check.operator()<float, float>(ctx, mask);
      check.operator()<bf16, float>(ctx, mask);
      check.operator()<bf16, bf16>(ctx, mask);
    }
}

TEST_CASE("a bf16 block's float output rounds to the bits of its bf16 output",
          "[kernels][attention][attention_blocks]") {
  // O = accum_t<T> keeps the partial output unrounded: rounding it gives
  // what O = T stores (one rounding, at the store), and lse is the same.
  const std::int64_t B = 2, S = 19, Sk = 11, nh = 4, nkv = 2, hd = 40;
  const auto q = cast<bf16>(random_vector(B * S * nh * hd, 71)),
             k = cast<bf16>(random_vector(B * Sk * nkv * hd, 72)),
             v = cast<bf16>(random_vector(B * Sk * nkv * hd, 73));
  const host_context ctx{&tessera::host::default_resource(), 0, attention_tiles{3, 5}};
  const attention_span span{30, 24, Sk};  // keys 24..34 across the queries 30..48
  std::vector<bf16> out16(q.size());
  std::vector<float> out32(q.size()), lse16(static_cast<std::size_t>(B * nh * S)),
      lse32(lse16.size());
  attention_forward<bf16>(ctx, out16.data(), lse16.data(), q.data(), k.data(), v.data(), B, S, nh,
                          nkv, hd, {}, span);
  attention_forward<bf16, float>(ctx, out32.data(), lse32.data(), q.data(), k.data(), v.data(), B,
                                 S, nh, nkv, hd, {}, span);
  std::vector<bf16> rounded(out32.size());
  for (std::size_t i = 0; i < out32.size(); ++i) rounded[i] = tessera::to<bf16>(out32[i]);
  CHECK(same_bits(rounded, out16));
  CHECK(same_bits(lse32, lse16));
}

TEST_CASE("attention blocks refuse bad spans, and a 16-bit dq to accumulate into",
          "[kernels][attention][attention_blocks]") {
  const std::int64_t B = 1, S = 4, nh = 2, nkv = 1, hd = 8;
  std::vector<double> q(B * S * nh * hd, 0.5), kv(B * S * nkv * hd, 0.5), out(q.size()),
      lse(B * nh * S), dq(q.size()), dk(kv.size()), dv(kv.size());
  const host_context ctx{};
  auto forward = [&](attention_span span) {
    attention_forward<double>(ctx, out.data(), lse.data(), q.data(), kv.data(), kv.data(), B, S, nh,
                              nkv, hd, {}, span);
  };
  auto backward = [&](attention_span span) {
    attention_backward<double, double>(ctx, dq.data(), dk.data(), dv.data(), q.data(), q.data(),
                                       kv.data(), kv.data(), out.data(), lse.data(), B, S, nh, nkv,
                                       hd, {}, span);
  };
  using Catch::Matchers::Contains;
  for (const auto& [span, what] :
       {std::pair{attention_span{-1, 0, 4}, "q0=-1"}, std::pair{attention_span{0, -3, 4}, "k0=-3"},
        std::pair{attention_span{0, 0, 0}, "Sk=0"}, std::pair{attention_span{0, 0, -2}, "Sk=-2"}}) {
    CHECK_THROWS_AS(forward(span), tessera::config_error);
    CHECK_THROWS_WITH(forward(span), Contains(what) && Contains("attention_forward"));
    CHECK_THROWS_WITH(backward(span), Contains(what) && Contains("attention_backward"));
    // The check alone, as context parallelism runs it before any traffic.
    CHECK_THROWS_WITH(attention_check_span(ctx, S, span), Contains(what));
  }
  CHECK_NOTHROW(forward(attention_span{0, 0, -1}));
  CHECK(attention_check_span(ctx, S, attention_span{0, 0, -1}) == S);
  CHECK(attention_check_span(ctx, S, attention_span{40, 12, 7}) == 7);
  // Accumulating dq in bf16 would round a ring's sum per block.
  const auto qb = cast<bf16>(q), kb = cast<bf16>(kv), ob = cast<bf16>(out);
  std::vector<float> lse32(lse.size(), 0.0f);
  std::vector<bf16> g16(q.size()), gk16(kv.size()), gv16(kv.size());
  CHECK_THROWS_WITH(
      (attention_backward<bf16, bf16>(ctx, g16.data(), gk16.data(), gv16.data(), g16.data(),
                                      qb.data(), kb.data(), kb.data(), ob.data(), lse32.data(), B,
                                      S, nh, nkv, hd, {}, {}, attention_dq::accumulate)),
      Contains("attention_dq::accumulate"));
  std::vector<double> o(q.size()), l(lse.size());
  CHECK_THROWS_WITH(attention_merge(ctx, o.data(), l.data(), o.data(), l.data(), B, 0, nh, hd),
                    Contains("S=0"));
}

TEST_CASE("an attention block's scratch is what the planner counts, for Sk != S",
          "[kernels][attention][attention_blocks]") {
  // Keys fewer than the key tile: Bk clamps to Sk, not S.
  const std::int64_t B = 2, S = 50, Sk = 7, nh = 4, nkv = 2, hd = 16;
  const attention_tiles tiles{16, 64};
  const auto q = random_vector(B * S * nh * hd, 81), k = random_vector(B * Sk * nkv * hd, 82),
             v = random_vector(B * Sk * nkv * hd, 83);
  tessera::host_memory_resource mr;
  const host_context ctx{&mr, 0, tiles};
  const attention_span span{60, 10, Sk};
#if defined(_OPENMP)
  const auto threads = static_cast<std::size_t>(omp_get_max_threads());
#else
  const std::size_t threads = 1;
#endif
  std::vector<double> out(q.size()), lse(static_cast<std::size_t>(B * nh * S));
  mr.reset_peak();
  attention_forward<double>(ctx, out.data(), lse.data(), q.data(), k.data(), v.data(), B, S, nh,
                            nkv, hd, {}, span);
  const auto fwd = static_cast<std::size_t>(
      tessera::kernels::detail::attention_forward_tile_elements(tiles, S, Sk, hd));
  CHECK(mr.stats().peak_allocated == threads * fwd * sizeof(double));
  CHECK(fwd < static_cast<std::size_t>(
                  tessera::kernels::detail::attention_forward_tile_elements(tiles, S, S, hd)));

  std::vector<double> dq(q.size()), dk(k.size()), dv(v.size());
  mr.reset_peak();
  attention_backward<double, double>(ctx, dq.data(), dk.data(), dv.data(), q.data(), q.data(),
                                     k.data(), v.data(), out.data(), lse.data(), B, S, nh, nkv, hd,
                                     {}, span, attention_dq::accumulate);
  const auto bwd = static_cast<std::size_t>(
      tessera::kernels::detail::attention_backward_tile_elements(tiles, S, Sk, hd));
  // D (B nh S) and the tiles; no dQ copy for float64 gradients.
  CHECK(mr.stats().peak_allocated ==
        (static_cast<std::size_t>(B * nh * S) + threads * bwd) * sizeof(double));
}

}  // namespace test_kernels_attention_blocks
