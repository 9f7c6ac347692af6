// Tests include/tessera/optim/lion.hpp (the optim::lion policy and
// lion_optimizer on the host context) against Lion as Algorithm 1 of Chen
// et al. 2023, "Symbolic Discovery of Optimization Algorithms", writes it,
// transcribed here in float64 from the paper (not from the library):
//
//   c_t = beta1 m_{t-1} + (1 - beta1) g_t
//   theta_t = theta_{t-1} - eta_t (sign(c_t) + lambda theta_{t-1})
//   m_t = beta2 m_{t-1} + (1 - beta2) g_t
//
// with sign(0) = 0 (torch.sign) and lambda = 0 where weight decay is
// excluded (norm gains, biases: the ranges' decay flag).
//
// It is also held to lion-pytorch's Lion (lucidrains, the implementation
// tessera's state names follow): ten float64 steps of lion_pytorch.Lion with
// weight decay and the norm gain in a param group of its own at 0, recorded
// with the gradients by tests/python/optimizer_reference.py in
// tests/python/fixtures/optimizers_fp64/trajectories.json
// (tests/support/optimizer_reference.hpp reads it): every parameter after
// every step, and the momentum after the last, to 1e-12 relative.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "tessera/kernels/context.hpp"
#include "tessera/kernels/optimizer.hpp"
#include "tessera/optim/lion.hpp"

#include "../support/optimizer_reference.hpp"

namespace test_optim_lion {

using namespace tessera;

namespace {

using ctx_t = kernels::host_context;
template <class Param, class Grad = Param, class Master = Param>
using lion_opt = optim::lion_optimizer<Param, Grad, Master, ctx_t>;

// Tolerances (STYLE.md, "Tests"):
// - float64 against the float64 transcription: the direction sign(c) is
//   exact on both sides (c is computed by the same two products and one
//   sum, and no c of these draws lies within rounding of 0), so a step
//   differs only in the rounding of theta - eta (sign + lambda theta): a
//   few ulps (2^-53 = 1.1e-16) of |theta| ~ 1 a step; ten steps stay far
//   below 1e-13 relative, the house float64 bound with a margin.
constexpr double f64_tol = 1e-13;
// - float32 master weights against the float64 transcription of the same
//   rounded inputs: 2^-24 = 6e-8 a rounding, a handful a step, ten steps:
//   below 1e-5 relative (the house float32 bound), the direction being the
//   same sign (checked separately: every element moved by about eta).
constexpr double f32_tol = 1e-5;

/// Lion for one element, transcribed from Algorithm 1 (file comment).
struct ref_lion {
  double theta;
  double m = 0;
  static double sign(double x) { return x > 0 ? 1.0 : (x < 0 ? -1.0 : 0.0); }
  void step(double g, double eta, double beta1, double beta2, double lambda) {
    const double c = beta1 * m + (1 - beta1) * g;
    theta = theta - eta * (sign(c) + lambda * theta);
    m = beta2 * m + (1 - beta2) * g;
  }
};

// Collects what save() writes.
struct byte_writer {
  std::vector<char> bytes;
  void write(const void* p, std::size_t n) {
    const char* c = static_cast<const char*>(p);
    bytes.insert(bytes.end(), c, c + n);
  }
};

template <class T>
bool same_bits(const T* a, const T* b, std::size_t n) {
  return std::memcmp(a, b, n * sizeof(T)) == 0;
}

// Bytes of one segment of the optimizer's segment table, counted by hand:
// {int64 begin, int64 end, int32 decay, int64 param_shift, int64
// grad_shift}, the decay padded to the 8-byte alignment.
constexpr std::size_t segment_bytes = 8 + 8 + 4 + 4 + 8 + 8;

// Parameters of magnitude [0.5, 1.5) and random sign, gradients in [-1, 1).
std::vector<double> random_params(std::size_t n, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> mag(0.5, 1.5);
  std::bernoulli_distribution neg(0.5);
  std::vector<double> v(n);
  for (double& x : v) x = neg(rng) ? -mag(rng) : mag(rng);
  return v;
}
std::vector<double> random_grads(std::size_t n, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> v(n);
  for (double& x : v) x = u(rng);
  return v;
}

/// Largest |got - want| / max(|want|, 1e-3).
template <class T>
double max_rel_error(const T* got, const std::vector<double>& want) {
  double worst = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double g = static_cast<double>(got[i]);
    if (std::isnan(g)) return INFINITY;
    worst = std::max(worst, std::abs(g - want[i]) / std::max(std::abs(want[i]), 1e-3));
  }
  return worst;
}

}  // namespace

TEST_CASE("optim::lion is an optimizer policy", "[optim][lion]") {
  STATIC_REQUIRE(optim::optimizer_policy<optim::lion>);
  STATIC_REQUIRE(std::is_same_v<optim::lion::state<bf16, float, float, ctx_t>,
                                optim::lion_optimizer<bf16, float, float, ctx_t>>);
  STATIC_REQUIRE(std::is_same_v<optim::lion::config, optim::lion_config>);
  STATIC_REQUIRE(lion_opt<bf16, float, float>::has_master);
  STATIC_REQUIRE(!lion_opt<double>::has_master);
  // The momentum (and master weights when kept), by hand: bf16 weights
  // keep 4 + 4 bytes of float32 state a parameter, half of AdamW's moments.
  STATIC_REQUIRE(lion_opt<bf16, float, float>::state_bytes_per_param == 8);
  STATIC_REQUIRE(lion_opt<float>::state_bytes_per_param == 4);
  STATIC_REQUIRE(lion_opt<double>::state_bytes_per_param == 8);
  CHECK(std::string(optim::lion::name) == "lion");
  const optim::lion_config dflt{};
  CHECK(dflt.beta1 == 0.9);  // the paper's defaults
  CHECK(dflt.beta2 == 0.99);
  CHECK(dflt.weight_decay == 0.0);
  const ctx_t ctx{};
  std::vector<optim::param_range> r{{0, 1, true}};
  lion_opt<float> opt({}, 1, r, ctx);
  CHECK(std::string(opt.state_buffers()[0].role) == "exp_avg");
}

TEST_CASE("Lion over ten steps equals Algorithm 1 in float64, decay excluded where flagged",
          "[optim][lion]") {
  const ctx_t ctx{};
  // [0, 24) decays (a matrix), [24, 28) is alignment padding in no range,
  // [28, 41) does not decay (a norm gain).
  const std::int64_t n = 41;
  const std::vector<optim::param_range> ranges{{0, 24, true}, {28, 41, false}};
  const auto in_range = [](std::size_t i) { return i < 24 || i >= 28; };
  const auto decays = [](std::size_t i) { return i < 24; };
  const double lrs[] = {1e-3, 2e-3, 3e-3, 3e-3, 2.5e-3, 2e-3, 1.5e-3, 1e-3, 5e-4, 1e-4};
  const double scales[] = {1.0, 0.5, 1.0, 0.8, 1.0, 1.0, 0.3, 1.0, 1.0, 0.9};
  const optim::lion_config cfgs[] = {{0.9, 0.99, 0.1}, {0.95, 0.98, 1.0}, {0.9, 0.99, 0.0}};
  std::uint64_t seed = 7101;
  for (const auto& cfg : cfgs) {
    INFO("beta1 " << cfg.beta1 << " beta2 " << cfg.beta2 << " weight_decay " << cfg.weight_decay);
    std::mt19937_64 rng(seed++);
    const std::vector<double> p0 = random_params(n, rng);
    std::vector<double> p = p0;
    std::vector<ref_lion> ref;
    for (double x : p0) ref.push_back({x});
    lion_opt<double> opt(cfg, n, ranges, ctx);
    for (int t = 0; t < 10; ++t) {
      INFO("after step " << t + 1);
      std::vector<double> g = random_grads(n, rng);
      // Exact zeros: at step 1 (m = 0) the direction is sign(0) = 0, and
      // only the decay moves the element; later the momentum decides.
      if (t == 0 || t == 4) g[3] = g[30] = 0.0;
      opt.step(p.data(), g.data(), lrs[t], scales[t]);
      for (std::size_t i = 0; i < ref.size(); ++i)
        if (in_range(i))
          ref[i].step(scales[t] * g[i], lrs[t], cfg.beta1, cfg.beta2,
                      decays(i) ? cfg.weight_decay : 0.0);
      std::vector<double> want_p, want_m, got_p, got_m;
      for (std::size_t i = 0; i < ref.size(); ++i)
        if (in_range(i)) {
          want_p.push_back(ref[i].theta);
          want_m.push_back(ref[i].m);
          got_p.push_back(p[i]);
          got_m.push_back(opt.exp_avg()[i]);
        }
      const double e_p = max_rel_error(got_p.data(), want_p);
      const double e_m = max_rel_error(got_m.data(), want_m);
      UNSCOPED_INFO("parameter error " << e_p << " momentum error " << e_m);
      CHECK(e_p < f64_tol);
      CHECK(e_m < f64_tol);
      if (t == 0) {
        // sign(0) = 0: element 3 decays only, element 30 (no decay) stays.
        CHECK(p[3] == Approx(p0[3] * (1 - lrs[0] * cfg.weight_decay)).epsilon(1e-15));
        CHECK(p[30] == p0[30]);
      }
    }
    // Elements in no range (padding) are never touched.
    for (std::size_t i = 24; i < 28; ++i) {
      CHECK(p[i] == p0[i]);
      CHECK(opt.exp_avg()[i] == 0.0);
    }
    CHECK(opt.steps_taken() == 10);
    CHECK(opt.master() == nullptr);
  }
}

TEST_CASE("Lion over ten steps equals lion-pytorch's float64 trajectory, norm gain undecayed",
          "[optim][lion]") {
  // tests/python/fixtures/optimizers_fp64: lion_pytorch.Lion (0.2.5) in
  // float64 on a 7 x 5 matrix, a norm gain of 6 and a 3 x 8 matrix, the
  // matrices in a param group with weight_decay 1, the gain in one with 0
  // (the ranges' decay flag here), lr changing each step, one exact zero
  // gradient per tensor at step 1 (sign(0) = 0 on both sides).
  // The arithmetic differs from tessera's in rounding only:
  // - lion-pytorch decays first, p *= 1 - lr lambda, then p -= lr sign(c);
  //   tessera computes p -= lr (sign(c) + lambda p). Equal in exact
  //   arithmetic (both decay the old p), rounded differently: 287 of the
  //   650 parameter values differ in their last bits.
  // - torch's add_(x, alpha=a) is one fused multiply-add, m beta rounded
  //   then fma(a, g, m beta), where tessera rounds (1 - beta) g first.
  // The direction sign(c) is the same on both sides: no nonzero c of these
  // draws is within 2.6% of its terms' size of 0 (checked by the
  // generator), far from rounding.
  // Tolerance: the house float64 1e-12 relative, element by element; each
  // step adds an ulp or two (2^-53 = 1.1e-16) of |p| or |m| on either side:
  // worst measured 7.6e-16 (the parameters) and 1.7e-15 (the momentum).
  constexpr double ref_tol = 1e-12;
  const ctx_t ctx{};
  const testing::optimizer_reference fx;
  const auto& run = fx.run("lion");
  const auto& c = run.at("config");
  const optim::lion_config cfg{c.at("beta1").get<double>(), c.at("beta2").get<double>(),
                               c.at("weight_decay").get<double>()};
  REQUIRE(cfg.weight_decay > 0);
  const auto lrs = run.at("lr").get<std::vector<double>>();
  REQUIRE(static_cast<int>(lrs.size()) == fx.steps());
  lion_opt<double> opt(cfg, fx.n, fx.ranges, ctx);
  std::vector<double> p = fx.params0();
  double worst = 0;
  for (int t = 0; t < fx.steps(); ++t) {
    INFO("after step " << t + 1);
    const std::vector<double> g = fx.grads(t);  // NaN in the padding
    opt.step(p.data(), g.data(), lrs[static_cast<std::size_t>(t)]);
    const auto& want = run.at("params").at(t);
    for (std::size_t k = 0; k < fx.tensors.size(); ++k) {
      const auto& x = fx.tensors[k];
      INFO("tensor " << x.name);
      const double e =
          testing::reference_rel_error(p.data() + x.begin, want.at(k).get<std::vector<double>>());
      worst = std::max(worst, e);
      CHECK(e < ref_tol);
      for (std::int64_t i = x.end(); i < x.end() + fx.gap; ++i)
        CHECK(p[static_cast<std::size_t>(i)] == fx.padding_value);
    }
  }
  const auto& m = run.at("exp_avg_final");
  for (std::size_t k = 0; k < fx.tensors.size(); ++k) {
    const auto& x = fx.tensors[k];
    INFO("momentum of " << x.name << " after the last step");
    const double e =
        testing::reference_rel_error(opt.exp_avg() + x.begin, m.at(k).get<std::vector<double>>());
    worst = std::max(worst, e);
    CHECK(e < ref_tol);
  }
  UNSCOPED_INFO("Lion against lion-pytorch: worst relative error " << worst);
  CHECK(worst < ref_tol);
}

TEST_CASE("Lion moves every element by lr a step, and decays only the flagged ranges",
          "[optim][lion]") {
  // One step from m = 0: c = (1 - beta1) g, so each element moves by
  // exactly lr (sign(g) + lambda p): the update has the same size whatever
  // the gradient's magnitude.
  const ctx_t ctx{};
  const std::vector<optim::param_range> ranges{{0, 2, true}, {2, 4, false}};
  lion_opt<double> opt({0.9, 0.99, 0.5}, 4, ranges, ctx);
  std::vector<double> p{1.0, -2.0, 1.0, -2.0}, g{1e-6, -300.0, 1e-6, 300.0};
  opt.step(p.data(), g.data(), 0.1);
  CHECK(p[0] == 1.0 - 0.1 * (1.0 + 0.5 * 1.0));
  CHECK(p[1] == -2.0 - 0.1 * (-1.0 + 0.5 * -2.0));
  CHECK(p[2] == 1.0 - 0.1 * 1.0);
  CHECK(p[3] == -2.0 - 0.1 * 1.0);
  // Weight decay 0 makes every segment non-decaying.
  lion_opt<double> none({0.9, 0.99, 0.0}, 4, ranges, ctx);
  std::vector<double> q{1.0, -2.0, 1.0, -2.0};
  none.step(q.data(), g.data(), 0.1);
  CHECK(q == std::vector<double>{0.9, -1.9, 0.9, -2.1});
}

TEST_CASE("Lion with float32 master weights rounds bf16 parameters from the master",
          "[optim][lion]") {
  const ctx_t ctx{};
  std::mt19937_64 rng(7201);
  const std::int64_t n = 64;
  const std::vector<optim::param_range> ranges{{0, 40, true}, {40, 64, false}};
  const optim::lion_config cfg{0.9, 0.99, 0.1};
  std::vector<bf16> p(n);
  std::vector<ref_lion> ref;
  for (double x : random_params(n, rng)) {
    p[ref.size()] = bf16(static_cast<float>(x));
    ref.push_back({static_cast<double>(static_cast<float>(p[ref.size()]))});  // exact
  }
  const std::vector<bf16> p0 = p;
  lion_opt<bf16, float, float> opt(cfg, n, ranges, ctx);
  CHECK(opt.state_bytes() == 2 * n * sizeof(float) + 2 * segment_bytes);
  CHECK(opt.serialized_bytes() == sizeof(std::int64_t) + 2 * n * sizeof(float));
  opt.init_master(p.data());
  // lr 1e-3: each update is below bf16's resolution (2^-8 .. 2^-7 relative)
  // for most elements, so only the master weights carry it until it adds up.
  for (int t = 0; t < 10; ++t) {
    INFO("step " << t + 1);
    std::vector<float> g(n);
    const std::vector<double> gd = random_grads(n, rng);
    for (std::int64_t i = 0; i < n; ++i) g[i] = static_cast<float>(gd[i]);
    opt.step(p.data(), g.data(), 1e-3);
    for (std::int64_t i = 0; i < n; ++i)
      ref[i].step(g[i], static_cast<double>(static_cast<float>(1e-3)),
                  static_cast<double>(static_cast<float>(cfg.beta1)),
                  static_cast<double>(static_cast<float>(cfg.beta2)),
                  i < 40 ? static_cast<double>(static_cast<float>(cfg.weight_decay)) : 0.0);
    for (std::int64_t i = 0; i < n; ++i) {
      INFO("element " << i);
      REQUIRE(p[i].bits == bf16(opt.master()[i]).bits);
    }
    std::vector<double> want(n), want_m(n);
    for (std::int64_t i = 0; i < n; ++i) {
      want[i] = ref[i].theta;
      want_m[i] = ref[i].m;
    }
    const double e = max_rel_error(opt.master(), want);
    const double e_m = max_rel_error(opt.exp_avg(), want_m);
    UNSCOPED_INFO("master error " << e << " momentum error " << e_m);
    CHECK(e < f32_tol);
    CHECK(e_m < f32_tol);
  }
  // Some bf16 copies moved, some not: the sub-ulp updates live in the
  // master. (A master weight may be back where it began: the steps are +-lr.)
  int moved = 0, kept = 0;
  for (std::int64_t i = 0; i < n; ++i) (p[i].bits != p0[i].bits ? moved : kept)++;
  CHECK(moved > 0);
  CHECK(kept > 0);
}

TEST_CASE("Lion takes the clip coefficient through the pointer and skips a non-finite one",
          "[optim][lion]") {
  const ctx_t ctx{};
  std::mt19937_64 rng(7301);
  const std::int64_t n = 33;
  const std::vector<optim::param_range> ranges{{0, 20, true}, {20, 33, false}};
  const optim::lion_config cfg{0.9, 0.99, 0.1};
  const std::vector<double> p0 = random_params(n, rng);
  std::vector<double> pa = p0, pb = p0;
  lion_opt<double> a(cfg, n, ranges, ctx), b(cfg, n, ranges, ctx);
  for (int t = 0; t < 3; ++t) {
    const std::vector<double> g = random_grads(n, rng);
    double coef = 0.37;
    a.step(pa.data(), g.data(), 0.05, &coef);  // the coefficient in the context's memory
    b.step(pb.data(), g.data(), 0.05, coef);   // the same value given on the host
    CHECK(same_bits(pa.data(), pb.data(), pa.size()));
    CHECK(same_bits(a.exp_avg(), b.exp_avg(), static_cast<std::size_t>(n)));
  }
  const std::vector<double> g = random_grads(n, rng);
  for (double bad :
       {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    INFO("coefficient " << bad);
    const std::vector<double> before = pa;
    const std::vector<double> m_before(a.exp_avg(), a.exp_avg() + n);
    a.step(pa.data(), g.data(), 0.05, &bad);
    CHECK(same_bits(pa.data(), before.data(), pa.size()));
    CHECK(same_bits(a.exp_avg(), m_before.data(), m_before.size()));
    a.skipped();
    a.step(pa.data(), g.data(), 0.05, bad);  // a non-finite host scale: not counted
  }
  CHECK(a.steps_taken() == 3);
}

TEST_CASE("Lion save and load restore the trajectory bit for bit", "[optim][lion]") {
  const ctx_t ctx{};
  std::mt19937_64 rng(7501);
  const std::int64_t n = 50;
  const std::vector<optim::param_range> ranges{{0, 30, true}, {30, 50, false}};
  const optim::lion_config cfg{0.9, 0.99, 0.1};
  std::vector<bf16> p(n);
  std::vector<float> g(n);
  const auto pd = random_params(n, rng), gd = random_grads(n, rng);
  for (std::int64_t i = 0; i < n; ++i) {
    p[i] = bf16(static_cast<float>(pd[i]));
    g[i] = static_cast<float>(gd[i]);
  }
  lion_opt<bf16, float, float> a(cfg, n, ranges, ctx), b(cfg, n, ranges, ctx);
  a.init_master(p.data());
  a.step(p.data(), g.data(), 1e-2);
  a.step(p.data(), g.data(), 2e-2);
  byte_writer w;
  a.save(w);
  REQUIRE(w.bytes.size() == a.serialized_bytes());
  b.load(w.bytes.data());
  CHECK(b.steps_taken() == 2);
  std::vector<bf16> pb = p;
  for (std::int64_t i = 0; i < n; ++i) g[i] = static_cast<float>(gd[(i * 7) % n]);
  a.step(p.data(), g.data(), 3e-2);
  b.step(pb.data(), g.data(), 3e-2);
  CHECK(same_bits(p.data(), pb.data(), p.size()));
  CHECK(same_bits(a.master(), b.master(), static_cast<std::size_t>(n)));
  CHECK(same_bits(a.exp_avg(), b.exp_avg(), static_cast<std::size_t>(n)));
}

TEST_CASE("Lion rejects bad hyper-parameters naming them", "[optim][lion][errors]") {
  const ctx_t ctx{};
  const std::vector<optim::param_range> r{{0, 1, true}};
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  struct bad_case {
    optim::lion_config cfg;
    const char* names;
  };
  const bad_case cases[] = {
      {{1.5, 0.99, 0.0}, "beta1=1.5"},        {{-0.1, 0.99, 0.0}, "beta1=-0.1"},
      {{nan, 0.99, 0.0}, "beta1=nan"},        {{0.9, 1.0, 0.0}, "beta2=1"},
      {{0.9, -0.5, 0.0}, "beta2=-0.5"},       {{0.9, 0.99, -0.1}, "weight_decay=-0.1"},
      {{0.9, 0.99, nan}, "weight_decay=nan"}, {{0.9, 0.99, inf}, "weight_decay=inf"},
  };
  for (const auto& c : cases) {
    INFO(c.names);
    CHECK_THROWS_AS(c.cfg.validate(), config_error);
    CHECK_THROWS_WITH(c.cfg.validate(), Catch::Contains(c.names));
    CHECK_THROWS_WITH((lion_opt<float>(c.cfg, 1, r, ctx)), Catch::Contains(c.names));
  }
  CHECK_NOTHROW(optim::lion_config({1.0, 0.0, 0.0}).validate());  // c = m, m = g
  // bf16 parameters without init_master: refused, nothing written.
  lion_opt<bf16, float, float> opt({}, 1, r, ctx);
  std::vector<bf16> p{bf16(0.5f)};
  std::vector<float> g{0.25f};
  CHECK_THROWS_WITH(opt.step(p.data(), g.data(), 1e-3), Catch::Contains("init_master"));
  CHECK(opt.steps_taken() == 0);
}

}  // namespace test_optim_lion
