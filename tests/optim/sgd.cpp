// Tests include/tessera/optim/sgd.hpp (the optim::sgd policy and
// sgd_optimizer on the host context) against torch.optim.SGD's update
// (dampening 0, with and without Nesterov, weight decay per parameter
// group) written out by hand in long double.
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
#include "tessera/optim/sgd.hpp"

namespace test_optim_sgd {

using namespace tessera;

namespace {

using ctx_t = kernels::host_context;
template <class Param, class Grad = Param, class Master = Param>
using sgd_opt = optim::sgd_optimizer<Param, Grad, Master, ctx_t>;

// Tolerances (STYLE.md, "Tests"), as max_rel_error below measures them:
// - float64: one SGD step is at most five float64 operations per element
//   (scale, decay, momentum, Nesterov, update), each rounding by 2^-53 =
//   1.1e-16 relative to terms no larger than a few times the result's
//   typical size; five steps stay below about 1e-14. 1e-13 leaves a margin
//   of ten.
constexpr double f64_tol = 1e-13;
// - float32 master weights: the same operations in float32, 2^-24 = 6e-8 a
//   rounding, five steps: below about 2e-6. The house float32 tolerance,
//   1e-5 relative.
constexpr double f32_tol = 1e-5;

// torch.optim.SGD (_single_tensor_sgd) for one element, dampening 0, written
// from PyTorch's formula: d = g (+ wd p); the momentum buffer is created as d
// on the first step, buf = mu buf + d afterwards; d = nesterov ? d + mu buf :
// buf; p -= lr d. With mu = 0 there is no buffer. `wd` is the element's
// parameter group's weight decay (0 for norms and 1-D tensors).
struct ref_sgd {
  long double p;
  long double buf = 0;
  bool has_buf = false;
  void step(long double g, long double lr, long double mu, long double wd, bool nesterov) {
    long double d = g;
    if (wd != 0) d = d + wd * p;
    if (mu != 0) {
      if (!has_buf) {
        buf = d;
        has_buf = true;
      } else {
        buf = mu * buf + d;
      }
      d = nesterov ? d + mu * buf : buf;
    }
    p = p - lr * d;
  }
};

/// Largest |got - want| / max(|want|, rms(want)) over the elements whose
/// index passes `keep`: relative, except that an element far below the
/// typical size (a parameter or momentum crossing zero) is measured against
/// that size. NaN gives +inf.
template <class T, class Keep>
double max_rel_error(const T* got, const std::vector<long double>& want, Keep keep) {
  long double ss = 0;
  std::size_t count = 0;
  for (std::size_t i = 0; i < want.size(); ++i)
    if (keep(i)) {
      ss += want[i] * want[i];
      ++count;
    }
  const long double rms = std::sqrt(ss / static_cast<long double>(std::max<std::size_t>(1, count)));
  double worst = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (!keep(i)) continue;
    const long double g = static_cast<long double>(static_cast<double>(got[i]));
    if (std::isnan(g)) return INFINITY;
    worst = std::max(worst,
                     static_cast<double>(std::abs(g - want[i]) / std::max(std::abs(want[i]), rms)));
  }
  return worst;
}

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

}  // namespace

TEST_CASE("optim::sgd is an optimizer policy", "[optim][sgd]") {
  STATIC_REQUIRE(optim::optimizer_policy<optim::sgd>);
  STATIC_REQUIRE(std::is_same_v<optim::sgd::state<bf16, float, float, ctx_t>,
                                optim::sgd_optimizer<bf16, float, float, ctx_t>>);
  STATIC_REQUIRE(std::is_same_v<optim::sgd::config, optim::sgd_config>);
  STATIC_REQUIRE(sgd_opt<bf16, float, float>::has_master);
  STATIC_REQUIRE(!sgd_opt<double>::has_master);
  // The momentum buffer (and master weights when kept), by hand.
  STATIC_REQUIRE(sgd_opt<bf16, float, float>::state_bytes_per_param == 8);
  STATIC_REQUIRE(sgd_opt<double>::state_bytes_per_param == 8);
  STATIC_REQUIRE(sgd_opt<float>::state_bytes_per_param == 4);
  CHECK(std::string(optim::sgd::name) == "sgd");
  const optim::sgd_config dflt{};
  CHECK(dflt.momentum == 0.9);
  CHECK(!dflt.nesterov);
  CHECK(dflt.weight_decay == 0.0);
}

TEST_CASE("SGD steps equal the hand-computed PyTorch formula in float64", "[optim][sgd]") {
  const ctx_t ctx{};
  // [0, 24) decays, [24, 28) is alignment padding in no range, [28, 41) does not decay.
  const std::int64_t n = 41;
  const std::vector<optim::param_range> ranges{{0, 24, true}, {28, 41, false}};
  const auto in_range = [](std::size_t i) { return i < 24 || i >= 28; };
  const auto decays = [](std::size_t i) { return i < 24; };
  const double lrs[] = {0.05, 0.02, 0.1, 0.03, 0.07};
  const double scales[] = {1.0, 0.5, 1.0, 0.8, 1.0};  // host grad_scale, as clipping sets it
  const optim::sgd_config cfgs[] = {
      {0.9, false, 0.01}, {0.9, true, 0.01}, {0.5, true, 0.0}, {0.0, false, 0.05}};
  std::uint64_t seed = 5101;
  for (const auto& cfg : cfgs) {
    INFO("momentum " << cfg.momentum << " nesterov " << cfg.nesterov << " weight_decay "
                     << cfg.weight_decay);
    std::mt19937_64 rng(seed++);
    const std::vector<double> p0 = random_params(n, rng);
    std::vector<double> p = p0;
    std::vector<ref_sgd> ref;
    for (double x : p0) ref.push_back({x});
    sgd_opt<double> opt(cfg, n, ranges, ctx);
    for (int t = 0; t < 5; ++t) {
      INFO("after step " << t + 1);
      const std::vector<double> g = random_grads(n, rng);
      opt.step(p.data(), g.data(), lrs[t], scales[t]);
      for (std::size_t i = 0; i < ref.size(); ++i)
        if (in_range(i))
          ref[i].step(static_cast<long double>(scales[t]) * g[i], lrs[t], cfg.momentum,
                      decays(i) ? cfg.weight_decay : 0.0, cfg.nesterov);
      if (t == 0 || t == 4) {  // one step, and several
        std::vector<long double> want_p(ref.size()), want_buf(ref.size());
        for (std::size_t i = 0; i < ref.size(); ++i) {
          want_p[i] = ref[i].p;
          want_buf[i] = ref[i].buf;
        }
        const double e_p = max_rel_error(p.data(), want_p, in_range);
        UNSCOPED_INFO("parameter error " << e_p);
        CHECK(e_p < f64_tol);
        if (cfg.momentum != 0) {  // PyTorch keeps no buffer without momentum
          const double e_buf = max_rel_error(opt.momentum_buffer(), want_buf, in_range);
          UNSCOPED_INFO("momentum error " << e_buf);
          CHECK(e_buf < f64_tol);
        }
      }
    }
    // Elements in no range (padding) are never touched.
    for (std::size_t i = 24; i < 28; ++i) {
      CHECK(p[i] == p0[i]);
      CHECK(opt.momentum_buffer()[i] == 0.0);
    }
    CHECK(opt.steps_taken() == 5);
    CHECK(opt.master() == nullptr);
  }
}

TEST_CASE("SGD weight decay applies to decaying ranges only", "[optim][sgd]") {
  // With a zero gradient and no momentum history, one step moves a decaying
  // element by exactly lr * wd * p and leaves a non-decaying one alone.
  const ctx_t ctx{};
  const std::vector<optim::param_range> ranges{{0, 2, true}, {2, 4, false}};
  sgd_opt<double> opt({0.9, false, 0.5}, 4, ranges, ctx);
  std::vector<double> p{1.0, -2.0, 1.0, -2.0}, g(4, 0.0);
  opt.step(p.data(), g.data(), 0.1);
  CHECK(p[0] == 1.0 - 0.1 * (0.5 * 1.0));
  CHECK(p[1] == -2.0 - 0.1 * (0.5 * -2.0));
  CHECK(p[2] == 1.0);
  CHECK(p[3] == -2.0);
  // Weight decay 0 makes every segment non-decaying: same as no decay flags.
  sgd_opt<double> none({0.9, false, 0.0}, 4, ranges, ctx);
  std::vector<double> q{1.0, -2.0, 1.0, -2.0};
  none.step(q.data(), g.data(), 0.1);
  CHECK(q == std::vector<double>{1.0, -2.0, 1.0, -2.0});
}

TEST_CASE("SGD with float32 master weights rounds bf16 parameters from the master",
          "[optim][sgd]") {
  const ctx_t ctx{};
  std::mt19937_64 rng(5201);
  const std::int64_t n = 64;
  const std::vector<optim::param_range> ranges{{0, 40, true}, {40, 64, false}};
  const auto all = [](std::size_t) { return true; };
  const optim::sgd_config cfg{0.9, true, 0.01};
  std::vector<bf16> p(n);
  std::vector<ref_sgd> ref;
  for (double x : random_params(n, rng)) {
    p[ref.size()] = bf16(static_cast<float>(x));
    ref.push_back({static_cast<long double>(static_cast<float>(p[ref.size()]))});  // exact
  }
  const std::vector<bf16> p0 = p;
  sgd_opt<bf16, float, float> opt(cfg, n, ranges, ctx);
  CHECK(opt.state_bytes() == 2 * n * sizeof(float) + 2 * segment_bytes);
  CHECK(opt.serialized_bytes() == sizeof(std::int64_t) + 2 * n * sizeof(float));
  opt.init_master(p.data());
  for (std::int64_t i = 0; i < n; ++i) REQUIRE(opt.master()[i] == static_cast<float>(p0[i]));
  // lr 1e-3: each update is below bf16's resolution (2^-8 .. 2^-7 relative)
  // for most elements, so only the master weights carry it until it adds up.
  for (int t = 0; t < 5; ++t) {
    INFO("step " << t + 1);
    std::vector<float> g(n);
    const std::vector<double> gd = random_grads(n, rng);
    for (std::int64_t i = 0; i < n; ++i) g[i] = static_cast<float>(gd[i]);
    opt.step(p.data(), g.data(), 1e-3);
    for (std::int64_t i = 0; i < n; ++i)
      ref[i].step(g[i], static_cast<long double>(static_cast<float>(1e-3)),
                  static_cast<long double>(static_cast<float>(cfg.momentum)),
                  i < 40 ? static_cast<long double>(static_cast<float>(cfg.weight_decay)) : 0.0L,
                  cfg.nesterov);
    // Each parameter is its master weight rounded to bf16, nothing else.
    for (std::int64_t i = 0; i < n; ++i) {
      INFO("element " << i);
      REQUIRE(p[i].bits == bf16(opt.master()[i]).bits);
    }
    std::vector<long double> want(n), want_buf(n);
    for (std::int64_t i = 0; i < n; ++i) {
      want[i] = ref[i].p;
      want_buf[i] = ref[i].buf;
    }
    const double e = max_rel_error(opt.master(), want, all);
    const double e_buf = max_rel_error(opt.momentum_buffer(), want_buf, all);
    UNSCOPED_INFO("master error " << e << " momentum error " << e_buf);
    CHECK(e < f32_tol);
    CHECK(e_buf < f32_tol);
  }
  // The master moved every element, some far enough to change its bf16 copy
  // and some not: the sub-ulp updates live in the master.
  int moved = 0, kept = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    REQUIRE(opt.master()[i] != static_cast<float>(p0[i]));
    (p[i].bits != p0[i].bits ? moved : kept)++;
  }
  CHECK(moved > 0);
  CHECK(kept > 0);
}

TEST_CASE("SGD requires init_master before stepping bf16 parameters", "[optim][sgd][errors]") {
  const ctx_t ctx{};
  const std::vector<optim::param_range> ranges{{0, 3, true}};
  sgd_opt<bf16, float, float> opt({}, 3, ranges, ctx);
  std::vector<bf16> p{bf16(0.5f), bf16(-1.0f), bf16(2.0f)};
  const std::vector<bf16> p0 = p;
  std::vector<float> g{0.25f, -0.5f, 1.0f};
  CHECK_THROWS_AS(opt.step(p.data(), g.data(), 1e-3), tessera::error);
  CHECK_THROWS_WITH(opt.step(p.data(), g.data(), 1e-3), Catch::Contains("init_master"));
  CHECK(opt.steps_taken() == 0);
  CHECK(same_bits(p.data(), p0.data(), p.size()));
  opt.init_master(p.data());
  CHECK_NOTHROW(opt.step(p.data(), g.data(), 1e-3));
  CHECK(opt.steps_taken() == 1);
}

TEST_CASE("SGD takes the clip coefficient through the pointer", "[optim][sgd]") {
  const ctx_t ctx{};
  std::mt19937_64 rng(5301);
  const std::int64_t n = 33;
  const std::vector<optim::param_range> ranges{{0, 20, true}, {20, 33, false}};
  const optim::sgd_config cfg{0.9, false, 0.01};
  const std::vector<double> p0 = random_params(n, rng);
  std::vector<double> pa = p0, pb = p0;
  std::vector<ref_sgd> ref;
  for (double x : p0) ref.push_back({x});
  sgd_opt<double> a(cfg, n, ranges, ctx), b(cfg, n, ranges, ctx);
  for (int t = 0; t < 3; ++t) {
    INFO("step " << t + 1);
    const std::vector<double> g = random_grads(n, rng);
    long double ref_ss = 0;
    for (double x : g) ref_ss += static_cast<long double>(x) * x;
    const double max_norm = 0.25 * std::sqrt(static_cast<double>(ref_ss));  // clipping active
    double ss = std::numeric_limits<double>::quiet_NaN(), coef = std::nan("");
    kernels::grad_sum_squares(ctx, &ss, g.data(), n);
    kernels::clip_coefficient(ctx, &coef, &ss, max_norm);
    // torch.nn.utils.clip_grad_norm_: max_norm / (norm + 1e-6).
    const long double ref_coef = max_norm / (std::sqrt(ref_ss) + 1e-6L);
    CHECK(coef == Approx(static_cast<double>(ref_coef)).epsilon(f64_tol));
    a.step(pa.data(), g.data(), 0.05, &coef);  // coefficient in the context's memory
    b.step(pb.data(), g.data(), 0.05, coef);   // the same value given on the host
    CHECK(same_bits(pa.data(), pb.data(), pa.size()));
    CHECK(same_bits(a.momentum_buffer(), b.momentum_buffer(), static_cast<std::size_t>(n)));
    std::vector<long double> want(n);
    for (std::int64_t i = 0; i < n; ++i) {
      ref[i].step(ref_coef * g[i], 0.05, cfg.momentum, i < 20 ? cfg.weight_decay : 0.0,
                  cfg.nesterov);
      want[i] = ref[i].p;
    }
    CHECK(max_rel_error(pa.data(), want, [](std::size_t) { return true; }) < f64_tol);
  }
}

TEST_CASE("SGD skips a step whose clip coefficient is not finite", "[optim][sgd]") {
  const ctx_t ctx{};
  std::mt19937_64 rng(5401);
  const std::int64_t n = 33;
  const std::vector<optim::param_range> ranges{{0, 20, true}, {20, 33, false}};
  const optim::sgd_config cfg{0.9, true, 0.01};
  const std::vector<double> p0 = random_params(n, rng), g1 = random_grads(n, rng),
                            g2 = random_grads(n, rng);
  for (double bad :
       {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    INFO("coefficient " << bad);
    sgd_opt<double> opt(cfg, n, ranges, ctx), ref(cfg, n, ranges, ctx);
    std::vector<double> p = p0, pr = p0;
    opt.step(p.data(), g1.data(), 0.05);
    ref.step(pr.data(), g1.data(), 0.05);
    const std::vector<double> p1 = p;
    const std::vector<double> buf1(opt.momentum_buffer(), opt.momentum_buffer() + n);
    opt.step(p.data(), g2.data(), 0.05, &bad);
    CHECK(same_bits(p.data(), p1.data(), p.size()));
    CHECK(same_bits(opt.momentum_buffer(), buf1.data(), buf1.size()));
    CHECK(opt.steps_taken() == 2);
    opt.skipped();
    CHECK(opt.steps_taken() == 1);
    opt.step(p.data(), g2.data(), 0.05);
    ref.step(pr.data(), g2.data(), 0.05);
    CHECK(same_bits(p.data(), pr.data(), p.size()));
  }
  sgd_opt<double> fresh(cfg, n, ranges, ctx);
  CHECK_THROWS_AS(fresh.skipped(), tessera::error);
}

TEST_CASE("SGD save and load restore the trajectory bit for bit", "[optim][sgd]") {
  const ctx_t ctx{};
  std::mt19937_64 rng(5501);
  const std::int64_t n = 50;
  const std::vector<optim::param_range> ranges{{0, 30, true}, {30, 50, false}};
  const optim::sgd_config cfg{0.9, false, 0.01};
  std::vector<bf16> p(n);
  std::vector<float> g(n);
  const auto pd = random_params(n, rng), gd = random_grads(n, rng);
  for (std::int64_t i = 0; i < n; ++i) {
    p[i] = bf16(static_cast<float>(pd[i]));
    g[i] = static_cast<float>(gd[i]);
  }
  sgd_opt<bf16, float, float> a(cfg, n, ranges, ctx), b(cfg, n, ranges, ctx);
  a.init_master(p.data());
  a.step(p.data(), g.data(), 1e-2);
  a.step(p.data(), g.data(), 2e-2);
  byte_writer w;
  a.save(w);
  REQUIRE(w.bytes.size() == a.serialized_bytes());
  b.load(w.bytes.data());
  CHECK(b.steps_taken() == 2);
  std::vector<bf16> pb = p;
  a.step(p.data(), g.data(), 3e-2);
  b.step(pb.data(), g.data(), 3e-2);
  CHECK(same_bits(p.data(), pb.data(), p.size()));
  CHECK(same_bits(a.master(), b.master(), static_cast<std::size_t>(n)));
  CHECK(same_bits(a.momentum_buffer(), b.momentum_buffer(), static_cast<std::size_t>(n)));
}

TEST_CASE("SGD rejects bad hyper-parameters naming them", "[optim][sgd][errors]") {
  const ctx_t ctx{};
  const std::vector<optim::param_range> r{{0, 1, true}};
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  struct bad_case {
    optim::sgd_config cfg;
    const char* names;
  };
  const bad_case cases[] = {
      {{1.0, false, 0.0}, "momentum=1"},       {{1.5, false, 0.0}, "momentum=1.5"},
      {{-0.1, false, 0.0}, "momentum=-0.1"},   {{nan, false, 0.0}, "momentum=nan"},
      {{0.0, true, 0.0}, "momentum=0"},        {{0.9, false, -0.1}, "weight_decay=-0.1"},
      {{0.9, false, nan}, "weight_decay=nan"}, {{0.9, false, inf}, "weight_decay=inf"},
  };
  for (const auto& c : cases) {
    INFO(c.names);
    CHECK_THROWS_AS(c.cfg.validate(), config_error);
    CHECK_THROWS_WITH(c.cfg.validate(), Catch::Contains(c.names));
    // The constructor validates before it allocates anything.
    CHECK_THROWS_AS((sgd_opt<float>(c.cfg, 1, r, ctx)), config_error);
    CHECK_THROWS_WITH((sgd_opt<float>(c.cfg, 1, r, ctx)), Catch::Contains(c.names));
  }
  CHECK_THROWS_WITH(optim::sgd_config({0.0, true, 0.0}).validate(), Catch::Contains("Nesterov"));
  CHECK_NOTHROW(optim::sgd_config({0.0, false, 0.0}).validate());  // plain SGD
  CHECK_NOTHROW(optim::sgd_config({0.99, true, 1e-4}).validate());
  CHECK_THROWS_AS((sgd_opt<float>({}, -1, r, ctx)), config_error);
  CHECK_THROWS_WITH((sgd_opt<float>({}, -1, r, ctx)), Catch::Contains("n=-1"));
}

}  // namespace test_optim_sgd
