// Muon's CUDA kernels (include/tessera/kernels/cuda/muon.cuh: the fused
// momentum/AdamW pass, Nesterov, assemble, normalise, apply), their own
// bodies run by the block emulator (tests/support/cuda_emulator.hpp)
// through the launch functions the GPU path calls, composed into Muon steps
// as the GPU's muon_optimizer composes them (the Newton-Schulz products on
// the host BLAS in float32 here, cuBLASLt there), against the host
// optimizer optim::muon_optimizer<Param, Grad, float> over the same tables:
// three steps with a host scale, a skipped step (device coefficient NaN),
// and a step with a device coefficient. Tables: the embedding, norm gains,
// a square, a tall and a wide matrix (torch's fixture shapes), and a
// matrix split over a tp group of 4 by rows with two replicas a shard
// (key/value heads) and one split by columns, each gathered by hand.
//
// Bit for bit (memcmp of the parameters, master weights, momentum and
// AdamW's second moment): every element-wise operation is the shared
// arithmetic of kernels/detail/muon.hpp and adamw.hpp on the same float32
// inputs, the norm's divisor is rounded alike, and tests/kernels builds
// without FMA contraction (tests/CMakeLists.txt).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <tessera/kernels/cuda/muon.cuh>
#include <tessera/kernels/muon.hpp>
#include <tessera/optim/muon.hpp>

#include "../support/cuda_emulator.hpp"

namespace test_kernels_emulated_muon {

namespace kc = tessera::kernels::cuda;
namespace hk = tessera::kernels;
namespace optim = tessera::optim;
using tessera::bf16;
using tessera::to;
using namespace tessera::testing;

namespace {

using ctx_t = hk::host_context;

// The tensors: name, rows x cols (this rank's shard), hidden, dims, and
// for a split matrix its split, whole shape, shard and replicas.
std::vector<optim::param_range> table() {
  struct spec {
    std::int64_t rows, cols;
    bool hidden, decay;
    int dims, split = -1, shard = 0, replicas = 1;
    std::int64_t full_rows = 0, full_cols = 0;
  };
  const std::vector<spec> specs = {
      {12, 8, false, true, 2},               // embedding
      {1, 8, false, false, 1},               // a norm gain
      {8, 8, true, true, 2},                 // wq
      {20, 8, true, true, 2},                // w_gate: tall
      {8, 20, true, true, 2},                // w_down: wide
      {4, 8, true, true, 2, 0, 1, 2, 8, 8},  // wk's shard 1 of 2, tp 4 (two replicas)
      {8, 5, true, true, 2, 1, 2, 1, 8, 20}  // wo's column shard 2 of 4
  };
  std::vector<optim::param_range> out;
  std::int64_t at = 3;  // a gap before the first tensor
  for (const spec& s : specs) {
    optim::param_range r;
    r.begin = at;
    r.end = at + s.rows * s.cols;
    r.decay = s.decay;
    r.dims = s.dims;
    r.rows = s.rows;
    r.cols = s.cols;
    r.hidden = s.hidden;
    r.split = s.split;
    r.shard = s.shard;
    r.replicas = s.replicas;
    r.full_rows = s.split >= 0 ? s.full_rows : s.rows;
    r.full_cols = s.split >= 0 ? s.full_cols : s.cols;
    out.push_back(r);
    at = r.end + 5;  // gaps between tensors
  }
  return out;
}

template <class T>
bool same_bits(const T* a, const T* b, std::size_t n) {
  return std::memcmp(a, b, n * sizeof(T)) == 0;
}

// The other ranks of the tp group, as a deterministic function of the
// rank: rank r's shard is this rank's values plus r (so the gather puts
// each in its place, and a wrong place changes the result).
std::function<void(const float*, float*, std::int64_t)> fake_gather(int tp, int me) {
  return [tp, me](const float* in, float* out, std::int64_t n) {
    for (int r = 0; r < tp; ++r)
      for (std::int64_t j = 0; j < n; ++j)
        out[r * n + j] = r == me ? in[j] : in[j] + 0.125f * static_cast<float>(r - me);
  };
}

// One emulated step, as muon_optimizer::launch composes the GPU's kernels.
template <class Param, class Grad>
void emulated_step(cuda_emulator& em, const optim::muon_optimizer<Param, Grad, float, ctx_t>& opt,
                   std::vector<Param>& params, std::vector<float>& master, std::vector<float>& m,
                   std::vector<float>& v, const std::vector<Grad>& grads, double lr,
                   const float* d_clip, double grad_scale, std::vector<std::string>& launched) {
  const optim::muon_config& c = opt.config();
  const double td = static_cast<double>(opt.steps_taken());  // after the host's begin_step
  const hk::detail::muon_step_params<float> s{
      static_cast<float>(lr),
      static_cast<float>(c.momentum),
      static_cast<float>(c.weight_decay),
      static_cast<float>(grad_scale),
      c.nesterov,
      {static_cast<float>(lr * c.adamw_lr_ratio), static_cast<float>(c.adamw_beta1),
       static_cast<float>(c.adamw_beta2), static_cast<float>(c.adamw_eps),
       static_cast<float>(c.weight_decay), static_cast<float>(1.0 - std::pow(c.adamw_beta1, td)),
       static_cast<float>(1.0 - std::pow(c.adamw_beta2, td)), static_cast<float>(grad_scale)}};
  const emulator_launcher l{&em, std::int64_t(1) << 24, &launched};
  float* d_master = std::is_same_v<Param, float> ? nullptr : master.data();
  const auto& segs = opt.muon_segments();
  kc::muon_momentum_step_launch(l, params.data(), d_master, m.data(), v.data(), grads.data(),
                                static_cast<std::int64_t>(m.size()), segs.data(),
                                static_cast<int>(segs.size()), s, d_clip);
  const ctx_t ctx{};
  for (const hk::muon_matrix& t : opt.matrices()) {
    std::vector<float> shard(t.local()), gathered(t.gathered()), wide(t.whole());
    std::vector<float> ns(hk::muon_ns_scratch<float>(t.wide_rows(), t.wide_cols()));
    em.output(shard);
    em.output(gathered);
    em.output(wide);
    kc::muon_nesterov_launch(l, shard.data(), static_cast<const float*>(m.data()), grads.data(), t,
                             s, d_clip);
    const bool gather = t.split >= 0 && t.shards > 1;
    if (gather)
      fake_gather(t.shards, t.shard * t.replicas)(shard.data(), gathered.data(), t.local());
    kc::muon_assemble_launch(l, wide.data(), gather ? gathered.data() : shard.data(), t);
    double ss = 0;
    hk::grad_sum_squares(ctx, &ss, wide.data(), t.whole());
    std::vector<double> d_ss{ss};
    em.input(d_ss);
    kc::muon_normalise_launch(l, wide.data(), t.whole(), d_ss.data(), c.eps);
    hk::muon_ns_iterate(ctx, wide.data(), t.wide_rows(), t.wide_cols(), ns.data(), c.ns_a, c.ns_b,
                        c.ns_c, c.ns_steps);
    kc::muon_apply_launch(l, params.data(), d_master, static_cast<const float*>(wide.data()), t,
                          static_cast<float>(1.0 - lr * c.weight_decay),
                          static_cast<float>(c.adjusted_lr(lr, t.full_rows, t.full_cols)), d_clip);
    for (int k = 0; k < 4; ++k) em.pop_region();  // shard, gathered, wide, the norm
  }
}

template <class Param, class Grad>
void follow_host(const optim::muon_config& cfg, std::uint64_t seed) {
  INFO(tessera::dtype_name<Param>() << " params, " << tessera::dtype_name<Grad>() << " grads");
  const ctx_t ctx{};
  const auto ranges = table();
  const std::int64_t n = ranges.back().end + 4;
  optim::muon_optimizer<Param, Grad, float, ctx_t> host(cfg, n, ranges, ctx);
  optim::group_gather<float> g;
  g.size = 4;
  // The host's gather sees the same other ranks; wk's shard index is 1 of
  // 2 distinct shards (tp rank 2), wo's 2 of 4 (tp rank 2).
  g.all_gather = fake_gather(4, 2);
  host.gather_over(g);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, 0.5f);
  std::vector<Param> p(static_cast<std::size_t>(n));
  for (auto& x : p) x = to<Param>(nd(rng));
  host.init_master(p.data());
  std::vector<Param> ep = p;
  std::vector<float> em_master(static_cast<std::size_t>(n), 0.f), em_m(static_cast<std::size_t>(n));
  std::vector<float> em_v(static_cast<std::size_t>(host.adamw_elements()), 0.f);
  for (std::int64_t i = 0; i < n; ++i) em_master[static_cast<std::size_t>(i)] = to<float>(p[i]);
  // Elements in no tensor: the host's master weights stay 0 there (init_master
  // copies only owned elements), the momentum 0.
  for (std::int64_t i = 0; i < n; ++i) {
    bool owned = false;
    for (const auto& r : ranges) owned = owned || (i >= r.begin && i < r.end);
    if (!owned) em_master[static_cast<std::size_t>(i)] = 0.f;
  }
  cuda_emulator em(seed);
  em.output(ep);
  em.output(em_master);
  em.output(em_m);
  em.output(em_v);
  const std::vector<tessera::kernels::muon_segment> segs = host.muon_segments();
  std::vector<std::string> launched;
  std::vector<float> clip{0.75f};
  em.input(clip);
  for (int step = 0; step < 5; ++step) {
    INFO("step " << step);
    std::vector<Grad> grads(static_cast<std::size_t>(n));
    for (auto& x : grads) x = to<Grad>(nd(rng));
    em.input(grads);
    em.input(host.muon_segments());
    const double lr = 0.02 * (1 + step);
    if (step == 3) {  // the device coefficient is NaN: nothing written on either side
      clip[0] = std::numeric_limits<float>::quiet_NaN();
      const std::vector<Param> before = ep;
      host.step(p.data(), grads.data(), lr, clip.data());
      emulated_step(em, host, ep, em_master, em_m, em_v, grads, lr, clip.data(), 1.0, launched);
      host.skipped();
      CHECK(same_bits(ep.data(), before.data(), ep.size()));
      clip[0] = 0.75f;
    } else if (step == 4) {
      host.step(p.data(), grads.data(), lr, clip.data());
      emulated_step(em, host, ep, em_master, em_m, em_v, grads, lr, clip.data(), 1.0, launched);
    } else {
      host.step(p.data(), grads.data(), lr, 0.5 + 0.25 * step);
      emulated_step(em, host, ep, em_master, em_m, em_v, grads, lr, nullptr, 0.5 + 0.25 * step,
                    launched);
    }
    em.pop_region();
    em.pop_region();
    CHECK(same_bits(ep.data(), p.data(), p.size()));
    CHECK(same_bits(em_m.data(), host.momentum(), em_m.size()));
    CHECK(same_bits(em_v.data(), host.exp_avg_sq(), em_v.size()));
    if (host.master() != nullptr) CHECK(same_bits(em_master.data(), host.master(), em_m.size()));
  }
  // Every kernel ran; the split matrices' updates moved them.
  for (const char* k :
       {"muon_momentum", "muon_nesterov", "muon_assemble", "muon_normalise", "muon_apply"})
    CHECK(std::count(launched.begin(), launched.end(), std::string(k)) > 0);
}

}  // namespace

TEST_CASE("emulated cuda muon kernels follow the host muon_optimizer bit for bit",
          "[kernels][emulated][optimizer][muon]") {
  optim::muon_config c;
  c.adamw_lr_ratio = 0.5;
  follow_host<float, float>(c, 1);
  follow_host<bf16, float>(c, 2);
  follow_host<bf16, bf16>(c, 3);
  optim::muon_config plain = c;
  plain.nesterov = false;
  plain.ns_steps = 3;
  plain.adjust = optim::muon_adjust::match_rms_adamw;
  follow_host<float, float>(plain, 4);
}

// A ZeRO piece of a matrix (muon_matrix::first): the Nesterov and update
// kernels touch exactly the piece's elements, as the host's do.
TEST_CASE("emulated cuda muon kernels on a ZeRO piece of a matrix equal the host's bit for bit",
          "[kernels][emulated][optimizer][muon]") {
  const ctx_t ctx{};
  hk::muon_matrix t;
  t.rows = t.full_rows = 20;  // tall: W is its transpose
  t.cols = t.full_cols = 8;
  t.first = 37;  // elements [37, 37 + 61) of the 160
  t.begin = 5;
  t.end = 5 + 61;
  t.param_shift = 11;
  t.grad_shift = -3;
  std::mt19937_64 rng(9);
  std::normal_distribution<float> nd(0.f, 1.f);
  auto random = [&](std::size_t n) {
    std::vector<float> v(n);
    for (auto& x : v) x = nd(rng);
    return v;
  };
  const std::vector<float> m = random(80), g = random(80), wide = random(160);
  const std::vector<float> p0 = random(90);
  hk::detail::muon_step_params<float> s{};
  s.momentum = 0.95f;
  s.grad_scale = 0.5f;
  s.nesterov = true;
  std::vector<float> host_u(static_cast<std::size_t>(t.owned()), NAN), emu_u = host_u;
  hk::muon_nesterov(ctx, host_u.data(), m.data(), g.data(), t, s,
                    static_cast<const float*>(nullptr));
  std::vector<float> host_p = p0, emu_p = p0;
  hk::muon_apply(ctx, host_p.data(), static_cast<float*>(nullptr), wide.data(), t, 0.99f, 0.03f,
                 static_cast<const float*>(nullptr));
  cuda_emulator em(9);
  em.input(m);
  em.input(g);
  em.input(wide);
  em.output(emu_u);
  em.output(emu_p);
  std::vector<std::string> launched;
  const emulator_launcher l{&em, std::int64_t(1) << 24, &launched};
  kc::muon_nesterov_launch(l, emu_u.data(), m.data(), g.data(), t, s, nullptr);
  kc::muon_apply_launch(l, emu_p.data(), static_cast<float*>(nullptr), wide.data(), t, 0.99f, 0.03f,
                        nullptr);
  CHECK(same_bits(emu_u.data(), host_u.data(), emu_u.size()));
  CHECK(same_bits(emu_p.data(), host_p.data(), emu_p.size()));
  // Only the piece's parameters moved: [begin + param_shift, end + param_shift).
  for (std::size_t i = 0; i < p0.size(); ++i) {
    const bool in = i >= 16 && i < 77;
    INFO("parameter " << i);
    CHECK((emu_p[i] != p0[i]) == in);
  }
  CHECK(launched == std::vector<std::string>{"muon_nesterov", "muon_apply"});
}

TEST_CASE("emulated cuda muon launches: no work and bad arguments",
          "[kernels][emulated][optimizer][muon]") {
  cuda_emulator em(7);
  std::vector<std::string> launched;
  const emulator_launcher l{&em, std::int64_t(1) << 24, &launched};
  std::vector<float> p(4), m(4), v(4), g(4);
  const hk::detail::muon_step_params<float> s{};
  kc::muon_momentum_step_launch(l, p.data(), static_cast<float*>(nullptr), m.data(), v.data(),
                                static_cast<const float*>(g.data()), 0,
                                static_cast<const hk::muon_segment*>(nullptr), 0, s, nullptr);
  kc::muon_normalise_launch(l, p.data(), 0, static_cast<const double*>(nullptr), 1e-7);
  CHECK(launched.empty());
  std::vector<bf16> pb(4);
  CHECK_THROWS_WITH(
      kc::muon_momentum_step_launch(l, pb.data(), static_cast<float*>(nullptr), m.data(), v.data(),
                                    static_cast<const float*>(g.data()), 4,
                                    static_cast<const hk::muon_segment*>(nullptr), 0, s, nullptr),
      Catch::Contains("need float32 master weights"));
  CHECK_THROWS_WITH(kc::muon_normalise_launch(l, p.data(), -1, nullptr, 1e-7),
                    Catch::Contains("n=-1 must be >= 0"));
}

}  // namespace test_kernels_emulated_muon
