// Tests include/tessera/optim/adafactor.hpp (the optim::adafactor policy and
// adafactor_optimizer on the host context, kernels::adafactor_step) against
// Adafactor written out here in float64 from the paper, Shazeer & Stern
// 2018, "Adafactor: Adaptive Learning Rates with Sublinear Memory Cost":
//
//   Algorithm 4 (a matrix G of n x m):
//     beta2_t = 1 - t^-c                                    (section 7.2, c = 0.8)
//     R_t = beta2_t R_{t-1} + (1 - beta2_t) (G^2 + eps1) 1_m   (row sums)
//     C_t = beta2_t C_{t-1} + (1 - beta2_t) 1_n^T (G^2 + eps1) (column sums)
//     V_t = R_t C_t / (1_n^T R_t),  U_t = G_t / sqrt(V_t)
//   Algorithm 5 (a vector): V_t = beta2_t V_{t-1} + (1 - beta2_t) (G^2 + eps1)
//   Û_t = U_t / max(1, RMS(U_t) / d)                           (section 6)
//   alpha_t = max(eps2, RMS(X_{t-1})) rho_t, rho_t = min(1e-2, 1 / sqrt(t))
//                                   (with scale_parameter and relative_step)
//
// and, where the paper leaves the arithmetic open, in the form of
// transformers.optimization.Adafactor.step (v5.25, src/transformers/
// optimization.py): the statistics stored as means, not sums (lines
// 1266-1267: exp_avg_sq_row / _col take update.mean(dim=-1) / mean(dim=-2);
// R C / sum(R) = row col / mean(row), lines 1198-1199), lr applied after
// the clipping and before the first moment (lines 1278-1284:
// m = beta1 m + (1 - beta1) lr Û, the step is m), the decoupled decay
// p -= wd lr p before the update (lines 1286-1289), and the parameter
// scale and relative step of _get_lr (lines 1174-1182), warmup_init's
// min(1e-6 t, ...) included. Weight decay applies where a range's decay
// flag says (norms and biases excluded), as a param group of its own
// would in transformers.
//
// It is also held to transformers' own Adafactor: ten float64 steps of
// transformers.optimization.Adafactor (scale_parameter, relative_step and
// warmup_init off; beta1=None and 0.9; weight decay with the norm gain in a
// param group of its own at 0), recorded with the gradients by
// tests/python/optimizer_reference.py in
// tests/python/fixtures/optimizers_fp64/trajectories.json
// (tests/support/optimizer_reference.hpp reads it): every parameter and
// statistic after every step to 1e-12 relative.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "tessera/kernels/adafactor.hpp"
#include "tessera/kernels/context.hpp"
#include "tessera/optim/adafactor.hpp"

#include "../support/optimizer_reference.hpp"

namespace test_optim_adafactor {

using namespace tessera;

namespace {

using ctx_t = kernels::host_context;
template <class Param, class Grad = Param, class Master = Param>
using adafactor_opt = optim::adafactor_optimizer<Param, Grad, Master, ctx_t>;

// Tolerances (STYLE.md, "Tests"):
// - float64 against the float64 transcription: both sum rows and columns
//   of at most 5000 terms in float64 (relative rounding below 5000 x 2^-53
//   = 5.6e-13 in the worst case, about sqrt(5000) x 2^-53 = 8e-15 in
//   practice), then a handful of operations per element a step, ten steps:
//   the house float64 bound 1e-12 relative holds with a margin.
constexpr double f64_tol = 1e-12;
// - float32 master weights against the float64 transcription of the same
//   rounded inputs: each step rounds about twenty float32 operations per
//   element (2^-24 = 6e-8 each) and divides by square roots of statistics
//   that carry the rounding of their own averages; ten steps stay below
//   1e-5 relative (the house float32 bound).
constexpr double f32_tol = 1e-5;

/// One tensor of the reference: a matrix (rows x cols) or a vector.
struct ref_tensor {
  std::int64_t begin = 0, rows = 1, cols = 1;
  bool matrix = false, decay = true;
  std::vector<double> x, m;     // parameters, first moment
  std::vector<double> R, C, V;  // row and column sums (matrix), statistics (vector)
  std::int64_t n() const { return rows * cols; }
};

struct ref_config {
  double beta1 = 0, d = 1, c = 0.8, eps1 = 1e-30, eps2 = 1e-3, wd = 0;
  bool scale_parameter = false, relative_step = false, warmup_init = false;
};

double rms(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s / static_cast<double>(v.size()));
}

/// Step t (1-based) of the reference on tensor `r` with gradient `g`
/// (row-major) at the schedule's rate `lr` (file comment).
void ref_step(ref_tensor& r, const std::vector<double>& g, double lr, int t, const ref_config& k) {
  const std::int64_t n = r.n();
  double rho = lr;
  if (k.relative_step)
    rho = std::min(k.warmup_init ? 1e-6 * t : 1e-2, 1.0 / std::sqrt(static_cast<double>(t)));
  const double alpha = k.scale_parameter ? std::max(k.eps2, rms(r.x)) * rho : rho;
  const double beta2t = 1.0 - std::pow(static_cast<double>(t), -k.c);
  std::vector<double> u(static_cast<std::size_t>(n));
  if (r.matrix) {
    if (r.R.empty()) {
      r.R.assign(static_cast<std::size_t>(r.rows), 0.0);
      r.C.assign(static_cast<std::size_t>(r.cols), 0.0);
    }
    for (std::int64_t i = 0; i < r.rows; ++i) {
      double s = 0;
      for (std::int64_t j = 0; j < r.cols; ++j) s += g[i * r.cols + j] * g[i * r.cols + j] + k.eps1;
      r.R[i] = beta2t * r.R[i] + (1 - beta2t) * s;
    }
    for (std::int64_t j = 0; j < r.cols; ++j) {
      double s = 0;
      for (std::int64_t i = 0; i < r.rows; ++i) s += g[i * r.cols + j] * g[i * r.cols + j] + k.eps1;
      r.C[j] = beta2t * r.C[j] + (1 - beta2t) * s;
    }
    double sum_r = 0;
    for (double x : r.R) sum_r += x;
    for (std::int64_t i = 0; i < r.rows; ++i)
      for (std::int64_t j = 0; j < r.cols; ++j)
        u[i * r.cols + j] = g[i * r.cols + j] / std::sqrt(r.R[i] * r.C[j] / sum_r);
  } else {
    if (r.V.empty()) r.V.assign(static_cast<std::size_t>(n), 0.0);
    for (std::int64_t i = 0; i < n; ++i) {
      r.V[i] = beta2t * r.V[i] + (1 - beta2t) * (g[i] * g[i] + k.eps1);
      u[i] = g[i] / std::sqrt(r.V[i]);
    }
  }
  const double divisor = std::max(1.0, rms(u) / k.d);
  if (r.m.empty()) r.m.assign(static_cast<std::size_t>(n), 0.0);
  for (std::int64_t i = 0; i < n; ++i) {
    double step = alpha * u[i] / divisor;
    if (k.beta1 > 0) {
      r.m[i] = k.beta1 * r.m[i] + (1 - k.beta1) * step;
      step = r.m[i];
    }
    if (r.decay && k.wd != 0) r.x[i] -= k.wd * alpha * r.x[i];
    r.x[i] -= step;
  }
}

optim::adafactor_config to_config(const ref_config& k) {
  optim::adafactor_config c;
  c.beta1 = k.beta1;
  c.clip_threshold = k.d;
  c.decay_rate = -k.c;
  c.eps1 = k.eps1;
  c.eps2 = k.eps2;
  c.weight_decay = k.wd;
  c.scale_parameter = k.scale_parameter;
  c.relative_step = k.relative_step;
  c.warmup_init = k.warmup_init;
  return c;
}

/// The test layout: a 6 x 5 matrix, 3 elements of padding, a vector of 7
/// (a norm gain: no decay), a 3 x 9 matrix, a vector of 5000 (two rows of
/// the kernels' vector reduction), a 1 x 4 matrix (factored: 2-D).
struct layout {
  std::vector<ref_tensor> tensors;
  std::vector<optim::param_range> ranges;
  std::int64_t n = 0;
  layout() {
    auto add = [&](std::int64_t rows, std::int64_t cols, bool matrix, bool decay) {
      ref_tensor t;
      t.begin = n;
      t.rows = rows;
      t.cols = cols;
      t.matrix = matrix;
      t.decay = decay;
      tensors.push_back(t);
      optim::param_range r{n, n + rows * cols, decay};
      r.dims = matrix ? 2 : 1;
      r.rows = rows;
      r.cols = cols;
      ranges.push_back(r);
      n += rows * cols;
    };
    add(6, 5, true, true);
    n += 3;  // padding: in no range
    add(1, 7, false, false);
    add(3, 9, true, true);
    add(1, 5000, false, true);
    add(1, 4, true, true);
  }
};

std::vector<double> random_vector(std::size_t n, std::mt19937_64& rng, double lo, double hi) {
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(n);
  for (double& x : v) x = u(rng);
  return v;
}

/// Largest |got - want| / max(|want|, rms(want)) over `want`: relative,
/// except that an element far below the tensor's typical size (a parameter
/// or a first moment crossing zero) is measured against that size.
template <class T>
double max_rel_error(const T* got, const std::vector<double>& want) {
  const double typical = rms(want);
  double worst = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double g = static_cast<double>(got[i]);
    if (!std::isfinite(g)) return INFINITY;
    worst = std::max(worst, std::abs(g - want[i]) / std::max(std::abs(want[i]), typical));
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

/// Ten steps of adafactor_opt<Param, Grad, float or double> against the
/// reference under `k`, checking every parameter, statistic and first
/// moment after each step within `tol`.
template <class Param, class Master>
void ten_steps(const ref_config& k, double tol, std::uint64_t seed) {
  const ctx_t ctx{};
  layout L;
  std::mt19937_64 rng(seed);
  const std::vector<double> p0 = random_vector(static_cast<std::size_t>(L.n), rng, -1, 1);
  std::vector<Param> p(static_cast<std::size_t>(L.n));
  for (std::size_t i = 0; i < p.size(); ++i) p[i] = static_cast<Param>(p0[i]);
  for (ref_tensor& t : L.tensors)
    for (std::int64_t i = 0; i < t.n(); ++i)
      t.x.push_back(static_cast<double>(p[static_cast<std::size_t>(t.begin + i)]));
  adafactor_opt<Param, Master, Master> opt(to_config(k), L.n, L.ranges, ctx);
  opt.init_master(p.data());
  const double lrs[] = {1e-2, 2e-2, 3e-2, 3e-2, 2.5e-2, 2e-2, 1.5e-2, 1e-2, 5e-3, 1e-3};
  const double scales[] = {1.0, 0.5, 1.0, 0.8, 1.0, 1.0, 0.3, 1.0, 1.0, 0.9};
  for (int t = 1; t <= 10; ++t) {
    INFO("after step " << t);
    // Gradients of every magnitude, a few exact zeros (their statistic is eps1 at step 1).
    std::vector<Master> g(static_cast<std::size_t>(L.n));
    for (std::size_t i = 0; i < g.size(); ++i) {
      const double mag = std::pow(10.0, std::uniform_real_distribution<double>(-3, 1)(rng));
      g[i] = static_cast<Master>(std::uniform_real_distribution<double>(-1, 1)(rng) * mag);
      if (i % 41 == 7) g[i] = 0;
    }
    opt.step(p.data(), g.data(), lrs[t - 1], scales[t - 1]);
    for (ref_tensor& r : L.tensors) {
      std::vector<double> gt;
      for (std::int64_t i = 0; i < r.n(); ++i)
        gt.push_back(static_cast<double>(static_cast<Master>(scales[t - 1])) *
                     static_cast<double>(g[static_cast<std::size_t>(r.begin + i)]));
      ref_step(r, gt, lrs[t - 1], t, k);
    }
    const Master* master = opt.master() ? opt.master() : reinterpret_cast<const Master*>(p.data());
    for (std::size_t ti = 0; ti < L.tensors.size(); ++ti) {
      const ref_tensor& r = L.tensors[ti];
      const auto& e = opt.tensors()[ti];
      INFO("tensor " << ti << " (" << r.rows << " x " << r.cols << ")");
      double e_x = max_rel_error(master + r.begin, r.x), e_s = 0, e_m = 0;
      if (r.matrix) {
        // transformers' means: row_i = R_i / cols, col_j = C_j / rows.
        std::vector<double> row(r.R), col(r.C);
        for (double& v : row) v /= static_cast<double>(r.cols);
        for (double& v : col) v /= static_cast<double>(r.rows);
        REQUIRE(e.factored == 1);
        e_s = std::max(max_rel_error(opt.statistics() + e.stat, row),
                       max_rel_error(opt.statistics() + e.stat + r.rows, col));
      } else {
        REQUIRE(e.factored == 0);
        e_s = max_rel_error(opt.statistics() + e.stat, r.V);
      }
      if (k.beta1 > 0) e_m = max_rel_error(opt.exp_avg() + r.begin, r.m);
      UNSCOPED_INFO("parameters " << e_x << " statistics " << e_s << " first moment " << e_m);
      CHECK(e_x < tol);
      CHECK(e_s < tol);
      CHECK(e_m < tol);
    }
    // The padding between the tensors is never touched.
    for (std::int64_t i = 30; i < 33; ++i)
      CHECK(static_cast<double>(p[static_cast<std::size_t>(i)]) ==
            static_cast<double>(static_cast<Param>(p0[static_cast<std::size_t>(i)])));
  }
  CHECK(opt.steps_taken() == 10);
}

}  // namespace

TEST_CASE("optim::adafactor is an optimizer policy with whole-tensor state", "[optim][adafactor]") {
  STATIC_REQUIRE(optim::optimizer_policy<optim::adafactor>);
  // Its group gathers move its float64 sums (parallel::data_parallel).
  STATIC_REQUIRE(
      std::is_same_v<
          optim::gather_value<optim::adafactor_optimizer<float, float, float, ctx_t>, float>::type,
          double>);
  STATIC_REQUIRE(std::is_same_v<optim::adafactor::state<bf16, float, float, ctx_t>,
                                optim::adafactor_optimizer<bf16, float, float, ctx_t>>);
  STATIC_REQUIRE(std::is_same_v<optim::adafactor::config, optim::adafactor_config>);
  STATIC_REQUIRE(sizeof(kernels::adafactor_tensor) == 144);
  CHECK(std::string(optim::adafactor::name) == "adafactor");
  const optim::adafactor_config d{};  // transformers' recommended defaults
  CHECK(d.beta1 == 0.0);
  CHECK(d.clip_threshold == 1.0);
  CHECK(d.decay_rate == -0.8);
  CHECK(d.eps1 == 1e-30);
  CHECK(d.eps2 == 1e-3);
  CHECK(d.weight_decay == 0.0);
  CHECK((!d.scale_parameter && !d.relative_step && !d.warmup_init));
}

TEST_CASE("Adafactor over ten steps equals the paper's algorithm in float64",
          "[optim][adafactor]") {
  ref_config plain;  // the defaults: no first moment, d = 1, no decay
  ten_steps<double, double>(plain, f64_tol, 8101);
  ref_config momentum;  // the first moment and decay, norms excluded
  momentum.beta1 = 0.9;
  momentum.wd = 0.1;
  ten_steps<double, double>(momentum, f64_tol, 8102);
  ref_config clipped;  // d = 0.3 clips every tensor's update at every step
  clipped.d = 0.3;
  clipped.wd = 0.5;
  ten_steps<double, double>(clipped, f64_tol, 8103);
  ref_config relative;  // the paper's Algorithm 4 whole: rho_t and the parameter scale
  relative.scale_parameter = true;
  relative.relative_step = true;
  relative.c = 0.5;
  ten_steps<double, double>(relative, f64_tol, 8104);
  ref_config warmup = relative;
  warmup.warmup_init = true;
  warmup.beta1 = 0.5;
  ten_steps<double, double>(warmup, f64_tol, 8105);
}

TEST_CASE("Adafactor over ten steps equals transformers' float64 trajectory, norm gain undecayed",
          "[optim][adafactor]") {
  // tests/python/fixtures/optimizers_fp64: transformers.optimization.
  // Adafactor (5.25) in float64 with scale_parameter, relative_step and
  // warmup_init off, clip_threshold 1, decay_rate -0.8, eps (1e-30, 1e-3),
  // without (beta1=None) and with (0.9) the first moment, on a 7 x 5
  // matrix, a norm gain of 6 and a 3 x 8 matrix: the matrices in a param
  // group with weight_decay 0.1, the gain in one with 0 (transformers
  // decays every parameter of a group: the ranges' decay flag here), lr
  // changing each step, one exact zero gradient per tensor at step 1. The
  // update's RMS is clipped in about half the (tensor, step) pairs.
  // The arithmetic is transformers' own, in the same order
  // (kernels/detail/adafactor.hpp), and differs in rounding only: torch
  // sums the means and the update's norm in its own order (vectorised
  // partial sums) where tessera sums in float64 element by element, torch
  // takes RMS as norm(u) / sqrt(n) where tessera takes sqrt(sum u^2 / n),
  // and torch's add_(x, alpha=a) is one fused multiply-add where tessera
  // rounds the product first.
  // Tolerance: the house float64 1e-12 relative, element by element, on
  // the parameters and the row, column and vector statistics after every
  // step: a few ulps (2^-53 = 1.1e-16) a step on either side. Worst
  // measured: 1.2e-16 (parameters, beta1=None: 3 of 650 values differ in
  // their last bit), 2.7e-16 (parameters, beta1=0.9: 20 of 650), 4.4e-16
  // (the statistics).
  constexpr double ref_tol = 1e-12;
  const ctx_t ctx{};
  const testing::optimizer_reference fx;
  double worst = 0;
  for (const char* name : {"adafactor", "adafactor_beta1"}) {
    INFO("run " << name);
    const auto& run = fx.run(name);
    const auto& c = run.at("config");
    optim::adafactor_config cfg;
    cfg.beta1 = c.at("beta1").is_null() ? 0.0 : c.at("beta1").get<double>();
    cfg.clip_threshold = c.at("clip_threshold").get<double>();
    cfg.decay_rate = c.at("decay_rate").get<double>();
    cfg.eps1 = c.at("eps").at(0).get<double>();
    cfg.eps2 = c.at("eps").at(1).get<double>();
    cfg.weight_decay = c.at("weight_decay").get<double>();
    REQUIRE(cfg.weight_decay > 0);
    const auto lrs = run.at("lr").get<std::vector<double>>();
    REQUIRE(static_cast<int>(lrs.size()) == fx.steps());
    adafactor_opt<double> opt(cfg, fx.n, fx.ranges, ctx);
    REQUIRE((opt.exp_avg() != nullptr) == !c.at("beta1").is_null());
    std::vector<double> p = fx.params0();
    for (int t = 0; t < fx.steps(); ++t) {
      INFO("after step " << t + 1);
      const std::vector<double> g = fx.grads(t);  // NaN in the padding
      opt.step(p.data(), g.data(), lrs[static_cast<std::size_t>(t)]);
      for (std::size_t k = 0; k < fx.tensors.size(); ++k) {
        const auto& x = fx.tensors[k];
        INFO("tensor " << x.name);
        const auto want = [&](const char* what) {
          return run.at(what).at(t).at(k).get<std::vector<double>>();
        };
        double e = testing::reference_rel_error(p.data() + x.begin, want("params"));
        CHECK(e < ref_tol);
        for (const auto& s : opt.statistics_of(x.begin)) {
          INFO("statistic " << s.role);
          const double es = testing::reference_rel_error(s.data, want(s.role));
          CHECK(es < ref_tol);
          e = std::max(e, es);
        }
        worst = std::max(worst, e);
        for (std::int64_t i = x.end(); i < x.end() + fx.gap; ++i)
          CHECK(p[static_cast<std::size_t>(i)] == fx.padding_value);
      }
    }
  }
  UNSCOPED_INFO("Adafactor against transformers: worst relative error " << worst);
  CHECK(worst < ref_tol);
}

TEST_CASE("Adafactor with float32 master weights and bf16 parameters", "[optim][adafactor]") {
  ref_config k;
  k.beta1 = 0.9;
  k.wd = 0.1;
  ten_steps<float, float>(k, f32_tol, 8201);
  // bf16 parameters: the master weights carry the update (compared above
  // through opt.master()); each parameter is its master weight rounded.
  const ctx_t ctx{};
  layout L;
  std::mt19937_64 rng(8202);
  std::vector<bf16> p(static_cast<std::size_t>(L.n));
  for (auto& x : p) x = bf16(std::uniform_real_distribution<float>(-1, 1)(rng));
  adafactor_opt<bf16, float, float> opt(to_config(k), L.n, L.ranges, ctx);
  opt.init_master(p.data());
  std::vector<float> g(static_cast<std::size_t>(L.n));
  for (int t = 0; t < 3; ++t) {
    for (auto& x : g) x = std::uniform_real_distribution<float>(-1, 1)(rng);
    opt.step(p.data(), g.data(), 1e-2);
    for (const auto& r : L.ranges)
      for (std::int64_t i = r.begin; i < r.end; ++i)
        REQUIRE(p[static_cast<std::size_t>(i)].bits == bf16(opt.master()[i]).bits);
  }
}

TEST_CASE("Adafactor keeps O(rows + cols) state a matrix and counts every byte",
          "[optim][adafactor]") {
  const ctx_t ctx{};
  layout L;
  // Statistics: 6 + 5, 7, 3 + 9, 5000, 1 + 4.
  const std::int64_t stats = 11 + 7 + 12 + 5000 + 5;
  // Rows of the kernels' row numbering: 6, 1, 3, 2 (5000 in rows of 4096), 1.
  const std::int64_t rows = 6 + 1 + 3 + 2 + 1;
  // Sums areas: a matrix's rows + cols + 2 doubles, a vector's 2.
  const std::int64_t sums = (6 + 5 + 2) + 2 + (3 + 9 + 2) + 2 + (1 + 4 + 2);
  const std::size_t segments = 5 * 40, table = 5 * 144, scratch = 3 * 5 * 4 + rows * 8 + sums * 8;
  {
    adafactor_opt<float> opt({}, L.n, L.ranges, ctx);
    CHECK(opt.state_bytes() == stats * 4 + segments + table + scratch);
    CHECK(opt.serialized_bytes() == sizeof(std::int64_t) + stats * 4);
    CHECK(opt.exp_avg() == nullptr);
    CHECK(opt.state_buffers().empty());
  }
  {
    optim::adafactor_config c;
    c.beta1 = 0.9;
    adafactor_opt<bf16, float, float> opt(c, L.n, L.ranges, ctx);
    // + the first moment and the master weights: one float an element each.
    CHECK(opt.state_bytes() == (stats + 2 * L.n) * 4 + segments + table + scratch);
    CHECK(opt.serialized_bytes() == sizeof(std::int64_t) + (stats + 2 * L.n) * 4);
    const auto b = opt.state_buffers();
    REQUIRE(b.size() == 2);
    CHECK(std::string(b[0].role) == "exp_avg");
    CHECK(std::string(b[1].role) == "master");
    const auto s = opt.statistics_of(0);
    REQUIRE(s.size() == 2);
    CHECK((std::string(s[0].role) == "exp_avg_sq_row" && s[0].count == 6 && s[0].along == 0));
    CHECK((std::string(s[1].role) == "exp_avg_sq_col" && s[1].count == 5 && s[1].along == 1));
    const auto v = opt.statistics_of(33);
    REQUIRE(v.size() == 1);
    CHECK((std::string(v[0].role) == "exp_avg_sq" && v[0].count == 7 && v[0].along == -2));
    // From any element of a vector to its end; a matrix's whole from any of its elements.
    const auto v2 = opt.statistics_of(35);
    CHECK((v2[0].count == 5 && v2[0].data == v[0].data + 2));
    CHECK(opt.statistics_of(7)[0].data == s[0].data);
    CHECK_THROWS_WITH(opt.statistics_of(31), Catch::Contains("no tensor holds element 31"));
  }
}

TEST_CASE(
    "Adafactor takes the clip coefficient through the pointer, skips a non-finite one, "
    "and resumes bit for bit",
    "[optim][adafactor]") {
  const ctx_t ctx{};
  layout L;
  optim::adafactor_config c;
  c.beta1 = 0.9;
  c.weight_decay = 0.1;
  std::mt19937_64 rng(8301);
  std::vector<bf16> pa(static_cast<std::size_t>(L.n));
  for (auto& x : pa) x = bf16(std::uniform_real_distribution<float>(-1, 1)(rng));
  std::vector<bf16> pb = pa;
  adafactor_opt<bf16, float, float> a(c, L.n, L.ranges, ctx), b(c, L.n, L.ranges, ctx);
  a.init_master(pa.data());
  b.init_master(pb.data());
  std::vector<float> g(static_cast<std::size_t>(L.n));
  for (int t = 0; t < 3; ++t) {
    for (auto& x : g) x = std::uniform_real_distribution<float>(-1, 1)(rng);
    float coef = 0.37f;
    a.step(pa.data(), g.data(), 1e-2, &coef);  // in the context's memory
    b.step(pb.data(), g.data(), 1e-2, 0.37);   // on the host
    CHECK(same_bits(pa.data(), pb.data(), pa.size()));
    CHECK(same_bits(a.statistics(), b.statistics(), 5035));
  }
  // A non-finite coefficient: nothing written; skipped() takes the count back.
  const std::vector<bf16> before = pa;
  const std::vector<float> stats_before(a.statistics(), a.statistics() + 5035);
  for (float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    a.step(pa.data(), g.data(), 1e-2, &bad);
    a.skipped();
  }
  a.step(pa.data(), g.data(), 1e-2, std::numeric_limits<double>::quiet_NaN());  // not counted
  CHECK(same_bits(pa.data(), before.data(), pa.size()));
  CHECK(same_bits(a.statistics(), stats_before.data(), stats_before.size()));
  CHECK(a.steps_taken() == 3);
  // save and load: the next steps are the same bits.
  byte_writer w;
  a.save(w);
  REQUIRE(w.bytes.size() == a.serialized_bytes());
  adafactor_opt<bf16, float, float> r(c, L.n, L.ranges, ctx);
  r.load(w.bytes.data());
  CHECK(r.steps_taken() == 3);
  std::vector<bf16> pr = pa;
  for (int t = 0; t < 2; ++t) {
    for (auto& x : g) x = std::uniform_real_distribution<float>(-1, 1)(rng);
    a.step(pa.data(), g.data(), 2e-2);
    r.step(pr.data(), g.data(), 2e-2);
  }
  CHECK(same_bits(pa.data(), pr.data(), pa.size()));
  CHECK(same_bits(a.master(), r.master(), static_cast<std::size_t>(L.n)));
  CHECK(same_bits(a.exp_avg(), r.exp_avg(), static_cast<std::size_t>(L.n)));
  CHECK(same_bits(a.statistics(), r.statistics(), 5035));
}

TEST_CASE("Adafactor gives the same bits on 1 and 2 threads", "[optim][adafactor]") {
  layout L;
  optim::adafactor_config c;
  c.beta1 = 0.9;
  c.scale_parameter = true;
  std::mt19937_64 rng(8401);
  const auto p0 = random_vector(static_cast<std::size_t>(L.n), rng, -1, 1);
  const auto g = random_vector(static_cast<std::size_t>(L.n), rng, -1, 1);
  std::vector<double> out[2];
  for (int threads : {1, 2}) {
    ctx_t ctx{};
    ctx.threads = threads;
    ctx.apply_threads();
    adafactor_opt<double> opt(c, L.n, L.ranges, ctx);
    out[threads - 1] = p0;
    for (int t = 0; t < 3; ++t) opt.step(out[threads - 1].data(), g.data(), 1e-2);
  }
  CHECK(same_bits(out[0].data(), out[1].data(), out[0].size()));
}

TEST_CASE("Adafactor refuses bad hyper-parameters and pieces of tensors, naming them",
          "[optim][adafactor][errors]") {
  const ctx_t ctx{};
  layout L;
  struct bad_case {
    optim::adafactor_config cfg;
    const char* names;
  };
  std::vector<bad_case> cases;
  auto add = [&](auto set, const char* names) {
    optim::adafactor_config c;
    set(c);
    cases.push_back({c, names});
  };
  add([](auto& c) { c.beta1 = 1.0; }, "beta1=1");
  add([](auto& c) { c.beta1 = -0.5; }, "beta1=-0.5");
  add([](auto& c) { c.clip_threshold = 0; }, "clip_threshold=0");
  add([](auto& c) { c.decay_rate = 0.8; }, "decay_rate=0.8");
  add([](auto& c) { c.decay_rate = -1.5; }, "decay_rate=-1.5");
  add([](auto& c) { c.eps1 = 0; }, "eps1=0");
  add([](auto& c) { c.eps2 = -1; }, "eps2=-1");
  add([](auto& c) { c.weight_decay = std::nan(""); }, "weight_decay=nan");
  add([](auto& c) { c.warmup_init = true; }, "warmup_init shapes the relative step");
  for (const auto& c : cases) {
    INFO(c.names);
    CHECK_THROWS_AS(c.cfg.validate(), config_error);
    CHECK_THROWS_WITH(c.cfg.validate(), Catch::Contains(c.names));
    CHECK_THROWS_WITH((adafactor_opt<float>(c.cfg, L.n, L.ranges, ctx)), Catch::Contains(c.names));
  }
  // A range without its shape, and one beyond its tensor.
  std::vector<optim::param_range> shapeless{{0, 30, true}};
  CHECK_THROWS_WITH((adafactor_opt<float>({}, 30, shapeless, ctx)),
                    Catch::Contains("[0, 30)") && Catch::Contains("not a tensor of a known shape"));
  std::vector<optim::param_range> beyond = {L.ranges[0]};
  beyond[0].first = 20;
  CHECK_THROWS_WITH((adafactor_opt<float>({}, 30, beyond, ctx)),
                    Catch::Contains("6 x 5") && Catch::Contains("from its element 20"));
  // A piece of a tensor (as a ZeRO chunk cuts one) is built, and its step
  // refused until the optimizer has its dp group; a tp shard likewise.
  std::vector<optim::param_range> piece = {L.ranges[0]};
  piece[0].end = 20;
  adafactor_opt<float> p(optim::adafactor_config{}, 30, piece, ctx);
  std::vector<float> x(30, 1.0f), g(30, 0.5f);
  CHECK_THROWS_WITH(p.step(x.data(), g.data(), 1e-2),
                    Catch::Contains("piece of a tensor") && Catch::Contains("gather_pieces_over"));
  std::vector<optim::param_range> shard = {L.ranges[0]};
  shard[0].split = 0;
  shard[0].full_rows = 12;
  shard[0].full_cols = 5;
  adafactor_opt<float> q(optim::adafactor_config{}, 30, shard, ctx);
  CHECK_THROWS_WITH(
      q.step(x.data(), g.data(), 1e-2),
      Catch::Contains("split over tensor parallelism") && Catch::Contains("gather_over"));
}

}  // namespace test_optim_adafactor
