// Tests include/tessera/optim/muon.hpp (the optim::muon policy and
// muon_optimizer on the host context) and kernels/muon.hpp against
// torch.optim.Muon and torch.optim.AdamW in float64: muon_fixture.hpp,
// written by make_muon_fixture.py beside this file (no torch at run time).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "muon_fixture.hpp"
#include "tessera/kernels/context.hpp"
#include "tessera/kernels/muon.hpp"
#include "tessera/optim/muon.hpp"

namespace test_optim_muon {

using namespace tessera;

namespace {

using ctx_t = kernels::host_context;
template <class Param, class Grad = Param, class Master = Param>
using muon_opt = optim::muon_optimizer<Param, Grad, Master, ctx_t>;

// Tolerance against torch in float64 (STYLE.md, "Tests"): ten steps of
// five Newton-Schulz iterations, each a handful of BLAS products whose sums
// run in another order than torch's; the iterate stays of order 1 and every
// product adds at most a few ulps (2^-52) per term of 20, so the
// parameters (moved by lr of order 1e-2 a step) agree to a few 1e-15. 1e-12
// is the bound and leaves a margin of a hundred.
constexpr double torch_tol = 1e-12;

// The fixture's tensors in the flat buffer, as make_muon_fixture.py lists
// them: name, rows x cols (a vector: 1 x n), Muon's (a block's matrix) or
// AdamW's, decay.
struct tensor_spec {
  const char* name;
  std::int64_t rows, cols;
  bool hidden, decay;
  int dims;
};
constexpr std::int64_t H = 8, F = 20, V = 12;
const std::vector<tensor_spec> specs{
    {"embedding", V, H, false, true, 2}, {"attn_norm", 1, H, false, false, 1},
    {"wq", H, H, true, true, 2},         {"w_gate", F, H, true, true, 2},
    {"w_down", H, F, true, true, 2},     {"final_norm", 1, H, false, false, 1},
    {"lm_head", V, H, false, true, 2}};

std::vector<optim::param_range> fixture_ranges() {
  std::vector<optim::param_range> out;
  std::int64_t at = 0;
  for (const tensor_spec& s : specs) {
    optim::param_range r;
    r.begin = at;
    r.end = at + s.rows * s.cols;
    r.decay = s.decay;
    r.dims = s.dims;
    r.rows = s.rows;
    r.cols = s.cols;
    r.hidden = s.hidden;
    r.full_rows = s.rows;
    r.full_cols = s.cols;
    out.push_back(r);
    at = r.end;
  }
  return out;
}
constexpr std::int64_t fixture_n = 2 * V * H + 2 * H + H * H + 2 * F * H;

// The fixture's configurations (make_muon_fixture.py CONFIGS).
optim::muon_config defaults_config() {
  optim::muon_config c;  // torch's defaults: momentum 0.95, Nesterov, 5 steps, original
  c.weight_decay = 0.1;
  c.adamw_lr_ratio = 0.5;  // AdamW lr 0.01 beside Muon's 0.02
  c.adamw_beta1 = 0.9;
  c.adamw_beta2 = 0.95;
  c.adamw_eps = 1e-8;
  return c;
}
optim::muon_config plain_rms_config() {
  optim::muon_config c;
  c.momentum = 0.9;
  c.nesterov = false;
  c.ns_steps = 3;
  c.adjust = optim::muon_adjust::match_rms_adamw;
  c.weight_decay = 0.05;
  c.adamw_lr_ratio = 1.0;
  c.adamw_beta1 = 0.8;
  c.adamw_beta2 = 0.99;
  c.adamw_eps = 1e-6;
  return c;
}

double max_abs_error(const double* got, const double* want, std::int64_t n) {
  double worst = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    if (std::isnan(got[i])) return INFINITY;
    worst = std::max(worst, std::abs(got[i] - want[i]));
  }
  return worst;
}

// Runs ten steps of the fixture's gradients from its initial parameters.
std::vector<double> run_fixture(muon_opt<double>& opt, double lr) {
  std::vector<double> p(muon_fixture::initial, muon_fixture::initial + fixture_n);
  opt.init_master(p.data());
  for (int s = 0; s < 10; ++s) opt.step(p.data(), muon_fixture::grads + s * fixture_n, lr);
  return p;
}

// Collects what save() writes.
struct byte_writer {
  std::vector<char> bytes;
  void write(const void* p, std::size_t n) {
    const char* c = static_cast<const char*>(p);
    bytes.insert(bytes.end(), c, c + n);
  }
};

}  // namespace

TEST_CASE("optim::muon is an optimizer policy with torch's defaults", "[optim][muon]") {
  STATIC_REQUIRE(optim::optimizer_policy<optim::muon>);
  STATIC_REQUIRE(std::is_same_v<optim::muon::state<bf16, float, float, ctx_t>,
                                optim::muon_optimizer<bf16, float, float, ctx_t>>);
  const optim::muon_config d{};
  CHECK(d.momentum == 0.95);  // torch.optim.Muon's defaults
  CHECK(d.nesterov);
  CHECK(d.ns_steps == 5);
  CHECK(d.ns_a == 3.4445);
  CHECK(d.ns_b == -4.7750);
  CHECK(d.ns_c == 2.0315);
  CHECK(d.eps == 1e-7);
  CHECK(d.weight_decay == 0.1);
  CHECK(d.adjust == optim::muon_adjust::original);
  // torch's _adjust_lr: sqrt(max(1, A / B)) and 0.2 sqrt(max(A, B)).
  CHECK(d.adjusted_lr(0.02, 20, 5) == 0.02 * 2.0);
  CHECK(d.adjusted_lr(0.02, 5, 20) == 0.02);
  optim::muon_config m = d;
  m.adjust = optim::muon_adjust::match_rms_adamw;
  CHECK(m.adjusted_lr(0.02, 16, 64) == 0.02 * 0.2 * 8.0);
  CHECK(optim::parse_muon_adjust("match_rms_adamw") == optim::muon_adjust::match_rms_adamw);
  CHECK_THROWS_WITH(optim::parse_muon_adjust("spectral"),
                    Catch::Contains("valid: original, match_rms_adamw"));
}

TEST_CASE("Muon over ten steps equals torch.optim.Muon and AdamW in float64", "[optim][muon]") {
  const ctx_t ctx{};
  struct run_case {
    const char* name;
    optim::muon_config cfg;
    double lr;
    const double *params, *momentum, *exp_avg_sq;
  };
  const run_case cases[] = {{"defaults", defaults_config(), 0.02, muon_fixture::defaults_params,
                             muon_fixture::defaults_momentum, muon_fixture::defaults_exp_avg_sq},
                            {"plain_rms", plain_rms_config(), 0.01, muon_fixture::plain_rms_params,
                             muon_fixture::plain_rms_momentum, muon_fixture::plain_rms_exp_avg_sq}};
  for (const run_case& c : cases) {
    INFO(c.name);
    muon_opt<double> opt(c.cfg, fixture_n, fixture_ranges(), ctx);
    REQUIRE(opt.matrices().size() == 3);
    CHECK(opt.adamw_elements() == 2 * V * H + 2 * H);
    const std::vector<double> p = run_fixture(opt, c.lr);
    const double ep = max_abs_error(p.data(), c.params, fixture_n);
    const double em = max_abs_error(opt.momentum(), c.momentum, fixture_n);
    const double ev = max_abs_error(opt.exp_avg_sq(), c.exp_avg_sq, opt.adamw_elements());
    WARN(c.name << ": worst |tessera - torch| params " << ep << ", momentum/exp_avg " << em
                << ", exp_avg_sq " << ev);
    CHECK(ep < torch_tol);
    CHECK(em < torch_tol);
    CHECK(ev < torch_tol);
    // The parameters moved by far more than the tolerance (the test can fail).
    CHECK(max_abs_error(p.data(), muon_fixture::initial, fixture_n) > 1e-2);
  }
}

TEST_CASE("Muon's decay spares the norm gains, and its matrices differ from AdamW's update",
          "[optim][muon]") {
  const ctx_t ctx{};
  // Zero gradients: only the decoupled decay moves a parameter, and only
  // where its range decays (the norm gains do not).
  optim::muon_config c = defaults_config();
  muon_opt<double> opt(c, fixture_n, fixture_ranges(), ctx);
  std::vector<double> p(muon_fixture::initial, muon_fixture::initial + fixture_n);
  const std::vector<double> g(fixture_n, 0.0);
  opt.init_master(p.data());
  opt.step(p.data(), g.data(), 0.02);
  const auto ranges = fixture_ranges();
  for (std::size_t k = 0; k < ranges.size(); ++k) {
    INFO(specs[k].name);
    for (std::int64_t i = ranges[k].begin; i < ranges[k].end; ++i) {
      const double want =
          specs[k].decay ? muon_fixture::initial[i] * (1 - 0.02 * 0.1) : muon_fixture::initial[i];
      // AdamW's tensors: lr * 0.5 decay, and m = v = 0 move nothing more.
      const double adamw_want =
          specs[k].decay ? muon_fixture::initial[i] - 0.01 * 0.1 * muon_fixture::initial[i]
                         : muon_fixture::initial[i];
      CHECK(p[i] == Approx(specs[k].hidden ? want : adamw_want).epsilon(1e-15));
    }
  }
}

TEST_CASE("Newton-Schulz equals the float64 iteration, wide and tall", "[optim][muon]") {
  const ctx_t ctx{};
  // Wide 5 x 9: the iteration as is.
  std::vector<double> w(muon_fixture::ns_wide_in, muon_fixture::ns_wide_in + 45);
  std::vector<double> scratch(kernels::muon_ns_scratch<double>(5, 9), NAN);
  kernels::muon_newton_schulz(ctx, w.data(), 5, 9, scratch.data(), 3.4445, -4.7750, 2.0315, 5,
                              1e-7);
  const double ew = max_abs_error(w.data(), muon_fixture::ns_wide_out, 45);
  // Tall 9 x 5: muon_assemble lays W out transposed, muon_apply reads it back.
  kernels::muon_matrix t;
  t.begin = 0;
  t.end = 45;
  t.rows = t.full_rows = 9;
  t.cols = t.full_cols = 5;
  REQUIRE(t.transposed());
  std::vector<double> wide(45, NAN);
  kernels::muon_assemble(ctx, wide.data(), muon_fixture::ns_tall_in, t);
  kernels::muon_newton_schulz(ctx, wide.data(), 5, 9, scratch.data(), 3.4445, -4.7750, 2.0315, 5,
                              1e-7);
  std::vector<double> p(45, 0.0);  // p = 0 - 1 * o: the iteration's output, negated
  kernels::muon_apply(ctx, p.data(), static_cast<double*>(nullptr),
                      static_cast<const double*>(wide.data()), t, 1.0, -1.0,
                      static_cast<const double*>(nullptr));
  const double et = max_abs_error(p.data(), muon_fixture::ns_tall_out, 45);
  WARN("Newton-Schulz worst |tessera - float64 torch|: wide " << ew << ", tall " << et);
  CHECK(ew < 1e-13);
  CHECK(et < 1e-13);
  // The output is near-orthogonal (singular values in about (0.7, 1.2)),
  // far from the input: the comparison can fail.
  CHECK(max_abs_error(w.data(), muon_fixture::ns_wide_in, 45) > 0.1);
}

TEST_CASE("Muon with float32 master weights under bf16 parameters follows float64",
          "[optim][muon]") {
  const ctx_t ctx{};
  muon_opt<bf16, float, float> opt(defaults_config(), fixture_n, fixture_ranges(), ctx);
  std::vector<bf16> p(fixture_n);
  for (std::int64_t i = 0; i < fixture_n; ++i) p[i] = to<bf16>(muon_fixture::initial[i]);
  std::vector<float> g(fixture_n);
  opt.init_master(p.data());
  for (int s = 0; s < 10; ++s) {
    for (std::int64_t i = 0; i < fixture_n; ++i)
      g[i] = static_cast<float>(muon_fixture::grads[s * fixture_n + i]);
    opt.step(p.data(), g.data(), 0.02);
  }
  // bf16 initial weights (2^-9 relative) and float32 arithmetic: the
  // master weights stay within 1e-2 of torch's float64 run; each parameter is
  // its master rounded to bf16.
  double worst = 0;
  for (std::int64_t i = 0; i < fixture_n; ++i) {
    worst = std::max(worst, std::abs(double(opt.master()[i]) - muon_fixture::defaults_params[i]));
    CHECK(p[i].bits == to<bf16>(opt.master()[i]).bits);
  }
  WARN("float32 master weights: worst |tessera - torch float64| " << worst);
  CHECK(worst < 1e-2);
}

TEST_CASE("Muon saves and loads bit for bit, skips a non-finite scale, refuses split tensors",
          "[optim][muon]") {
  const ctx_t ctx{};
  const auto cfg = defaults_config();
  muon_opt<double> a(cfg, fixture_n, fixture_ranges(), ctx);
  std::vector<double> pa(muon_fixture::initial, muon_fixture::initial + fixture_n);
  a.init_master(pa.data());
  for (int s = 0; s < 4; ++s) a.step(pa.data(), muon_fixture::grads + s * fixture_n, 0.02);
  byte_writer w;
  a.save(w);
  CHECK(w.bytes.size() == a.serialized_bytes());
  muon_opt<double> b(cfg, fixture_n, fixture_ranges(), ctx);
  b.load(w.bytes.data());
  CHECK(b.steps_taken() == 4);
  std::vector<double> pb = pa;
  // A non-finite host scale skips the step: nothing written, not counted.
  const std::vector<double> before = pa;
  a.step(pa.data(), muon_fixture::grads + 4 * fixture_n, 0.02, NAN);
  CHECK(a.steps_taken() == 4);
  CHECK(pa == before);
  for (int s = 4; s < 10; ++s) {
    a.step(pa.data(), muon_fixture::grads + s * fixture_n, 0.02);
    b.step(pb.data(), muon_fixture::grads + s * fixture_n, 0.02);
  }
  CHECK(std::memcmp(pa.data(), pb.data(), pa.size() * sizeof(double)) == 0);
  CHECK(std::memcmp(a.momentum(), b.momentum(), fixture_n * sizeof(double)) == 0);
  // The checkpoint roles: a matrix's momentum, another tensor's AdamW moments.
  const auto ranges = fixture_ranges();
  CHECK(std::string(a.statistics_of(ranges[2].begin)[0].role) == "momentum_buffer");
  const auto emb = a.statistics_of(ranges[0].begin);
  REQUIRE(emb.size() == 2);
  CHECK(std::string(emb[0].role) == "exp_avg");
  CHECK(std::string(emb[1].role) == "exp_avg_sq");
  CHECK_THROWS_WITH(a.statistics_of(-1), Catch::Contains("no tensor holds element -1"));
  // An element inside a tensor: its state from there on (a ZeRO piece's).
  CHECK(a.statistics_of(ranges[2].begin + 5)[0].data ==
        a.statistics_of(ranges[2].begin)[0].data + 5);
  // State bytes by hand: the momentum (n doubles), AdamW's second moment
  // (its elements), the two segment tables (40 and 48 bytes a tensor), the
  // scratch of the largest matrix (20 x 8: shard, W, W's partner, two 8 x 8
  // Gram matrices, one double, 8-byte aligned already).
  const std::size_t scratch = (160 + 160 + 160 + 2 * 64 + 1) * sizeof(double);
  CHECK(a.scratch_bytes() == scratch);
  CHECK(a.state_bytes() == fixture_n * 8 + (2 * V * H + 2 * H) * 8 + 7 * 40 + 7 * 48 + scratch);
  // A piece of a matrix (a ZeRO chunk boundary inside it) needs the dp
  // group that gathers it whole before a step; a range beyond its tensor is refused.
  auto split = ranges;
  split[2].end -= 3;
  muon_opt<double> piece(cfg, fixture_n, split, ctx);
  std::vector<double> pp(muon_fixture::initial, muon_fixture::initial + fixture_n);
  piece.init_master(pp.data());
  CHECK_THROWS_WITH(piece.step(pp.data(), muon_fixture::grads, 0.02),
                    Catch::Contains("piece of a matrix") && Catch::Contains("gather_pieces_over"));
  auto beyond = ranges;
  beyond[2].first = 5;
  CHECK_THROWS_WITH(muon_opt<double>(cfg, fixture_n, beyond, ctx),
                    Catch::Contains("not a tensor of a known shape or a piece of one"));
  // A matrix split over tp needs its group before a step.
  auto tp = ranges;
  tp[2].split = 0;
  tp[2].full_rows = 2 * H;
  muon_opt<double> c(cfg, fixture_n, tp, ctx);
  std::vector<double> pc(muon_fixture::initial, muon_fixture::initial + fixture_n);
  c.init_master(pc.data());
  CHECK_THROWS_WITH(
      c.step(pc.data(), muon_fixture::grads, 0.02),
      Catch::Contains("split over tensor parallelism") && Catch::Contains("gather_over"));
  optim::muon_config bad = cfg;
  bad.momentum = 1.0;
  CHECK_THROWS_WITH(muon_opt<double>(bad, fixture_n, ranges, ctx),
                    Catch::Contains("momentum=1 must be in [0, 1)"));
}

}  // namespace test_optim_muon
