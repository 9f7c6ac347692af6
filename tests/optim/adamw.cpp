// Tests include/tessera/optim/adamw.hpp (the optim::adamw policy and
// adamw_optimizer on the host context) and clip.hpp, and the
// gradient-norm kernels of kernels/optimizer.hpp, against formulas computed
// by hand (torch.optim.AdamW's update) in long double.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

#include "tessera/kernels/context.hpp"
#include "tessera/kernels/optimizer.hpp"
#include "tessera/nn/llama_layout.hpp"
#include "tessera/optim/adamw.hpp"
#include "tessera/optim/clip.hpp"

namespace test_optim_adamw {

using namespace tessera;

namespace {

using ctx_t = kernels::host_context;
template <class Param, class Grad = Param, class Master = Param>
using adamw_opt = optim::adamw_optimizer<Param, Grad, Master, ctx_t>;

// Tolerances (STYLE.md, "Tests"):
// - float64 against the long-double formula: each step is about ten float64
//   operations on values of order 1 whose update lr * m_hat / sqrt(v_hat) is
//   far below |p|, so three steps stay within a few tens of ulps (2^-52 =
//   2.2e-16 each): 1e-13 relative leaves a margin of ten or more.
constexpr double f64_tol = 1e-13;
// - float64 sums of squares of 10007 positive terms in blocks of 4096: the
//   relative rounding error is below 4096 * 2^-53 = 4.5e-13 in the worst case
//   and about sqrt(4096) * 2^-53 = 7e-15 in practice; 1e-13.
constexpr double sumsq_tol = 1e-13;

// PyTorch AdamW, written out by hand for one element over `steps` steps.
struct ref_state {
  long double p, m = 0, v = 0;
};
void ref_adamw(ref_state& s, long double g, int t, long double lr, long double b1, long double b2,
               long double eps, long double wd, bool decay) {
  if (decay) s.p = s.p * (1 - lr * wd);
  s.m = b1 * s.m + (1 - b1) * g;
  s.v = b2 * s.v + (1 - b2) * g * g;
  long double bc1 = 1 - std::pow(b1, (long double)t), bc2 = 1 - std::pow(b2, (long double)t);
  s.p -= lr * (s.m / bc1) / (std::sqrt(s.v / bc2) + eps);
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

}  // namespace

TEST_CASE("optim::adamw is an optimizer policy", "[optim]") {
  STATIC_REQUIRE(optim::optimizer_policy<optim::adamw>);
  STATIC_REQUIRE(std::is_same_v<optim::adamw::state<bf16, float, float, ctx_t>,
                                optim::adamw_optimizer<bf16, float, float, ctx_t>>);
  STATIC_REQUIRE(std::is_same_v<optim::adamw::config, optim::adamw_config>);
  STATIC_REQUIRE(std::is_same_v<optim::param_range, nn::param_range>);
  STATIC_REQUIRE(adamw_opt<bf16, float, float>::has_master);
  STATIC_REQUIRE(!adamw_opt<float>::has_master);
  // Moments (and master weights when kept), by hand: 2 or 3 Masters a parameter.
  STATIC_REQUIRE(adamw_opt<bf16, float, float>::state_bytes_per_param == 12);
  STATIC_REQUIRE(adamw_opt<double>::state_bytes_per_param == 16);
  CHECK(std::string(optim::adamw::name) == "adamw");
}

TEST_CASE("AdamW steps equal the hand-computed PyTorch formula", "[optim]") {
  const ctx_t ctx{};
  optim::adamw_config cfg{0.9, 0.95, 1e-8, 0.1};
  // Two ranges: [0,3) decays, [3,5) does not (a norm gain).
  std::vector<optim::param_range> ranges{{0, 3, true}, {3, 5, false}};
  adamw_opt<double> opt(cfg, 5, ranges, ctx);
  std::vector<double> p{0.5, -1.25, 2.0, 1.0, 0.75};
  std::vector<ref_state> ref;
  for (double x : p) ref.push_back({x});
  const std::vector<std::vector<double>> grads{
      {0.1, -0.2, 0.3, 0.05, -0.4}, {-0.3, 0.1, 0.2, 0.0, 0.6}, {0.25, 0.25, -0.5, 1.0, -1.0}};
  const double lrs[] = {1e-3, 5e-3, 2e-3};
  for (int t = 0; t < 3; ++t) {
    opt.step(p.data(), grads[t].data(), lrs[t], 1.0);
    for (int i = 0; i < 5; ++i)
      ref_adamw(ref[i], grads[t][i], t + 1, lrs[t], 0.9L, 0.95L, 1e-8L, 0.1L, i < 3);
  }
  for (int i = 0; i < 5; ++i) {
    INFO("element " << i);
    CHECK(p[i] == Approx((double)ref[i].p).epsilon(f64_tol));
    CHECK(opt.exp_avg()[i] == Approx((double)ref[i].m).epsilon(f64_tol));
    CHECK(opt.exp_avg_sq()[i] == Approx((double)ref[i].v).epsilon(f64_tol));
  }
  CHECK(opt.master() == nullptr);  // float64 parameters are updated in place
  CHECK(opt.steps_taken() == 3);
  CHECK(opt.size() == 5);
}

TEST_CASE("AdamW with float32 master weights rounds bf16 parameters from the master", "[optim]") {
  const ctx_t ctx{};
  optim::adamw_config cfg{0.9, 0.999, 1e-8, 0.0};
  std::vector<optim::param_range> ranges{{0, 2, true}};
  adamw_opt<bf16, float, float> opt(cfg, 2, ranges, ctx);
  std::vector<bf16> p{bf16(1.0f), bf16(-2.0f)};
  opt.init_master(p.data());
  std::vector<float> g{1.0f, -1.0f};
  opt.step(p.data(), g.data(), 1e-4, 1.0);
  // master moved by ~1e-4 (below bf16 resolution at 1.0: 2^-7), bf16 copy unchanged
  CHECK(opt.master()[0] == Approx(1.0f - 1e-4f).epsilon(1e-6));
  CHECK(static_cast<float>(p[0]) == 1.0f);
  // Master weights and two moments of 2 floats, plus one segment (one range).
  CHECK(opt.state_bytes() == 3 * 2 * sizeof(float) + 1 * segment_bytes);
  // A checkpoint holds the step count and the three buffers, not the segment table.
  CHECK(opt.serialized_bytes() == sizeof(std::int64_t) + 3 * 2 * sizeof(float));
}

TEST_CASE("AdamW state bytes count one segment per range inside the optimizer", "[optim]") {
  const ctx_t ctx{};
  // Three ranges, one of them beyond n = 10 (clipped away), one cut at n.
  std::vector<optim::param_range> ranges{{0, 4, true}, {4, 12, false}, {16, 20, true}};
  adamw_opt<float> opt({}, 10, ranges, ctx);
  CHECK(opt.state_bytes() == 2 * 10 * sizeof(float) + 2 * segment_bytes);
  CHECK(opt.serialized_bytes() == sizeof(std::int64_t) + 2 * 10 * sizeof(float));
}

TEST_CASE("AdamW requires init_master before stepping bf16 parameters", "[optim][errors]") {
  const ctx_t ctx{};
  std::vector<optim::param_range> ranges{{0, 3, true}};
  adamw_opt<bf16, float, float> opt({}, 3, ranges, ctx);
  std::vector<bf16> p{bf16(0.5f), bf16(-1.0f), bf16(2.0f)};
  const std::vector<bf16> p0 = p;
  std::vector<float> g{0.25f, -0.5f, 1.0f};
  CHECK_THROWS_AS(opt.step(p.data(), g.data(), 1e-3), tessera::error);
  CHECK_THROWS_WITH(opt.step(p.data(), g.data(), 1e-3), Catch::Contains("init_master"));
  CHECK(opt.steps_taken() == 0);  // the refused step is not counted
  CHECK(same_bits(p.data(), p0.data(), p.size()));
  opt.init_master(p.data());
  CHECK_NOTHROW(opt.step(p.data(), g.data(), 1e-3));
  CHECK(opt.steps_taken() == 1);
  // Same-type parameters need no master copy.
  adamw_opt<float> in_place({}, 3, ranges, ctx);
  std::vector<float> pf{0.5f, -1.0f, 2.0f};
  CHECK_NOTHROW(in_place.step(pf.data(), g.data(), 1e-3));
}

TEST_CASE("AdamW clip coefficient scales the gradient", "[optim]") {
  const ctx_t ctx{};
  optim::adamw_config cfg{0.9, 0.95, 1e-8, 0.0};
  std::vector<optim::param_range> r{{0, 1, true}};
  adamw_opt<double> a(cfg, 1, r, ctx), b(cfg, 1, r, ctx), c(cfg, 1, r, ctx);
  double pa = 1, pb = 1, pc = 1, g = 4.0, g_half = 2.0;
  a.step(&pa, &g, 1e-2, 0.5);
  b.step(&pb, &g_half, 1e-2, 1.0);
  CHECK(pa == pb);
  // The same coefficient read through the pointer (the context's memory).
  const double coef = 0.5;
  c.step(&pc, &g, 1e-2, &coef);
  CHECK(pc == pa);
  CHECK(c.exp_avg()[0] == a.exp_avg()[0]);
  CHECK(c.exp_avg_sq()[0] == a.exp_avg_sq()[0]);
}

TEST_CASE("AdamW skips a step whose clip coefficient is not finite", "[optim]") {
  const ctx_t ctx{};
  std::mt19937_64 rng(4101);
  std::uniform_real_distribution<double> u(-1, 1);
  const std::int64_t n = 37;
  std::vector<optim::param_range> ranges{{0, 20, true}, {20, 37, false}};
  const optim::adamw_config cfg{0.9, 0.95, 1e-8, 0.1};
  std::vector<double> g1(n), g2(n), p0(n);
  for (auto* v : {&g1, &g2, &p0})
    for (double& x : *v) x = u(rng);

  for (double bad :
       {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
        -std::numeric_limits<double>::infinity()}) {
    INFO("coefficient " << bad);
    // `opt` takes step 1, a skipped step, then step 2; `ref` steps 1 and 2 only.
    adamw_opt<double> opt(cfg, n, ranges, ctx), ref(cfg, n, ranges, ctx);
    std::vector<double> p = p0, pr = p0;
    opt.step(p.data(), g1.data(), 1e-2);
    ref.step(pr.data(), g1.data(), 1e-2);
    const std::vector<double> p1 = p;
    const std::vector<double> m1(opt.exp_avg(), opt.exp_avg() + n),
        v1(opt.exp_avg_sq(), opt.exp_avg_sq() + n);
    opt.step(p.data(), g2.data(), 1e-2, &bad);
    CHECK(opt.steps_taken() == 2);  // counted until the caller says otherwise
    CHECK(same_bits(p.data(), p1.data(), p.size()));
    CHECK(same_bits(opt.exp_avg(), m1.data(), m1.size()));
    CHECK(same_bits(opt.exp_avg_sq(), v1.data(), v1.size()));
    opt.skipped();
    CHECK(opt.steps_taken() == 1);
    // The next step uses the bias corrections of step 2: the same bits as never skipping.
    opt.step(p.data(), g2.data(), 1e-2);
    ref.step(pr.data(), g2.data(), 1e-2);
    CHECK(same_bits(p.data(), pr.data(), p.size()));
    CHECK(same_bits(opt.exp_avg(), ref.exp_avg(), static_cast<std::size_t>(n)));
    CHECK(same_bits(opt.exp_avg_sq(), ref.exp_avg_sq(), static_cast<std::size_t>(n)));
  }

  // With master weights: parameters, master and moments are all left alone.
  std::vector<optim::param_range> one{{0, 3, true}};
  adamw_opt<bf16, float, float> mixed(cfg, 3, one, ctx);
  std::vector<bf16> pb{bf16(0.5f), bf16(-1.0f), bf16(2.0f)};
  mixed.init_master(pb.data());
  std::vector<float> g{0.25f, -0.5f, 1.0f};
  mixed.step(pb.data(), g.data(), 1e-2);
  const std::vector<bf16> pb1 = pb;
  const std::vector<float> master1(mixed.master(), mixed.master() + 3),
      m1(mixed.exp_avg(), mixed.exp_avg() + 3), v1(mixed.exp_avg_sq(), mixed.exp_avg_sq() + 3);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  mixed.step(pb.data(), g.data(), 1e-2, &nan);
  CHECK(same_bits(pb.data(), pb1.data(), 3));
  CHECK(same_bits(mixed.master(), master1.data(), 3));
  CHECK(same_bits(mixed.exp_avg(), m1.data(), 3));
  CHECK(same_bits(mixed.exp_avg_sq(), v1.data(), 3));
  mixed.skipped();
  CHECK(mixed.steps_taken() == 1);

  // skipped() without a step to take back is an error.
  adamw_opt<double> fresh(cfg, n, ranges, ctx);
  CHECK_THROWS_AS(fresh.skipped(), tessera::error);
}

TEST_CASE("AdamW save and load restore the trajectory bit for bit", "[optim]") {
  const ctx_t ctx{};
  std::mt19937_64 rng(4102);
  std::uniform_real_distribution<float> u(-1, 1);
  const std::int64_t n = 50;
  std::vector<optim::param_range> ranges{{0, 30, true}, {30, 50, false}};
  const optim::adamw_config cfg{0.9, 0.95, 1e-8, 0.1};
  std::vector<bf16> p(n);
  std::vector<float> g(n);
  for (auto& x : p) x = bf16(u(rng));
  for (auto& x : g) x = u(rng);
  adamw_opt<bf16, float, float> a(cfg, n, ranges, ctx), b(cfg, n, ranges, ctx);
  a.init_master(p.data());
  a.step(p.data(), g.data(), 1e-2);
  a.step(p.data(), g.data(), 2e-2);
  byte_writer w;
  a.save(w);
  REQUIRE(w.bytes.size() == a.serialized_bytes());
  b.load(w.bytes.data());  // also stands for init_master
  CHECK(b.steps_taken() == 2);
  std::vector<bf16> pb = p;
  a.step(p.data(), g.data(), 3e-2);
  b.step(pb.data(), g.data(), 3e-2);
  CHECK(same_bits(p.data(), pb.data(), p.size()));
  CHECK(same_bits(a.master(), b.master(), static_cast<std::size_t>(n)));
  CHECK(same_bits(a.exp_avg(), b.exp_avg(), static_cast<std::size_t>(n)));
  CHECK(same_bits(a.exp_avg_sq(), b.exp_avg_sq(), static_cast<std::size_t>(n)));
}

TEST_CASE("AdamW rejects bad hyper-parameters naming them", "[optim][errors]") {
  const ctx_t ctx{};
  std::vector<optim::param_range> r{{0, 1, true}};
  CHECK_THROWS_WITH((adamw_opt<float>({1.0, 0.95, 1e-8, 0.1}, 1, r, ctx)),
                    Catch::Contains("beta1=1"));
  CHECK_THROWS_WITH((adamw_opt<float>({0.9, -0.5, 1e-8, 0.1}, 1, r, ctx)),
                    Catch::Contains("beta2=-0.5"));
  CHECK_THROWS_WITH((adamw_opt<float>({0.9, 0.95, 0.0, 0.1}, 1, r, ctx)), Catch::Contains("eps=0"));
  CHECK_THROWS_WITH((adamw_opt<float>({0.9, 0.95, 1e-8, -1.0}, 1, r, ctx)),
                    Catch::Contains("weight_decay=-1"));
  CHECK_THROWS_AS((adamw_opt<float>({}, -1, r, ctx)), config_error);
}

TEST_CASE("weight decay excludes norms and 1-D parameters by membership", "[optim]") {
  const ctx_t ctx{};
  auto layout = nn::make_llama_layout(nn::llama_config::tiny());
  int decayed = 0, kept = 0;
  for (const auto& e : layout.entries()) {
    const bool is_norm = e.name.find("norm") != std::string::npos;
    INFO(e.name);
    CHECK(e.decay == !is_norm);
    CHECK((e.shp.rank == 1) == is_norm);
    (e.decay ? decayed : kept)++;
  }
  CHECK(kept == 2 * 2 + 1);  // two norms per block, two blocks, final norm
  // The optimizer leaves a non-decayed element alone when its gradient is 0,
  // and shrinks a decayed one by lr * wd exactly.
  optim::adamw_config cfg{0.9, 0.95, 1e-8, 0.5};
  auto ranges = layout.ranges();
  adamw_opt<double> opt(cfg, layout.total(), ranges, ctx);
  std::vector<double> p(layout.total(), 1.0), g(layout.total(), 0.0);
  opt.step(p.data(), g.data(), 0.1, 1.0);
  for (const auto& e : layout.entries()) {
    INFO(e.name);
    CHECK(p[e.offset] == (e.decay ? 1.0 - 0.1 * 0.5 : 1.0));
  }
}

TEST_CASE("grad_sum_squares sums 4096-element blocks in order, then the blocks in order",
          "[optim]") {
  // The documented order, one block at a time, against the kernel (which
  // runs eight blocks side by side): the same bits, for every tail shape and
  // float, bf16 and double gradients.
  const ctx_t ctx{};
  auto check = [&](auto tag, std::int64_t n) {
    using G = decltype(tag);
    std::vector<G> g(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) g[static_cast<std::size_t>(i)] = to<G>(std::sin(0.37 * i));
    double want = 0;
    for (std::int64_t b = 0; b * 4096 < n; ++b) {
      double s = 0;
      for (std::int64_t i = b * 4096; i < std::min(n, (b + 1) * 4096); ++i) {
        const double x = to<double>(g[static_cast<std::size_t>(i)]);
        s += x * x;
      }
      want += s;
    }
    double got = -1;
    kernels::grad_sum_squares(ctx, &got, g.data(), n);
    INFO(dtype_name<G>() << " n = " << n);
    CHECK(std::memcmp(&got, &want, sizeof got) == 0);
  };
  for (std::int64_t n : {0, 1, 4095, 4096, 8 * 4096, 8 * 4096 + 1, 17 * 4096 + 5, 40 * 4096}) {
    check(float{}, n);
    check(bf16{}, n);
    check(double{}, n);
  }
}

TEST_CASE("global gradient norm and clip coefficient", "[optim]") {
  const ctx_t ctx{};
  std::vector<double> g(10007);
  long double ref = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    g[i] = std::sin(0.37 * i) * 1e-2;
    ref += (long double)g[i] * g[i];
  }
  const auto n = static_cast<std::int64_t>(g.size());
  double ss = std::numeric_limits<double>::quiet_NaN();  // poisoned: must be written
  kernels::grad_sum_squares(ctx, &ss, g.data(), n);
  CHECK(ss == Approx((double)ref).epsilon(sumsq_tol));
  // Two buffers in a fixed order: the first writes, the second accumulates.
  double ss2 = std::numeric_limits<double>::quiet_NaN();
  kernels::grad_sum_squares(ctx, &ss2, g.data(), 5000);
  kernels::grad_sum_squares(ctx, &ss2, g.data() + 5000, n - 5000, true);
  CHECK(ss2 == Approx((double)ref).epsilon(sumsq_tol));
  CHECK_THROWS_AS(kernels::grad_sum_squares(ctx, &ss2, g.data(), -1), config_error);

  CHECK(optim::clip_coefficient(2.0, 1.0) == Approx(1.0 / (2.0 + 1e-6)));
  CHECK(optim::clip_coefficient(0.5, 1.0) == 1.0);
  CHECK(optim::clip_coefficient(5.0, 0.0) == 1.0);
  CHECK(std::isnan(optim::clip_coefficient(INFINITY, 1.0)));

  // The coefficient into the context's memory, rounded to the master type.
  const double max_norm = 0.1 * std::sqrt((double)ref);  // clipping active
  float coef = -1;
  kernels::clip_coefficient(ctx, &coef, &ss, max_norm);
  CHECK(coef == static_cast<float>(optim::clip_coefficient(std::sqrt(ss), max_norm)));
  CHECK(coef < 1.0f);
  const double inf_ss = INFINITY;
  double dcoef = 0;
  kernels::clip_coefficient(ctx, &dcoef, &inf_ss, max_norm);
  CHECK(std::isnan(dcoef));
}

}  // namespace test_optim_adamw
