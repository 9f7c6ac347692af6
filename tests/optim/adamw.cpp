// Tests include/tessera/optim/adamw.hpp, schedule.hpp and clip.hpp against
// formulas computed by hand (torch.optim.AdamW's update) in long double.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "tessera/nn/llama.hpp"
#include "tessera/optim/adamw.hpp"
#include "tessera/optim/clip.hpp"
#include "tessera/optim/schedule.hpp"

using namespace tessera;

namespace {
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
}  // namespace

TEST_CASE("AdamW steps equal the hand-computed PyTorch formula", "[optim]") {
  optim::adamw_config cfg{0.9, 0.95, 1e-8, 0.1};
  // Two ranges: [0,3) decays, [3,5) does not (a norm gain).
  std::vector<optim::param_range> ranges{{0, 3, true}, {3, 5, false}};
  optim::adamw<double, double> opt(cfg, 0, 5, ranges);
  std::vector<double> p{0.5, -1.25, 2.0, 1.0, 0.75};
  std::vector<ref_state> ref;
  for (double x : p) ref.push_back({x});
  const std::vector<std::vector<double>> grads{{0.1, -0.2, 0.3, 0.05, -0.4},
                                               {-0.3, 0.1, 0.2, 0.0, 0.6},
                                               {0.25, 0.25, -0.5, 1.0, -1.0}};
  const double lrs[] = {1e-3, 5e-3, 2e-3};
  for (int t = 0; t < 3; ++t) {
    opt.step(p.data(), grads[t].data(), lrs[t], 1.0);
    for (int i = 0; i < 5; ++i)
      ref_adamw(ref[i], grads[t][i], t + 1, lrs[t], 0.9L, 0.95L, 1e-8L, 0.1L, i < 3);
  }
  for (int i = 0; i < 5; ++i) CHECK(p[i] == Approx((double)ref[i].p).epsilon(1e-13));
  // The first step of Adam moves each element by about lr (|m_hat / sqrt(v_hat)| = 1).
  CHECK(opt.steps_taken() == 3);
}

TEST_CASE("AdamW with float32 master weights rounds bf16 parameters from the master", "[optim]") {
  optim::adamw_config cfg{0.9, 0.999, 1e-8, 0.0};
  std::vector<optim::param_range> ranges{{0, 2, true}};
  optim::adamw<bf16, float, float> opt(cfg, 0, 2, ranges);
  std::vector<bf16> p{bf16(1.0f), bf16(-2.0f)};
  opt.init_master(p.data());
  std::vector<float> g{1.0f, -1.0f};
  opt.step(p.data(), g.data(), 1e-4, 1.0);
  // master moved by ~1e-4 (below bf16 resolution at 1.0: 2^-7), bf16 copy unchanged
  CHECK(opt.master()[0] == Approx(1.0f - 1e-4f).epsilon(1e-6));
  CHECK(static_cast<float>(p[0]) == 1.0f);
  CHECK(opt.state_bytes() == 3 * 2 * sizeof(float));
}

TEST_CASE("AdamW clip coefficient scales the gradient", "[optim]") {
  optim::adamw_config cfg{0.9, 0.95, 1e-8, 0.0};
  std::vector<optim::param_range> r{{0, 1, true}};
  optim::adamw<double, double> a(cfg, 0, 1, r), b(cfg, 0, 1, r);
  double pa = 1, pb = 1, g = 4.0, g_half = 2.0;
  a.step(&pa, &g, 1e-2, 0.5);
  b.step(&pb, &g_half, 1e-2, 1.0);
  CHECK(pa == pb);
}

TEST_CASE("weight decay excludes norms and 1-D parameters by membership", "[optim]") {
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
  optim::adamw<double, double> opt(cfg, 0, layout.total(), ranges);
  std::vector<double> p(layout.total(), 1.0), g(layout.total(), 0.0);
  opt.step(p.data(), g.data(), 0.1, 1.0);
  for (const auto& e : layout.entries()) {
    INFO(e.name);
    CHECK(p[e.offset] == (e.decay ? 1.0 - 0.1 * 0.5 : 1.0));
  }
}

TEST_CASE("warmup-cosine schedule", "[optim]") {
  optim::warmup_cosine s{1e-3, 1e-4, 10, 110};
  CHECK(s(0) == Approx(1e-4));
  CHECK(s(9) == Approx(1e-3));
  CHECK(s(10) == Approx(1e-3));
  CHECK(s(60) == Approx(1e-4 + 0.5 * 9e-4));
  CHECK(s(110) == Approx(1e-4));
  CHECK(s(500) == Approx(1e-4));
  CHECK_THROWS_AS((optim::warmup_cosine{1e-4, 1e-3, 1, 2}.validate()), config_error);
}

TEST_CASE("global gradient norm and clip coefficient", "[optim]") {
  std::vector<double> g(10007);
  long double ref = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    g[i] = std::sin(0.37 * i) * 1e-2;
    ref += (long double)g[i] * g[i];
  }
  CHECK(optim::grad_sum_squares(g.data(), (std::int64_t)g.size()) == Approx((double)ref).epsilon(1e-13));
  CHECK(optim::clip_coefficient(2.0, 1.0) == Approx(1.0 / (2.0 + 1e-6)));
  CHECK(optim::clip_coefficient(0.5, 1.0) == 1.0);
  CHECK(optim::clip_coefficient(5.0, 0.0) == 1.0);
  CHECK(std::isnan(optim::clip_coefficient(INFINITY, 1.0)));
}
