// Tests of include/tessera/kernels/cross_entropy.hpp: the chunked LM head +
// cross-entropy against an unfused float64 reference (full logits,
// log-softmax), finite differences, the ignore mask, out-of-vocabulary
// targets, scratch memory independent of B*S, bf16 inputs, and the one-row
// logits used for sampling.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <tessera/kernels/cross_entropy.hpp>

namespace test_kernels_cross_entropy {

namespace {

using tessera::bf16;
using tessera::kernels::lm_head_logits;

constexpr std::int32_t ignore = -100;

// The loss sum and the scored count of one call.
struct ce_result {
  double loss_sum = 0;
  std::int64_t scored = 0;
};

// kernels::lm_head_cross_entropy on (B, S + 1) windows: the targets are
// each window's last S tokens (the model's inputs are not needed here).
template <class T, class G>
ce_result lm_head_cross_entropy(const T* x, const T* wlm, const std::int32_t* tokens,
                                std::int64_t B, std::int64_t S, std::int64_t H, std::int64_t V,
                                std::int64_t chunk, G* dx, G* dwlm, tessera::accum_t<T> grad_scale,
                                std::int32_t ignore_index = ignore,
                                tessera::memory_resource& mr = tessera::host::default_resource()) {
  std::vector<std::int32_t> targets(static_cast<std::size_t>(B * S));
  ce_result r;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < S; ++t) {
      const std::int32_t y = tokens[b * (S + 1) + t + 1];
      targets[static_cast<std::size_t>(b * S + t)] = y;
      r.scored += y != ignore_index;
    }
  tessera::kernels::lm_head_cross_entropy(tessera::kernels::host_context{&mr}, &r.loss_sum, x, wlm,
                                          targets.data(), B * S, V, H, ignore_index, grad_scale,
                                          dx, dwlm, chunk);
  return r;
}

std::vector<double> random_vector(std::int64_t n, std::uint64_t seed, double lo = -1.0,
                                  double hi = 1.0) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> x(static_cast<std::size_t>(n));
  for (auto& e : x) e = u(gen);
  return x;
}

// (B, S + 1) tokens in [0, V); every `ignore_every`-th target is ignore_index.
std::vector<std::int32_t> random_tokens(std::int64_t B, std::int64_t S, std::int64_t V,
                                        std::uint64_t seed, int ignore_every = 0) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<std::int32_t> u(0, static_cast<std::int32_t>(V - 1));
  std::vector<std::int32_t> tok(static_cast<std::size_t>(B * (S + 1)));
  for (auto& t : tok) t = u(gen);
  if (ignore_every > 0)
    for (std::size_t i = 1; i < tok.size(); i += static_cast<std::size_t>(ignore_every))
      tok[i] = ignore;
  return tok;
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

// Unfused float64 reference: full (B*S, V) logits, log-softmax, loss sum and
// count, dx = gs * dloss/dx, dwlm += gs * dloss/dwlm.
struct reference {
  double loss_sum = 0;
  std::int64_t scored = 0;
  std::vector<double> dx, dwlm;
};

reference unfused_cross_entropy(const std::vector<double>& x, const std::vector<double>& wlm,
                                const std::vector<std::int32_t>& tok, std::int64_t B,
                                std::int64_t S, std::int64_t H, std::int64_t V, double gs,
                                const std::vector<double>& dwlm0) {
  reference r;
  const std::int64_t N = B * S;
  std::vector<double> logits(static_cast<std::size_t>(N * V));
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t v = 0; v < V; ++v) {
      double acc = 0;
      for (std::int64_t h = 0; h < H; ++h) acc += x[n * H + h] * wlm[v * H + h];
      logits[n * V + v] = acc;
    }
  r.dx.assign(x.size(), 0.0);
  r.dwlm = dwlm0;
  for (std::int64_t n = 0; n < N; ++n) {
    const std::int32_t y = tok[(n / S) * (S + 1) + n % S + 1];
    if (y == ignore) continue;
    ++r.scored;
    double mx = -std::numeric_limits<double>::infinity();
    for (std::int64_t v = 0; v < V; ++v) mx = std::max(mx, logits[n * V + v]);
    double sum = 0;
    for (std::int64_t v = 0; v < V; ++v) sum += std::exp(logits[n * V + v] - mx);
    const double logz = mx + std::log(sum);
    r.loss_sum += -(logits[n * V + y] - logz);  // -log_softmax[y]
    for (std::int64_t v = 0; v < V; ++v) {
      const double dl = gs * (std::exp(logits[n * V + v] - logz) - (v == y ? 1.0 : 0.0));
      for (std::int64_t h = 0; h < H; ++h) {
        r.dx[n * H + h] += dl * wlm[v * H + h];
        r.dwlm[v * H + h] += dl * x[n * H + h];
      }
    }
  }
  return r;
}

// max |a - r| / max |r| (NaN in a gives +inf).
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
struct ce_run {
  using G = tessera::accum_t<T>;
  ce_result res;
  std::vector<G> dx, dwlm;
};

// Runs the fused kernel in storage type T on double inputs (cast to T); dwlm
// starts at dwlm0 to check that it accumulates; dx is poisoned with NaN.
template <class T>
ce_run<T> run_ce(const std::vector<double>& x, const std::vector<double>& wlm,
                 const std::vector<std::int32_t>& tok, std::int64_t B, std::int64_t S,
                 std::int64_t H, std::int64_t V, std::int64_t chunk, double gs,
                 const std::vector<double>& dwlm0, bool grad = true,
                 tessera::memory_resource& mr = tessera::host::default_resource()) {
  using G = tessera::accum_t<T>;
  ce_run<T> r;
  auto xt = cast<T>(x), wt = cast<T>(wlm);
  if (grad) {
    r.dx.assign(x.size(), std::numeric_limits<G>::quiet_NaN());
    r.dwlm = cast<G>(dwlm0);
  }
  r.res = lm_head_cross_entropy<T, G>(xt.data(), wt.data(), tok.data(), B, S, H, V, chunk,
                                      grad ? r.dx.data() : nullptr, grad ? r.dwlm.data() : nullptr,
                                      static_cast<G>(gs), ignore, mr);
  return r;
}

}  // namespace

TEST_CASE("fused cross-entropy equals the unfused float64 reference for every chunk size",
          "[kernels][cross_entropy]") {
  const std::int64_t B = 2, S = 9, H = 16, V = 37;
  auto x = random_vector(B * S * H, 11);
  auto wlm = random_vector(V * H, 12);
  auto dwlm0 = random_vector(V * H, 13);
  auto tok = random_tokens(B, S, V, 14, 5);
  const double gs = 0.25;
  auto ref = unfused_cross_entropy(x, wlm, tok, B, S, H, V, gs, dwlm0);
  REQUIRE(ref.scored > 0);
  REQUIRE(ref.scored < B * S);
  for (std::int64_t chunk : {1, 3, 7, 64, 1000}) {
    INFO("chunk=" << chunk);
    auto r = run_ce<double>(x, wlm, tok, B, S, H, V, chunk, gs, dwlm0);
    CHECK(r.res.scored == ref.scored);
    // float64: only the summation order differs (1e-12).
    CHECK(r.res.loss_sum == Approx(ref.loss_sum).epsilon(1e-12));
    CHECK(r.res.loss_sum / static_cast<double>(r.res.scored) ==
          Approx(ref.loss_sum / static_cast<double>(ref.scored)).epsilon(1e-12));
    CHECK(rel_max_error(r.dx, ref.dx) < 1e-12);
    CHECK(rel_max_error(r.dwlm, ref.dwlm) < 1e-12);  // += onto dwlm0
    // Forward only (evaluation): same loss, nothing written.
    auto e = run_ce<double>(x, wlm, tok, B, S, H, V, chunk, gs, dwlm0, false);
    CHECK(e.res.scored == ref.scored);
    CHECK(e.res.loss_sum == Approx(ref.loss_sum).epsilon(1e-12));
  }
}

TEST_CASE("fused cross-entropy gradients equal central finite differences in float64",
          "[kernels][cross_entropy]") {
  const std::int64_t B = 2, S = 5, H = 8, V = 11;
  auto x = random_vector(B * S * H, 21);
  auto wlm = random_vector(V * H, 22, -2.0, 2.0);
  auto tok = random_tokens(B, S, V, 23, 4);
  const std::vector<double> zero(static_cast<std::size_t>(V * H), 0.0);
  const double gs = 0.5;
  auto r = run_ce<double>(x, wlm, tok, B, S, H, V, 3, gs, zero);
  // truncation O(eps^2) ~ 1e-10, roundoff ~ 1e-16 |loss| / eps ~ 1e-10.
  const double eps = 1e-5;
  auto loss = [&] {
    return run_ce<double>(x, wlm, tok, B, S, H, V, 3, gs, zero, false).res.loss_sum;
  };
  auto fd = [&](std::vector<double>& p) {
    std::vector<double> g(p.size());
    for (std::size_t i = 0; i < p.size(); ++i) {
      const double p0 = p[i];
      p[i] = p0 + eps;
      const double lp = loss();
      p[i] = p0 - eps;
      const double lm = loss();
      p[i] = p0;
      g[i] = gs * (lp - lm) / (2 * eps);  // the kernel returns grad_scale * dloss
    }
    return g;
  };
  CHECK(rel_max_error(r.dx, fd(x)) < 1e-6);
  CHECK(rel_max_error(r.dwlm, fd(wlm)) < 1e-6);
}

TEST_CASE("ignored positions give exactly zero dx rows and are not counted",
          "[kernels][cross_entropy]") {
  const std::int64_t B = 3, S = 6, H = 8, V = 13;
  auto x = random_vector(B * S * H, 31);
  auto wlm = random_vector(V * H, 32);
  auto dwlm0 = random_vector(V * H, 33);
  auto tok = random_tokens(B, S, V, 34, 3);
  auto r = run_ce<float>(x, wlm, tok, B, S, H, V, 4, 1.0, dwlm0);
  std::int64_t ignored = 0;
  for (std::int64_t n = 0; n < B * S; ++n) {
    const bool ign = tok[(n / S) * (S + 1) + n % S + 1] == ignore;
    ignored += ign;
    for (std::int64_t h = 0; h < H; ++h) {
      const float d = r.dx[n * H + h];
      if (ign) {
        CHECK(d == 0.0f);
      } else {
        CHECK(std::isfinite(d));  // every dx element written
      }
    }
  }
  REQUIRE(ignored > 0);
  CHECK(r.res.scored == B * S - ignored);

  // Changing x at ignored positions changes nothing.
  auto x2 = x;
  for (std::int64_t n = 0; n < B * S; ++n)
    if (tok[(n / S) * (S + 1) + n % S + 1] == ignore)
      for (std::int64_t h = 0; h < H; ++h) x2[n * H + h] = 100.0;
  auto r2 = run_ce<float>(x2, wlm, tok, B, S, H, V, 4, 1.0, dwlm0);
  CHECK(r2.res.loss_sum == r.res.loss_sum);
  CHECK(std::memcmp(r2.dwlm.data(), r.dwlm.data(), r.dwlm.size() * sizeof(float)) == 0);

  // Everything ignored: zero loss, zero count, dx zero, dwlm untouched.
  std::vector<std::int32_t> all_ignored(tok.size(), ignore);
  auto r3 = run_ce<float>(x, wlm, all_ignored, B, S, H, V, 4, 1.0, dwlm0);
  CHECK(r3.res.loss_sum == 0.0);
  CHECK(r3.res.scored == 0);
  for (float d : r3.dx) CHECK(d == 0.0f);
  CHECK(rel_max_error(r3.dwlm, widen(cast<float>(dwlm0))) == 0.0);
}

TEST_CASE("an out-of-vocabulary target throws naming the value, position and V before any write",
          "[kernels][cross_entropy]") {
  const std::int64_t B = 2, S = 6, H = 4, V = 37;
  auto x = cast<float>(random_vector(B * S * H, 41));
  auto wlm = cast<float>(random_vector(V * H, 42));
  for (std::int32_t bad : {5000, 37, -7}) {
    auto tok = random_tokens(B, S, V, 43);
    tok[1 * (S + 1) + 3 + 1] = bad;  // the target of position (b=1, t=3)
    std::vector<float> dx(x.size(), 123.0f), dwlm(wlm.size(), 456.0f);
    INFO("bad=" << bad);
    auto call = [&] {
      lm_head_cross_entropy<float, float>(x.data(), wlm.data(), tok.data(), B, S, H, V, 4,
                                          dx.data(), dwlm.data(), 1.0f);
    };
    CHECK_THROWS_AS(call(), tessera::config_error);
    CHECK_THROWS_WITH(call(), Catch::Contains("target token " + std::to_string(bad)) &&
                                  Catch::Contains("at row 9") && Catch::Contains("V=37"));
    for (float d : dx) CHECK(d == 123.0f);
    for (float d : dwlm) CHECK(d == 456.0f);
  }
  // A target equal to a custom ignore_index is skipped, not rejected.
  auto tok = random_tokens(B, S, V, 44);
  tok[2] = -1;
  std::vector<float> dx(x.size()), dwlm(wlm.size(), 0.0f);
  auto res = lm_head_cross_entropy<float, float>(x.data(), wlm.data(), tok.data(), B, S, H, V, 4,
                                                 dx.data(), dwlm.data(), 1.0f, -1);
  CHECK(res.scored == B * S - 1);
}

TEST_CASE("fused cross-entropy rejects bad arguments", "[kernels][cross_entropy]") {
  std::vector<float> buf(64, 1.0f);
  std::vector<std::int32_t> tok(16, 0);
  float* p = buf.data();
  using tessera::config_error;
  CHECK_THROWS_AS(
      (lm_head_cross_entropy<float, float>(p, p, tok.data(), 1, 3, 2, 4, 0, p, p, 1.0f)),
      config_error);
  CHECK_THROWS_AS(
      (lm_head_cross_entropy<float, float>(p, p, tok.data(), 1, 3, 2, 4, 2, p, nullptr, 1.0f)),
      config_error);
  CHECK_THROWS_AS((lm_head_cross_entropy<float, float>(p, p, tok.data(), 0, 3, 2, 4, 2, nullptr,
                                                       nullptr, 1.0f)),
                  config_error);
  CHECK_THROWS_AS(lm_head_logits<float>(tessera::kernels::host_context{}, p, p, p, 0, 4),
                  config_error);
}

TEST_CASE("fused cross-entropy scratch is chunk x V, independent of B*S",
          "[kernels][cross_entropy]") {
  const std::int64_t S = 32, H = 32, V = 1000, chunk = 16;
  std::vector<std::size_t> peaks_f, peaks_b;
  for (std::int64_t B : {2, 8, 32}) {  // B*S = 64, 256, 1024 rows
    INFO("B*S=" << B * S);
    auto x = random_vector(B * S * H, 51);
    auto wlm = random_vector(V * H, 52);
    auto tok = random_tokens(B, S, V, 53, 7);
    const std::vector<double> zero(static_cast<std::size_t>(V * H), 0.0);
    {
      tessera::host_memory_resource mr;
      run_ce<float>(x, wlm, tok, B, S, H, V, chunk, 1.0, zero, true, mr);
      const std::size_t peak = mr.stats().peak_allocated;
      // The logits block plus one double of loss per row.
      CHECK(peak <= chunk * V * sizeof(float) + chunk * sizeof(double));
      CHECK(mr.stats().allocated == 0);
      peaks_f.push_back(peak);
    }
    {
      tessera::host_memory_resource mr;
      run_ce<bf16>(x, wlm, tok, B, S, H, V, chunk, 1.0, zero, true, mr);
      const std::size_t peak = mr.stats().peak_allocated;
      // bf16 adds the x chunk and one wlm block converted to float (<= 1 MiB).
      CHECK(peak <= chunk * V * sizeof(float) + chunk * (H * sizeof(float) + sizeof(double)) +
                        tessera::kernels::ce_wlm_block_elems * sizeof(float));
      peaks_b.push_back(peak);
    }
    // No uncounted conversion workspace in the GEMM layer: every GEMM is float x float.
    CHECK(tessera::kernels::gemm_workspace_bytes() == 0);
  }
  for (std::size_t i = 1; i < peaks_f.size(); ++i) {
    CHECK(peaks_f[i] == peaks_f[0]);
    CHECK(peaks_b[i] == peaks_b[0]);
  }
}

TEST_CASE("fused cross-entropy with bf16 inputs agrees with float64 on the same rounded inputs",
          "[kernels][cross_entropy]") {
  const std::int64_t B = 2, S = 17, H = 64, V = 301;
  auto x = widen(cast<bf16>(random_vector(B * S * H, 61)));
  auto wlm = widen(cast<bf16>(random_vector(V * H, 62)));
  auto dwlm0 = widen(cast<float>(random_vector(V * H, 63)));
  auto tok = random_tokens(B, S, V, 64, 6);
  auto ref = unfused_cross_entropy(x, wlm, tok, B, S, H, V, 1.0, dwlm0);
  auto r = run_ce<bf16>(x, wlm, tok, B, S, H, V, 5, 1.0, dwlm0);
  CHECK(r.res.scored == ref.scored);
  // Inputs are exact in float; everything after runs in float (accum_t<bf16>)
  // and the gradients are float: float accumulation over H and V terms, 1e-5
  // relative (DESIGN.md, principle 6).
  CHECK(r.res.loss_sum == Approx(ref.loss_sum).epsilon(1e-5));
  CHECK(rel_max_error(r.dx, ref.dx) < 1e-5);
  CHECK(rel_max_error(r.dwlm, ref.dwlm) < 1e-5);
  // And float storage on the same values gives the same to float accuracy.
  auto rf = run_ce<float>(x, wlm, tok, B, S, H, V, 5, 1.0, dwlm0);
  CHECK(r.res.loss_sum == Approx(rf.res.loss_sum).epsilon(1e-5));
}

TEST_CASE("fused cross-entropy is bit-for-bit deterministic", "[kernels][cross_entropy]") {
  const std::int64_t B = 2, S = 33, H = 48, V = 257;
  auto x = random_vector(B * S * H, 71);
  auto wlm = random_vector(V * H, 72);
  auto dwlm0 = random_vector(V * H, 73);
  auto tok = random_tokens(B, S, V, 74, 9);
  auto a = run_ce<float>(x, wlm, tok, B, S, H, V, 7, 0.1, dwlm0);
  auto b = run_ce<float>(x, wlm, tok, B, S, H, V, 7, 0.1, dwlm0);
  CHECK(a.res.loss_sum == b.res.loss_sum);
  CHECK(std::memcmp(a.dx.data(), b.dx.data(), a.dx.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(a.dwlm.data(), b.dwlm.data(), a.dwlm.size() * sizeof(float)) == 0);
}

TEST_CASE("lm_head_logits of one row equals the float64 product", "[kernels][cross_entropy]") {
  const std::int64_t H = 40, V = 93;
  auto x = random_vector(H, 81);
  auto wlm = random_vector(V * H, 82);
  auto check = [&](auto tag, double tol) {
    using T = decltype(tag);
    auto xt = cast<T>(x), wt = cast<T>(wlm);
    auto xr = widen(xt), wr = widen(wt);  // the same rounded inputs in double
    std::vector<double> ref(static_cast<std::size_t>(V), 0.0);
    for (std::int64_t v = 0; v < V; ++v)
      for (std::int64_t h = 0; h < H; ++h) ref[v] += xr[h] * wr[v * H + h];
    std::vector<float> logits(static_cast<std::size_t>(V), std::numeric_limits<float>::quiet_NaN());
    lm_head_logits<T>(tessera::kernels::host_context{}, logits.data(), xt.data(), wt.data(), H, V);
    INFO(tessera::dtype_name<T>());
    CHECK(rel_max_error(logits, ref) < tol);
  };
  // Output is float: one rounding (2^-24 relative) after an H-term sum in
  // accum_t<T>; 1e-6 covers float accumulation, double only rounds at the store.
  check(double{}, 1e-7);
  check(float{}, 1e-6);
  check(bf16{}, 1e-6);
}

}  // namespace test_kernels_cross_entropy
