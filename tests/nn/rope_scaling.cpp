// Tests include/tessera/nn/rope_scaling.hpp: Llama 3.1's RoPE frequency
// scaling (rope_type "llama3") against an independent long double
// reimplementation of the published formula (Meta's apply_scaling, written
// here per frequency from its description), at the band edges (wavelength
// equal to L / high_freq_factor and L / low_freq_factor, and one ulp to
// either side), across the blended band, and over the whole frequency sets
// of Llama 3.1 8B and a Llama 3.2-shaped model; the unscaled frequencies
// bit for bit; and the refusals of bad parameters.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "tessera/kernels/detail/rope.hpp"
#include "tessera/nn/llama_config.hpp"
#include "tessera/nn/rope_scaling.hpp"

namespace test_nn_rope_scaling {

using namespace tessera;
using Catch::Contains;
using nn::llama3_rope_scaling;

namespace {

enum class band { kept, blended, divided };

// The published formula in long double: a wavelength 2 pi / f shorter
// than L / high_freq_factor keeps f, one longer than L / low_freq_factor
// gives f / factor, and one in between (edges included) blends the two
// with weight s = (L / wavelength - low) / (high - low) on f.
struct reference {
  long double value;
  band where;
};
reference published(long double f, const llama3_rope_scaling& s) {
  const long double pi = std::acos(-1.0L);
  const long double L = static_cast<long double>(s.original_max_position_embeddings);
  const long double lo = s.low_freq_factor, hi = s.high_freq_factor, k = s.factor;
  const long double wavelength = 2 * pi / f;
  if (wavelength < L / hi) return {f, band::kept};
  if (wavelength > L / lo) return {f / k, band::divided};
  const long double a = (L / wavelength - lo) / (hi - lo);
  return {a * f + (1 - a) * (f / k), band::blended};
}

// Tolerance of a double result against the long double reference, relative:
// each double operation rounds by 2^-53 ~ 1.1e-16; s's numerator
// L / wavelength - low cancels near the low edge, an absolute error of about
// 2^-53 * high / (high - low) in s that f' = f / factor + s f (1 - 1/factor)
// magnifies relative to f' by up to factor (32 here): ~6e-15; 1e-13 holds it.
constexpr double tol = 1e-13;

double rel(double got, long double want) {
  return static_cast<double>(std::fabs(static_cast<long double>(got) - want) / std::fabs(want));
}

// An inverse frequency whose double wavelength 2 pi / f is exactly `w`, if
// one lies within a few ulps of 2 pi / w.
std::optional<double> with_wavelength(double w) {
  constexpr double two_pi = 6.283185307179586;
  double f = two_pi / w;
  for (int k = 0; k < 8; ++k) f = std::nextafter(f, 0.0);
  for (int k = 0; k < 16; ++k, f = std::nextafter(f, 1.0))
    if (two_pi / f == w) return f;
  return std::nullopt;
}

}  // namespace

TEST_CASE("llama3 scaling at the band edges: wavelength equal to L/high and L/low", "[nn][rope]") {
  // Llama 3.1's parameters: w_hi = 8192 / 4 = 2048, w_lo = 8192 / 1 = 8192.
  const llama3_rope_scaling s{8.0, 1.0, 4.0, 8192};
  const auto f_hi = with_wavelength(2048.0), f_lo = with_wavelength(8192.0);
  REQUIRE(f_hi);
  REQUIRE(f_lo);
  // The edges belong to the blended band (transformers' and Meta's
  // comparisons are strict), where the weight on f is (8192/2048 - 1) / 3
  // = 1 exactly at the high edge: f' = f; and 0 at the low edge: f' =
  // f / factor: the bands meet without a step. (Which band a double
  // wavelength lands in is a double-arithmetic matter: the long double
  // reference's 2 pi differs, so it is held to values, not bands, here.)
  CHECK(nn::llama3_scaled_inv_freq(*f_hi, s) == *f_hi);
  CHECK(nn::llama3_scaled_inv_freq(*f_lo, s) == *f_lo / 8.0);
  // One ulp to either side: the band changes, the value does not jump.
  for (double f : {*f_hi, *f_lo}) {
    const double up = std::nextafter(f, 1.0), down = std::nextafter(f, 0.0);
    for (double g : {f, up, down}) {
      INFO("f=" << g);
      CHECK(rel(nn::llama3_scaled_inv_freq(g, s), published(g, s).value) < tol);
    }
    const double a = nn::llama3_scaled_inv_freq(up, s), b = nn::llama3_scaled_inv_freq(down, s);
    CHECK(std::fabs(a - b) / b < 1e-14);  // continuous: two ulps of f apart
  }
  // Past the edges: kept exactly above the high one, divided exactly
  // below the low one.
  CHECK(nn::llama3_scaled_inv_freq(std::nextafter(*f_hi, 1.0), s) == std::nextafter(*f_hi, 1.0));
  CHECK(nn::llama3_scaled_inv_freq(std::nextafter(*f_lo, 0.0), s) ==
        std::nextafter(*f_lo, 0.0) / 8.0);

  // Parameters whose edges are no powers of two, and other factors.
  for (const llama3_rope_scaling t :
       {llama3_rope_scaling{32.0, 1.0, 4.0, 64}, llama3_rope_scaling{16.0, 1.5, 3.25, 1000},
        llama3_rope_scaling{2.5, 0.5, 7.0, 4096}}) {
    for (double w : {static_cast<double>(t.original_max_position_embeddings) / t.high_freq_factor,
                     static_cast<double>(t.original_max_position_embeddings) / t.low_freq_factor}) {
      INFO(nn::to_string(t) << " wavelength " << w);
      const auto f = with_wavelength(w);
      if (!f) continue;  // no double inverse frequency gives this wavelength exactly
      for (double g : {*f, std::nextafter(*f, 1.0), std::nextafter(*f, 0.0)})
        CHECK(rel(nn::llama3_scaled_inv_freq(g, t), published(g, t).value) < tol);
    }
  }
}

TEST_CASE("llama3 scaling across the bands equals the published formula", "[nn][rope]") {
  for (const llama3_rope_scaling s :
       {llama3_rope_scaling{8.0, 1.0, 4.0, 8192}, llama3_rope_scaling{32.0, 1.0, 4.0, 8192},
        llama3_rope_scaling{32.0, 1.0, 4.0, 64}, llama3_rope_scaling{16.0, 1.5, 3.25, 1000}}) {
    INFO(nn::to_string(s));
    const double L = static_cast<double>(s.original_max_position_embeddings);
    const double w0 = L / s.high_freq_factor / 4, w1 = L / s.low_freq_factor * 4;
    int counts[3] = {0, 0, 0};
    double worst = 0;
    for (int k = 0; k <= 2000; ++k) {  // wavelengths log-spaced over [w_hi / 4, 4 w_lo]
      const double w = w0 * std::pow(w1 / w0, k / 2000.0);
      const double f = 6.283185307179586 / w;
      const reference r = published(f, s);
      ++counts[static_cast<int>(r.where)];
      worst = std::max(worst, rel(nn::llama3_scaled_inv_freq(f, s), r.value));
    }
    INFO("kept " << counts[0] << ", blended " << counts[1] << ", divided " << counts[2]);
    CHECK(worst < tol);
    CHECK(counts[0] > 100);
    CHECK(counts[1] > 100);
    CHECK(counts[2] > 100);
  }
}

TEST_CASE("rope_inv_freqs: Llama 3.1 8B's and a small Llama 3.2-shaped model's frequencies",
          "[nn][rope]") {
  // Llama 3.1 8B: hd 128, theta 5e5, factor 8. Wavelengths 2 pi 5e5^(i/64):
  // below 2048 for i <= 28, above 8192 for i >= 35, blended for 29..34.
  const nn::llama_config c = nn::llama_config::llama3_1_8b();
  REQUIRE(c.rope_scaling);
  const std::vector<double> f = c.rope_inv_freqs();
  REQUIRE(f.size() == 64);
  int counts[3] = {0, 0, 0};
  for (std::int64_t i = 0; i < 64; ++i) {
    const double base = kernels::detail::rope_inv_freq(i, 128, 500000.0);
    const reference r = published(base, *c.rope_scaling);
    ++counts[static_cast<int>(r.where)];
    INFO("i=" << i);
    CHECK(rel(f[static_cast<std::size_t>(i)], r.value) < tol);
    if (r.where == band::kept) CHECK(f[static_cast<std::size_t>(i)] == base);
    if (r.where == band::divided) CHECK(f[static_cast<std::size_t>(i)] == base / 8.0);
  }
  CHECK(counts[0] == 29);
  CHECK(counts[1] == 6);
  CHECK(counts[2] == 29);

  // tests/python/fixtures/llama3_rope_fp64: hd 16, theta 5e5, factor 32,
  // L 64: one frequency kept (wavelength 6.3), one blended (32.4), six
  // divided (167 and longer).
  const llama3_rope_scaling s{32.0, 1.0, 4.0, 64};
  const std::vector<double> g = nn::rope_inv_freqs(16, 500000.0, s);
  REQUIRE(g.size() == 8);
  CHECK(g[0] == 1.0);
  CHECK(published(kernels::detail::rope_inv_freq(1, 16, 500000.0), s).where == band::blended);
  for (std::int64_t i = 0; i < 8; ++i) {
    const double base = kernels::detail::rope_inv_freq(i, 16, 500000.0);
    CHECK(rel(g[static_cast<std::size_t>(i)], published(base, s).value) < tol);
    if (i >= 2) CHECK(g[static_cast<std::size_t>(i)] == base / 32.0);
  }
}

TEST_CASE("rope_inv_freqs without scaling is theta^(-2i/hd) bit for bit", "[nn][rope]") {
  for (double theta : {10000.0, 500000.0})
    for (std::int64_t hd : {std::int64_t{2}, std::int64_t{16}, std::int64_t{128}}) {
      const std::vector<double> f = nn::rope_inv_freqs(hd, theta, std::nullopt);
      REQUIRE(static_cast<std::int64_t>(f.size()) == hd / 2);
      for (std::int64_t i = 0; i < hd / 2; ++i)
        CHECK(f[static_cast<std::size_t>(i)] ==
              std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(hd)));
    }
  CHECK(nn::llama_config::llama3_8b().rope_inv_freqs() ==
        nn::rope_inv_freqs(128, 500000.0, std::nullopt));
}

TEST_CASE("llama3 scaling refuses bad parameters, naming the value", "[nn][rope][errors]") {
  auto refused = [](llama3_rope_scaling s, const char* what) {
    INFO(what);
    CHECK_THROWS_AS(s.validate(), config_error);
    CHECK_THROWS_WITH(s.validate(), Contains(what));
    CHECK_THROWS_WITH(nn::rope_inv_freqs(16, 1e4, s), Contains(what));
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  refused({0.5, 1.0, 4.0, 8192}, "rope scaling factor=0.5 must be finite and >= 1");
  refused({0.0, 1.0, 4.0, 8192}, "factor=0 must be");
  refused({nan, 1.0, 4.0, 8192}, "factor=nan must be");
  refused({inf, 1.0, 4.0, 8192}, "factor=inf must be");
  refused({8.0, 0.0, 4.0, 8192}, "low_freq_factor=0 must be finite and > 0");
  refused({8.0, -1.0, 4.0, 8192}, "low_freq_factor=-1 must be");
  refused({8.0, 4.0, 4.0, 8192}, "high_freq_factor=4 must be finite and > low_freq_factor=4");
  refused({8.0, 4.0, 1.0, 8192}, "high_freq_factor=1 must be finite and > low_freq_factor=4");
  refused({8.0, 1.0, 4.0, 0}, "original_max_position_embeddings=0 must be >= 1");
  CHECK_NOTHROW(llama3_rope_scaling{1.0, 1.0, 4.0, 1}.validate());  // factor 1: no change

  nn::llama_config c = nn::llama_config::tiny();
  c.rope_scaling = llama3_rope_scaling{0.5, 1.0, 4.0, 32};
  CHECK_THROWS_AS(c.validate(), config_error);
  CHECK_THROWS_WITH(c.validate(), Contains("factor=0.5") && Contains("(model 'tiny')"));
  CHECK(nn::to_string(std::nullopt) == "none");
  CHECK(nn::to_string(llama3_rope_scaling{}) ==
        "llama3(factor=8, low_freq_factor=1, high_freq_factor=4, "
        "original_max_position_embeddings=8192)");
}

TEST_CASE("presets: llama3_1_8b carries Llama 3.1's scaling, the others none", "[nn][rope]") {
  const nn::llama_config c = nn::llama_config::from_name("llama3_1_8b");
  CHECK(c.name == "llama3_1_8b");
  CHECK(c.max_seq == 131072);
  CHECK(c.rope_theta == 500000.0);
  REQUIRE(c.rope_scaling);
  CHECK(*c.rope_scaling == llama3_rope_scaling{8.0, 1.0, 4.0, 8192});
  CHECK_NOTHROW(c.validate());
  const nn::llama_config l3 = nn::llama_config::llama3_8b();
  CHECK((c.dim == l3.dim && c.n_layers == l3.n_layers && c.n_heads == l3.n_heads &&
         c.n_kv_heads == l3.n_kv_heads && c.ffn_dim == l3.ffn_dim && c.vocab == l3.vocab));
  for (const auto& n : nn::llama_config::preset_names())
    if (!n.starts_with("llama3_1") && !n.starts_with("llama3_2"))
      CHECK(!nn::llama_config::from_name(n).rope_scaling);
  CHECK_THROWS_WITH(nn::llama_config::from_name("llama3_2_2b"), Contains("llama3_2_3b"));
}

TEST_CASE("presets: Llama 3.2 1B and 3B as their config.json, tied, scaled by 32",
          "[nn][rope][tied]") {
  // meta-llama/Llama-3.2-1B and -3B: vocab 128256, F 8192, nkv 8, theta
  // 5e5, 131072 positions, rope_scaling llama3 factor 32, low/high 1 and
  // 4, original 8192, tie_word_embeddings true.
  for (const char* n : {"llama3_2_1b", "llama3_2_3b"}) {
    const nn::llama_config c = nn::llama_config::from_name(n);
    INFO(n);
    CHECK(c.name == n);
    CHECK(c.tie_word_embeddings);
    CHECK(c.vocab == 128256);
    CHECK(c.ffn_dim == 8192);
    CHECK(c.n_kv_heads == 8);
    CHECK(c.max_seq == 131072);
    CHECK(c.rope_theta == 500000.0);
    CHECK(c.norm_eps == 1e-5);
    REQUIRE(c.rope_scaling);
    CHECK(*c.rope_scaling == llama3_rope_scaling{32.0, 1.0, 4.0, 8192});
    CHECK_NOTHROW(c.validate());
  }
  const auto a = nn::llama_config::llama3_2_1b(), b = nn::llama_config::llama3_2_3b();
  CHECK((a.dim == 2048 && a.n_layers == 16 && a.n_heads == 32 && a.head_dim() == 64));
  CHECK((b.dim == 3072 && b.n_layers == 28 && b.n_heads == 24 && b.head_dim() == 128));
  // Published sizes: 1,235,814,400 and 3,212,749,824 parameters (the
  // embedding counted once).
  CHECK(a.num_params() == 1235814400);
  CHECK(b.num_params() == 3212749824);
}

}  // namespace test_nn_rope_scaling
