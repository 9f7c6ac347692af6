// Tests include/tessera/nn/llama.hpp: the whole model's gradient against
// central finite differences in float64, gradient accumulation across
// micro-batches with different numbers of scored tokens, the RoPE tables of
// a bf16 model, record-byte accounting, and bad input.
#include <catch2/catch.hpp>

#include <cmath>
#include <tuple>
#include <type_traits>
#include <vector>

#include <omp.h>

#include "tessera/core/memory.hpp"
#include "tessera/core/random.hpp"
#include "tessera/kernels/blas.hpp"
#include "tessera/kernels/context.hpp"
#include "tessera/nn/llama.hpp"

namespace test_nn_llama {

using namespace tessera;

namespace {

nn::llama_config tiny_cfg(std::int64_t nkv = 2) {
  auto c = nn::llama_config::tiny();
  c.n_kv_heads = nkv;
  return c;
}

std::vector<std::int32_t> random_tokens(std::int64_t B, std::int64_t T, std::int64_t V,
                                        std::uint64_t seed) {
  rng r(seed);
  std::vector<std::int32_t> t(static_cast<std::size_t>(B * (T + 1)));
  for (auto& x : t) x = static_cast<std::int32_t>(r.next_u64() % static_cast<std::uint64_t>(V));
  return t;
}

// Mean loss over scored tokens, the function whose gradient the model computes
// when grad_scale = 1 / scored.
double mean_loss(nn::llama<precision::fp64>& m, const std::vector<std::int32_t>& tok,
                 std::int64_t B, std::int64_t T) {
  auto r = m.forward_loss(tok.data(), B, T);
  return r.sum / static_cast<double>(r.scored);
}

}  // namespace

TEST_CASE("llama gradient equals central finite differences (float64)", "[nn][fd]") {
  // GQA (nkv=2 < nh=4) and plain MHA; odd T not a multiple of the attention tiles (4, 3).
  std::int64_t nkv, T;
  std::tie(nkv, T) =
      GENERATE(table<std::int64_t, std::int64_t>({{2, 7}, {1, 13}, {4, 9}, {2, 13}}));
  // Tiny shapes: one thread avoids fork/join overhead dominating ~30k forwards.
  struct one_thread {
    int omp = omp_get_max_threads(), blas = openblas_get_num_threads();
    one_thread() {
      omp_set_num_threads(1);
      openblas_set_num_threads(1);
    }
    ~one_thread() {
      omp_set_num_threads(omp);
      openblas_set_num_threads(blas);
    }
  } guard;
  const std::int64_t B = 2;
  nn::llama_options opt;
  opt.ce_chunk = 5;
  // Attention tiles are a kernel tuning value of the context (Bq = 4, Bk = 3).
  const kernels::host_context ctx{&host::default_resource(), 0, {4, 3}};
  nn::llama<precision::fp64> m(tiny_cfg(nkv), opt, ctx);
  m.init_weights(42);
  // Perturb the norm gains away from 1 so their gradients are generic.
  {
    rng r(7);
    for (const auto& e : m.layout().entries())
      if (e.shp.rank == 1)
        for (std::int64_t i = 0; i < e.numel; ++i)
          m.params()[e.offset + i] = 1.0 + 0.2 * r.normal();
    // Larger weights than the init so the attention is far from uniform.
    for (std::int64_t i = 0; i < m.layout().total(); ++i) m.params()[i] *= 3.0;
  }
  auto tok = random_tokens(B, T, m.config().vocab, 99 + T);
  tok[3] = -100;  // one ignored target
  m.zero_grad();
  auto r = m.forward_backward(tok.data(), B, T, 1.0 / 1.0);
  const double scale = 1.0 / static_cast<double>(r.scored);
  CHECK(r.scored == B * T - 1);
  std::vector<double> analytic(m.grads(), m.grads() + m.layout().total());
  for (auto& g : analytic) g *= scale;  // gradient of the mean

  // Fourth-order central differences on every parameter,
  // (8(L(p+h) - L(p-h)) - (L(p+2h) - L(p-2h))) / 12h: truncation ~h^4 f^(5)
  // ~1e-16 and rounding ~1e-16 |L| / h ~ 4e-12 with h = 1e-4 in float64.
  const double h = 1e-4;
  double num_sq = 0, diff_sq = 0;
  // Every parameter in the first case; in the others every norm gain and a
  // fixed sample of 1 in 7 elements of each matrix (the same code paths).
  const std::int64_t stride = (nkv == 2 && T == 7) ? 1 : 7;
  std::int64_t checked = 0, expected = 0;
  for (const auto& e : m.layout().entries()) {
    const std::int64_t st = e.shp.rank == 1 ? 1 : stride;
    expected += (e.numel + st - 1) / st;
    for (std::int64_t i = 0; i < e.numel; i += st) {
      double& p = m.params()[e.offset + i];
      const double p0 = p;
      auto at = [&](double x) {
        p = x;
        return mean_loss(m, tok, B, T);
      };
      const double num =
          (8 * (at(p0 + h) - at(p0 - h)) - (at(p0 + 2 * h) - at(p0 - 2 * h))) / (12 * h);
      p = p0;
      const double a = analytic[static_cast<std::size_t>(e.offset + i)];
      num_sq += num * num;
      diff_sq += (a - num) * (a - num);
      INFO(e.name << "[" << i << "] analytic " << a << " numeric " << num);
      // per element: relative 1e-6, with an absolute floor at the FD noise level
      REQUIRE(std::abs(a - num) <= 1e-6 * std::abs(num) + 1e-10);
      ++checked;
    }
  }
  CHECK(checked == expected);
  // and over the whole gradient vector, relative error below 1e-6
  CHECK(std::sqrt(diff_sq / num_sq) < 1e-6);
}

TEST_CASE("accumulating micro-batches with different scored counts equals the single batch",
          "[nn][accumulation]") {
  const std::int64_t B = 4, T = 9;
  nn::llama<precision::fp64> big(tiny_cfg()), small(tiny_cfg());
  big.init_weights(3);
  small.init_weights(3);
  auto tok = random_tokens(B, T, big.config().vocab, 5);
  // micro-batch 0 (rows 0,1) keeps all targets; micro-batch 1 (rows 2,3) ignores 6 of them
  for (int t : {1, 2, 5}) tok[2 * (T + 1) + t] = -100;
  for (int t : {4, 8, 9}) tok[3 * (T + 1) + t] = -100;
  const std::int64_t scored = B * T - 6;
  big.zero_grad();
  auto rb = big.forward_backward(tok.data(), B, T, 1.0 / scored);
  small.zero_grad();
  auto r0 = small.forward_backward(tok.data(), 2, T, 1.0 / scored);
  auto r1 = small.forward_backward(tok.data() + 2 * (T + 1), 2, T, 1.0 / scored);
  CHECK(rb.scored == scored);
  CHECK(r0.scored == 2 * T);
  CHECK(r1.scored == 2 * T - 6);
  // The step's loss: the sum over every scored token divided by their count,
  // not the mean of the micro-batch means.
  CHECK((r0.sum + r1.sum) / scored == Approx(rb.sum / scored).epsilon(1e-13));
  double max_rel = 0;
  for (std::int64_t i = 0; i < big.layout().total(); ++i) {
    const double a = big.grads()[i], b = small.grads()[i];
    if (a != 0 || b != 0)
      max_rel = std::max(max_rel, std::abs(a - b) / std::max(std::abs(a), 1e-300));
  }
  CHECK(max_rel < 1e-12);  // float64: only summation order differs
}

TEST_CASE("RoPE tables of a bf16 model are float32 and accurate at position 8191", "[nn][rope]") {
  for (double theta : {10000.0, 500000.0}) {
    auto c = tiny_cfg();
    c.max_seq = 8192;
    c.rope_theta = theta;
    nn::llama<precision::bf16_mixed> m(c);
    m.init_weights(1);
    const std::int64_t hd = c.head_dim(), half = hd / 2;
    double worst = 0;
    for (std::int64_t i = 0; i < half; ++i) {
      const long double ang = 8191.0L * std::pow((long double)theta, -2.0L * i / hd);
      worst = std::max(worst, (double)std::abs(m.rope_cos()[8191 * half + i] - std::cos(ang)));
      worst = std::max(worst, (double)std::abs(m.rope_sin()[8191 * half + i] - std::sin(ang)));
    }
    INFO("theta " << theta << " worst error " << worst);
    // The requirement is 5e-4 (what float32 angles would give at t=8191:
    // 8191 * 2^-24 ~ 4.9e-4). Angles in double and one float32 rounding of
    // cos/sin give ~3e-8, so hold the tables to 1e-6.
    CHECK(worst < 1e-6);
  }
}

TEST_CASE("RoPE tables of an fp64 model are float64 (precision::fp64::rope_type)", "[nn][rope]") {
  auto c = tiny_cfg();
  c.max_seq = 8192;
  nn::llama<precision::fp64> m(c);
  static_assert(std::is_same_v<decltype(m.rope_cos()), const double*>);
  const std::int64_t hd = c.head_dim(), half = hd / 2;
  double worst = 0;
  for (std::int64_t t : {std::int64_t{1}, std::int64_t{63}, std::int64_t{8191}})
    for (std::int64_t i = 0; i < half; ++i) {
      const long double ang = t * std::pow((long double)c.rope_theta, -2.0L * i / hd);
      worst = std::max(worst, (double)std::abs(m.rope_cos()[t * half + i] - std::cos(ang)));
      worst = std::max(worst, (double)std::abs(m.rope_sin()[t * half + i] - std::sin(ang)));
    }
  INFO("worst error " << worst);
  // Angles and cos/sin in double: the angle's rounding (8191 * 2^-53 ~ 1e-12
  // at t = 8191) dominates; float32 tables would be off by up to 3e-8.
  CHECK(worst < 1e-11);
}

TEST_CASE("RoPE tables of a llama3-scaled model hold the scaled frequencies", "[nn][rope]") {
  // hd 16 (dim 64 over 4 heads), theta 5e5, factor 32, original context 64:
  // f_0 kept, f_1 blended, f_2.. divided by 32 (tests/nn/rope_scaling.cpp).
  auto c = tiny_cfg();
  c.dim = 64;
  c.max_seq = 256;
  c.rope_theta = 500000.0;
  c.rope_scaling = nn::llama3_rope_scaling{32.0, 1.0, 4.0, 64};
  const std::vector<double> f = c.rope_inv_freqs();
  const std::int64_t hd = c.head_dim(), half = hd / 2;
  REQUIRE(hd == 16);
  CHECK(f[0] == 1.0);
  CHECK(f[5] == std::pow(500000.0, -10.0 / 16) / 32);
  nn::llama<precision::fp64> m64(c);
  nn::llama<precision::bf16_mixed> m16(c);
  double worst64 = 0, worst32 = 0;
  for (std::int64_t t :
       {std::int64_t{1}, std::int64_t{63}, std::int64_t{64}, std::int64_t{200}, std::int64_t{255}})
    for (std::int64_t i = 0; i < half; ++i) {
      const long double ang = static_cast<long double>(t) * f[static_cast<std::size_t>(i)];
      const std::int64_t k = t * half + i;
      worst64 = std::max(worst64, (double)std::fabs(m64.rope_cos()[k] - std::cos(ang)));
      worst64 = std::max(worst64, (double)std::fabs(m64.rope_sin()[k] - std::sin(ang)));
      worst32 = std::max(worst32, (double)std::fabs(m16.rope_cos()[k] - std::cos(ang)));
      worst32 = std::max(worst32, (double)std::fabs(m16.rope_sin()[k] - std::sin(ang)));
    }
  INFO("worst error: float64 tables " << worst64 << ", float32 tables " << worst32);
  CHECK(worst64 < 1e-13);  // cos/sin of a double angle below 256 rad: a few ulps
  CHECK(worst32 < 1e-7);   // one rounding to float32: 2^-25 ~ 3e-8
  // The unscaled model's tables differ past position 0 (f_2 is 32x faster).
  auto plain = c;
  plain.rope_scaling.reset();
  nn::llama<precision::fp64> p64(plain);
  CHECK(std::fabs(p64.rope_cos()[200 * half + 2] - m64.rope_cos()[200 * half + 2]) > 0.1);
  CHECK(p64.rope_cos()[200 * half + 0] == m64.rope_cos()[200 * half + 0]);  // f_0 is kept
}

TEST_CASE("forward frees what backward consumed; record bytes follow the formula", "[nn][memory]") {
  host_memory_resource mr;
  const kernels::host_context ctx{&mr};
  nn::llama<precision::fp32> m(tiny_cfg(), {}, ctx);
  m.init_weights(1);
  const std::size_t persistent = mr.stats().allocated;
  auto tok = random_tokens(2, 16, m.config().vocab, 1);
  m.forward_backward(tok.data(), 2, 16, 1.0f / 32);
  CHECK(mr.stats().allocated == persistent);  // every activation record freed
  CHECK(mr.stats().peak_allocated > persistent + static_cast<std::size_t>(m.record_bytes(2, 16)));
}

TEST_CASE("llama rejects bad shapes and tokens with the numbers", "[nn][errors]") {
  nn::llama<precision::fp32> m(tiny_cfg());
  m.init_weights(1);
  auto tok = random_tokens(1, 8, 32, 2);
  CHECK_THROWS_WITH(m.forward_loss(tok.data(), 1, 100), Catch::Contains("max_seq=64"));
  CHECK_THROWS_WITH(m.forward_loss(tok.data(), 0, 8), Catch::Contains("B=0"));
  tok[2] = 40;
  CHECK_THROWS_AS(m.forward_loss(tok.data(), 1, 8), config_error);
  auto bad = nn::llama_config::tiny();
  bad.n_heads = 3;
  CHECK_THROWS_WITH(nn::llama<precision::fp32>(bad),
                    Catch::Contains("n_heads=3 does not divide dim=16"));
  bad = nn::llama_config::tiny();
  bad.n_kv_heads = 3;
  CHECK_THROWS_WITH(nn::llama<precision::fp32>(bad),
                    Catch::Contains("n_kv_heads=3 does not divide n_heads=4"));
}

}  // namespace test_nn_llama
