// Tests of include/tessera/kernels/attention.hpp: the tiled causal GQA
// attention against a naive float64 attention (materialised scores), finite
// differences, float32 and bf16 against float64, memory linear in S, and
// bit-for-bit determinism.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include <tessera/kernels/attention.hpp>

namespace test_kernels_attention {

namespace {

using tessera::bf16;
using tessera::kernels::attention_backward;
using tessera::kernels::attention_forward;
using tessera::kernels::attention_tiles;

struct dims {
  std::int64_t B, S, nh, nkv, hd;
  std::int64_t q_numel() const { return B * S * nh * hd; }
  std::int64_t kv_numel() const { return B * S * nkv * hd; }
  std::int64_t lse_numel() const { return B * nh * S; }
};

std::vector<double> random_vector(std::int64_t n, std::uint64_t seed, double lo = -1.0,
                                  double hi = 1.0) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> u(lo, hi);
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
std::vector<double> widen(const std::vector<T>& x) {
  std::vector<double> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = tessera::to<double>(x[i]);
  return y;
}

// Naive causal GQA attention in float64: materialises the S x S scores of
// each (b, h), masks, softmaxes, multiplies by V.
void naive_attention(std::vector<double>& out, std::vector<double>& lse,
                     const std::vector<double>& q, const std::vector<double>& k,
                     const std::vector<double>& v, const dims& d) {
  out.assign(static_cast<std::size_t>(d.q_numel()), 0.0);
  lse.assign(static_cast<std::size_t>(d.lse_numel()), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d.hd));
  std::vector<double> sc(static_cast<std::size_t>(d.S * d.S));
  for (std::int64_t b = 0; b < d.B; ++b)
    for (std::int64_t h = 0; h < d.nh; ++h) {
      const std::int64_t g = h / (d.nh / d.nkv);
      auto Q = [&](std::int64_t t, std::int64_t i) {
        return q[((b * d.S + t) * d.nh + h) * d.hd + i];
      };
      auto K = [&](std::int64_t t, std::int64_t i) {
        return k[((b * d.S + t) * d.nkv + g) * d.hd + i];
      };
      auto V = [&](std::int64_t t, std::int64_t i) {
        return v[((b * d.S + t) * d.nkv + g) * d.hd + i];
      };
      for (std::int64_t t = 0; t < d.S; ++t)
        for (std::int64_t s = 0; s < d.S; ++s) {
          double acc = 0;
          for (std::int64_t i = 0; i < d.hd; ++i) acc += Q(t, i) * K(s, i);
          sc[t * d.S + s] = s <= t ? acc * scale : -std::numeric_limits<double>::infinity();
        }
      for (std::int64_t t = 0; t < d.S; ++t) {
        double mx = -std::numeric_limits<double>::infinity();
        for (std::int64_t s = 0; s < d.S; ++s) mx = std::max(mx, sc[t * d.S + s]);
        double sum = 0;
        for (std::int64_t s = 0; s < d.S; ++s) sum += std::exp(sc[t * d.S + s] - mx);
        lse[(b * d.nh + h) * d.S + t] = mx + std::log(sum);
        for (std::int64_t s = 0; s <= t; ++s) {
          const double p = std::exp(sc[t * d.S + s] - mx) / sum;
          for (std::int64_t i = 0; i < d.hd; ++i)
            out[((b * d.S + t) * d.nh + h) * d.hd + i] += p * V(s, i);
        }
      }
    }
}

// Number of elements with |a - r| > abs_tol + rel_tol * |r| (NaN counts as bad).
template <class U>
std::int64_t count_bad(const std::vector<U>& a, const std::vector<double>& r, double rel_tol,
                       double abs_tol) {
  std::int64_t bad = 0;
  for (std::size_t i = 0; i < r.size(); ++i) {
    const double x = tessera::to<double>(a[i]);
    if (!(std::abs(x - r[i]) <= abs_tol + rel_tol * std::abs(r[i]))) ++bad;
  }
  return bad;
}

// max |a - r| / max |r|, or max |a - r| when r is all zero (as dq, dk for
// S = 1, where softmax over one key is constant). NaN in a gives +inf.
template <class U>
double rel_max_error(const std::vector<U>& a, const std::vector<double>& r) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < r.size(); ++i) {
    const double x = tessera::to<double>(a[i]);
    if (std::isnan(x)) return std::numeric_limits<double>::infinity();
    num = std::max(num, std::abs(x - r[i]));
    den = std::max(den, std::abs(r[i]));
  }
  return den > 0 ? num / den : num;
}

template <class T>
T poison() {
  return tessera::to<T>(std::numeric_limits<float>::quiet_NaN());
}

// Forward + backward of one configuration in storage type T, inputs given in double.
template <class T>
struct run_result {
  using A = tessera::accum_t<T>;
  std::vector<T> out;
  std::vector<A> lse, dq, dk, dv;
};

template <class T>
run_result<T> run_attention(const std::vector<double>& q, const std::vector<double>& k,
                            const std::vector<double>& v, const std::vector<double>& dout,
                            const dims& d, attention_tiles tiles, bool backward = true) {
  using A = tessera::accum_t<T>;
  run_result<T> r;
  auto qt = cast<T>(q), kt = cast<T>(k), vt = cast<T>(v);
  r.out.assign(q.size(), poison<T>());
  r.lse.assign(static_cast<std::size_t>(d.lse_numel()), poison<A>());
  const tessera::kernels::host_context tctx{&tessera::host::default_resource(), 0, tiles};
  attention_forward<T>(tctx, r.out.data(), r.lse.data(), qt.data(), kt.data(), vt.data(), d.B,
                       d.S, d.nh, d.nkv, d.hd);
  if (backward) {
    auto dot = cast<A>(dout);
    r.dq.assign(q.size(), poison<A>());
    r.dk.assign(k.size(), poison<A>());
    r.dv.assign(v.size(), poison<A>());
    attention_backward<T, A>(tctx, r.dq.data(), r.dk.data(), r.dv.data(), dot.data(), qt.data(),
                             kt.data(), vt.data(), r.out.data(), r.lse.data(), d.B, d.S, d.nh,
                             d.nkv, d.hd);
  }
  return r;
}

}  // namespace

TEST_CASE("attention forward equals a naive float64 attention", "[kernels][attention]") {
  const attention_tiles tile_sets[] = {{16, 16}, {64, 32}, {7, 5}};
  std::uint64_t seed = 1;
  for (std::int64_t S : {1, 7, 33, 65, 100})
    for (auto tiles : tile_sets)
      for (std::int64_t nkv : {1, 2, 4})
        for (std::int64_t hd : {8, 16}) {
          const dims d{2, S, 4, nkv, hd};
          auto q = random_vector(d.q_numel(), ++seed);
          auto k = random_vector(d.kv_numel(), ++seed);
          auto v = random_vector(d.kv_numel(), ++seed);
          std::vector<double> ref_out, ref_lse;
          naive_attention(ref_out, ref_lse, q, k, v, d);
          auto r = run_attention<double>(q, k, v, {}, d, tiles, false);
          INFO("S=" << S << " tiles=(" << tiles.q << "," << tiles.k << ") nkv=" << nkv
                    << " hd=" << hd);
          // float64: only summation order differs from the reference (1e-12).
          CHECK(count_bad(r.out, ref_out, 1e-12, 1e-12) == 0);
          CHECK(count_bad(r.lse, ref_lse, 1e-12, 1e-12) == 0);
        }
}

TEST_CASE("attention backward equals central finite differences in float64",
          "[kernels][attention]") {
  struct cfg {
    dims d;
    attention_tiles tiles;
  };
  const cfg cfgs[] = {
      {{2, 7, 4, 2, 8}, {3, 2}},    // GQA (2 heads per kv head), odd S, tiles not dividing S
      {{2, 33, 4, 1, 8}, {7, 5}},   // multi-query attention
      {{2, 1, 4, 4, 8}, {16, 16}},  // a single token
      {{2, 10, 4, 4, 16}, {}},      // multi-head, one tile
  };
  std::uint64_t seed = 100;
  for (const auto& c : cfgs) {
    const dims& d = c.d;
    INFO("S=" << d.S << " nkv=" << d.nkv << " hd=" << d.hd << " tiles=(" << c.tiles.q << ","
              << c.tiles.k << ")");
    auto q = random_vector(d.q_numel(), ++seed);
    auto k = random_vector(d.kv_numel(), ++seed);
    auto v = random_vector(d.kv_numel(), ++seed);
    auto w = random_vector(d.q_numel(), ++seed);  // L = sum(w * out), so dout = w
    auto r = run_attention<double>(q, k, v, w, d, c.tiles);

    // dL/dx_i ~ sum(w * (out(x + e) - out(x - e))) / 2e; truncation O(e^2) ~ 1e-10.
    // Thousands of tiny forwards: run them on one thread, so that a loaded
    // machine does not make each parallel region's barrier spin (the kernel's
    // result does not depend on the thread count).
    const double eps = 1e-5;
    auto fd = [&](std::vector<double>& x) {
#if defined(_OPENMP)
      const int nt = omp_get_max_threads();
      omp_set_num_threads(1);
#endif
      std::vector<double> g(x.size());
      for (std::size_t i = 0; i < x.size(); ++i) {
        const double x0 = x[i];
        x[i] = x0 + eps;
        auto plus = run_attention<double>(q, k, v, {}, d, c.tiles, false);
        x[i] = x0 - eps;
        auto minus = run_attention<double>(q, k, v, {}, d, c.tiles, false);
        x[i] = x0;
        double diff = 0;
        for (std::size_t j = 0; j < w.size(); ++j) diff += w[j] * (plus.out[j] - minus.out[j]);
        g[i] = diff / (2 * eps);
      }
#if defined(_OPENMP)
      omp_set_num_threads(nt);
#endif
      return g;
    };
    // Relative to the largest gradient entry; tolerance 1e-6 covers the O(e^2)
    // truncation and the roundoff 1e-16 / e of the difference quotient.
    CHECK(rel_max_error(r.dq, fd(q)) < 1e-6);
    CHECK(rel_max_error(r.dk, fd(k)) < 1e-6);
    CHECK(rel_max_error(r.dv, fd(v)) < 1e-6);
  }
}

TEST_CASE("attention in float32 agrees with float64", "[kernels][attention]") {
  const dims d{2, 65, 4, 2, 16};
  const attention_tiles tiles{16, 16};
  // Inputs exactly representable in float, so both runs see the same values.
  auto q = widen(cast<float>(random_vector(d.q_numel(), 201)));
  auto k = widen(cast<float>(random_vector(d.kv_numel(), 202)));
  auto v = widen(cast<float>(random_vector(d.kv_numel(), 203)));
  auto w = widen(cast<float>(random_vector(d.q_numel(), 204)));
  auto r64 = run_attention<double>(q, k, v, w, d, tiles);
  auto r32 = run_attention<float>(q, k, v, w, d, tiles);
  // float32: sums of <= S * hd terms in float, 1e-5 relative (DESIGN.md, principle 6).
  CHECK(rel_max_error(r32.out, widen(r64.out)) < 1e-5);
  CHECK(rel_max_error(r32.lse, widen(r64.lse)) < 1e-5);
  CHECK(rel_max_error(r32.dq, widen(r64.dq)) < 1e-5);
  CHECK(rel_max_error(r32.dk, widen(r64.dk)) < 1e-5);
  CHECK(rel_max_error(r32.dv, widen(r64.dv)) < 1e-5);
}

TEST_CASE("attention with bf16 inputs agrees with float64 on the same rounded inputs",
          "[kernels][attention]") {
  const dims d{2, 100, 4, 2, 16};
  const attention_tiles tiles{16, 16};
  auto q = widen(cast<bf16>(random_vector(d.q_numel(), 301)));
  auto k = widen(cast<bf16>(random_vector(d.kv_numel(), 302)));
  auto v = widen(cast<bf16>(random_vector(d.kv_numel(), 303)));
  auto w = widen(cast<float>(random_vector(d.q_numel(), 304)));
  auto rb = run_attention<bf16>(q, k, v, w, d, tiles);

  // Forward, per element: the float accumulation is good to ~1e-6 and the one
  // rounding to bf16 at the store adds at most half an ulp, 2^-9 |out|
  // relative; allow 2^-8 |ref| + 1e-5.
  std::vector<double> ref_out, ref_lse;
  naive_attention(ref_out, ref_lse, q, k, v, d);
  CHECK(count_bad(rb.out, ref_out, std::ldexp(1.0, -8), 1e-5) == 0);
  // lse is kept in float (accum_t<bf16>): float accumulation only.
  CHECK(count_bad(rb.lse, ref_lse, 1e-5, 1e-5) == 0);

  // Backward against float64 given the same backward inputs (the bf16-rounded
  // out and the float lse the forward produced): float accumulation only,
  // 1e-5 relative to the largest gradient, as for float32.
  {
    using tessera::kernels::attention_backward;
    auto out64 = widen(rb.out), lse64 = widen(rb.lse);
    std::vector<double> dq(q.size()), dk(k.size()), dv(v.size());
    const tessera::kernels::host_context tctx{&tessera::host::default_resource(), 0, tiles};
    attention_backward<double, double>(tctx, dq.data(), dk.data(), dv.data(), w.data(), q.data(),
                                       k.data(), v.data(), out64.data(), lse64.data(), d.B, d.S,
                                       d.nh, d.nkv, d.hd);
    CHECK(rel_max_error(rb.dq, dq) < 1e-5);
    CHECK(rel_max_error(rb.dk, dk) < 1e-5);
    CHECK(rel_max_error(rb.dv, dv) < 1e-5);
  }
  // End to end against the exact float64 gradients: the rounding of out to
  // bf16 (2^-9 relative) enters D = rowsum(dout * out) and through dS all
  // three gradients; allow 2^-7 (4 x 2^-9) of the largest gradient entry.
  {
    auto r64 = run_attention<double>(q, k, v, w, d, tiles);
    CHECK(rel_max_error(rb.dq, r64.dq) < std::ldexp(1.0, -7));
    CHECK(rel_max_error(rb.dk, r64.dk) < std::ldexp(1.0, -7));
    CHECK(rel_max_error(rb.dv, r64.dv) < std::ldexp(1.0, -7));
  }
}

TEST_CASE("attention memory is linear in S and far below S x S", "[kernels][attention]") {
  const std::int64_t B = 1, nh = 4, nkv = 2, hd = 16;
  std::vector<std::size_t> fwd_bytes, bwd_bytes, fwd_scratch;
  const std::int64_t Ss[] = {256, 512, 1024, 2048};
  for (std::int64_t S : Ss) {
    const dims d{B, S, nh, nkv, hd};
    // Inputs live in the default resource; only what forward saves (out, lse)
    // and the kernels' scratch are counted in mr.
    auto q = cast<float>(random_vector(d.q_numel(), 401));
    auto k = cast<float>(random_vector(d.kv_numel(), 402));
    auto v = cast<float>(random_vector(d.kv_numel(), 403));
    tessera::host_memory_resource mr;
    tessera::tensor<float> out(tessera::shape{B, S, nh, hd}, mr);
    tessera::tensor<float> lse(tessera::shape{B, nh, S}, mr);
    const std::size_t saved = out.bytes() + lse.bytes();
    attention_forward<float>(tessera::kernels::host_context{&mr}, out.data(), lse.data(), q.data(),
                             k.data(), v.data(), B, S, nh, nkv, hd);
    fwd_bytes.push_back(mr.stats().peak_allocated);
    fwd_scratch.push_back(mr.stats().peak_allocated - saved);
    CHECK(mr.stats().allocated == saved);  // scratch returned

    // Backward: gradients live outside mr; mr counts only the scratch.
    tessera::host_memory_resource mr_bwd;
    std::vector<float> dout = cast<float>(random_vector(d.q_numel(), 404));
    std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
    attention_backward<float, float>(tessera::kernels::host_context{&mr_bwd}, dq.data(), dk.data(),
                                     dv.data(), dout.data(), q.data(), k.data(), v.data(),
                                     out.data(), lse.data(), B, S, nh, nkv, hd);
    bwd_bytes.push_back(mr_bwd.stats().peak_allocated);
    CHECK(mr_bwd.stats().allocated == 0);
  }
  for (std::size_t i = 0; i < fwd_bytes.size(); ++i) {
    const std::int64_t S = Ss[i];
    INFO("S=" << S << " forward bytes=" << fwd_bytes[i] << " backward scratch=" << bwd_bytes[i]);
    // The forward's scratch is tile-sized: the same for every S.
    CHECK(fwd_scratch[i] == fwd_scratch[0]);
    // Far below one S x S float score matrix per head (what naive attention stores).
    const auto scores = static_cast<std::size_t>(B * nh * S * S) * sizeof(float);
    CHECK(fwd_bytes[i] * 3 < scores);
    CHECK(bwd_bytes[i] * 3 < scores);
    if (i > 0) {
      // Doubling S at most doubles the bytes: linear (plus a constant) in S.
      CHECK(static_cast<double>(fwd_bytes[i]) / static_cast<double>(fwd_bytes[i - 1]) <=
            2.0 + 1e-9);
      CHECK(static_cast<double>(bwd_bytes[i]) / static_cast<double>(bwd_bytes[i - 1]) <=
            2.0 + 1e-9);
    }
  }
}

TEST_CASE("attention is bit-for-bit deterministic, also across thread counts",
          "[kernels][attention]") {
  const dims d{2, 100, 4, 2, 16};
  const attention_tiles tiles{16, 16};
  auto q = random_vector(d.q_numel(), 501);
  auto k = random_vector(d.kv_numel(), 502);
  auto v = random_vector(d.kv_numel(), 503);
  auto w = random_vector(d.q_numel(), 504);
  auto same = [](const auto& a, const auto& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0;
  };
  auto r1 = run_attention<float>(q, k, v, w, d, tiles);
  auto r2 = run_attention<float>(q, k, v, w, d, tiles);
  CHECK(same(r1.out, r2.out));
  CHECK(same(r1.lse, r2.lse));
  CHECK(same(r1.dq, r2.dq));
  CHECK(same(r1.dk, r2.dk));
  CHECK(same(r1.dv, r2.dv));
#if defined(_OPENMP)
  const int nt = omp_get_max_threads();
  omp_set_num_threads(nt == 1 ? 3 : 1);
  auto r3 = run_attention<float>(q, k, v, w, d, tiles);
  omp_set_num_threads(nt);
  CHECK(same(r1.out, r3.out));
  CHECK(same(r1.lse, r3.lse));
  CHECK(same(r1.dq, r3.dq));
  CHECK(same(r1.dk, r3.dk));
  CHECK(same(r1.dv, r3.dv));
#endif
}

TEST_CASE("attention rejects bad sizes with config_error", "[kernels][attention]") {
  const tessera::kernels::host_context ctx{};
  std::vector<float> buf(4096, 1.0f);
  float* p = buf.data();
  using tessera::config_error;
  CHECK_THROWS_AS(attention_forward<float>(ctx, p, p, p, p, p, 1, 4, 4, 3, 8), config_error);
  CHECK_THROWS_WITH(attention_forward<float>(ctx, p, p, p, p, p, 1, 4, 4, 3, 8),
                    Catch::Contains("nkv=3 does not divide nh=4"));
  CHECK_THROWS_AS(attention_forward<float>(ctx, p, p, p, p, p, 1, 0, 4, 2, 8), config_error);
  CHECK_THROWS_AS(attention_forward<float>(ctx, p, p, p, p, p, -1, 4, 4, 2, 8), config_error);
  const tessera::kernels::host_context zero_tile{&tessera::host::default_resource(), 0, {0, 4}};
  CHECK_THROWS_AS(attention_forward<float>(zero_tile, p, p, p, p, p, 1, 4, 4, 2, 8), config_error);
  CHECK_THROWS_AS((attention_backward<float, float>(ctx, p, p, p, p, p, p, p, p, p, 1, 4, 4, 3, 8)),
                  config_error);
}

}  // namespace test_kernels_attention
