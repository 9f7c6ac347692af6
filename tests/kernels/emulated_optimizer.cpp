// The optimizer's CUDA kernels (include/tessera/kernels/cuda/adamw.cuh and
// lion.cuh: adamw, sgd and lion over a flat buffer with a segment table;
// adafactor.cuh, its six kernels, in the section at the end), their own bodies
// run by the block emulator (tests/support/cuda_emulator.hpp) through the
// launch functions the GPU path calls, against the host kernels
// (kernels::adamw_step, sgd_step and lion_step,
// include/tessera/kernels/optimizer.hpp) and the host optimizers that call
// them (optim::adamw_optimizer, optim::sgd_optimizer, optim::lion_optimizer)
// over several steps.
//
// Inputs: fresh random state and gradients; the state of elements in no
// segment and the parameters each segment writes start as NaN, the other
// parameters as random values. Segment tables: gaps before, between and
// after the segments, nonzero (and one negative) parameter and gradient
// shifts, decay on and off, one-element segments, segments that end on a
// block edge, n no multiple of the block (256), and the tensors of
// llama2_7b (291 segments: embedding, 32 blocks of attention norm, wq, wk,
// wv, wo, MLP norm, w_gate, w_up, w_down, final norm, LM head), each with
// ceil(numel / 2^20) elements aligned to 16 as param_layout aligns them, on
// one rank and as a ZeRO shard. Every instantiation of kernels.hpp: float
// parameters without master weights, bf16 and fp16 parameters with float32
// master weights and float or 16-bit gradients (fp16 with float gradients,
// precision::fp16_mixed's, on every AdamW table; the other fp16 cases off
// the 7B tables, for time); the device gradient scale null,
// finite, +inf and NaN (a skipped step: nothing written).
//
// Bit for bit everywhere (memcmp of the parameters, master weights and
// state): the update of an element is kernels::detail::adamw_update,
// sgd_update or lion_update on the same float32 inputs and step parameters on both sides,
// element-wise with no reduction, and both are compiled by the same host
// compiler without FMA contraction (tests/kernels builds with
// -ffp-contract=off: tests/CMakeLists.txt), so every operation rounds alike. (A GPU contracts a * b
// + c into FMAs, so tests/cuda/kernels.cpp holds the device to f32_tol instead.)
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <tessera/kernels/adafactor.hpp>
#include <tessera/kernels/cuda/adafactor.cuh>
#include <tessera/kernels/cuda/adamw.cuh>
#include <tessera/kernels/cuda/lion.cuh>
#include <tessera/kernels/optimizer.hpp>
#include <tessera/nn/llama_config.hpp>
#include <tessera/nn/llama_layout.hpp>
#include <tessera/optim/adafactor.hpp>
#include <tessera/optim/adamw.hpp>
#include <tessera/optim/lion.hpp>
#include <tessera/optim/sgd.hpp>

#include "../support/cuda_emulator.hpp"
#include "kernel_testing.hpp"

namespace test_kernels_emulated_optimizer {

namespace kc = tessera::kernels::cuda;
namespace hk = tessera::kernels;
namespace optim = tessera::optim;
using tessera::bf16;
using tessera::fp16;
using namespace tessera::testing;
using segment = hk::optimizer_segment;

namespace {

/// A segment table over n optimizer elements and the sizes of the parameter
/// and gradient buffers it reaches into (plus a tail no segment touches).
struct problem {
  std::string name;
  std::int64_t n = 0;
  std::vector<segment> segs;
  std::int64_t params_size = 0, grads_size = 0;
};

problem make_problem(std::string name, std::int64_t n, std::vector<segment> segs) {
  problem p{std::move(name), n, std::move(segs), n, n};
  for (const segment& s : p.segs) {
    REQUIRE(s.begin + s.param_shift >= 0);
    REQUIRE(s.begin + s.grad_shift >= 0);
    p.params_size = std::max(p.params_size, s.end + s.param_shift);
    p.grads_size = std::max(p.grads_size, s.end + s.grad_shift);
  }
  p.params_size += 3;
  p.grads_size += 3;
  return p;
}

/// Gaps before, between and after the segments, shifts of every sign,
/// decay on and off, a one-element segment; n = 1003.
problem ragged() {
  return make_problem("ragged", 1003,
                      {{10, 300, 1, 5, 0},
                       {300, 301, 0, 5, 3},       // one element, no decay
                       {320, 700, 1, 9, -20},     // after a gap; gradients before it
                       {777, 1000, 0, 40, 16}});  // then a tail [1000, 1003) in none
}

/// Segment boundaries on the block edge (256 threads) and one element past it.
problem block_edges() {
  return make_problem("block edges", 513,
                      {{0, 256, 1, 0, 0}, {256, 257, 0, 0, 0}, {257, 513, 1, 0, 0}});
}

problem one_element() {
  return make_problem("one element", 1, {{0, 1, 1, 0, 0}});
}

/// llama2_7b's parameter tensors in the order of its flat buffer
/// (nn::make_llama_layout), each cut to ceil(numel / 2^20) elements (a 4096
/// norm: 1, wq: 16, w_gate: 43, the embedding: 125) and aligned to
/// param_layout::align elements, with its decay flag (norms off). On one
/// rank (`shard` false) the state is the whole buffer, shifts 0. As rank 1
/// of a 4-way ZeRO shard the state is [lo, hi) of it: param_shift lo (the
/// model's flat parameters) and a gradient buffer of the shard padded by 8
/// elements after every 10 segments (grad_shift 8 * (k / 10)).
problem llama2_7b_table(bool shard) {
  const auto layout = tessera::nn::make_llama_layout(tessera::nn::llama_config::llama2_7b());
  const std::int64_t align = tessera::nn::param_layout::align;
  std::vector<segment> flat;
  std::int64_t off = 0;
  for (const auto& e : layout.entries()) {
    const std::int64_t len = (e.numel + (std::int64_t(1) << 20) - 1) >> 20;
    flat.push_back({off, off + len, e.decay ? 1 : 0, 0, 0});
    off = (off + len + align - 1) / align * align;
  }
  REQUIRE(flat.size() == 291);
  if (!shard) return make_problem("llama2_7b", off, flat);
  const std::int64_t lo = off / 4, hi = 2 * off / 4;
  std::vector<segment> segs;
  for (const segment& s : flat) {
    const std::int64_t b = std::max(s.begin, lo), e = std::min(s.end, hi);
    if (b >= e) continue;
    const std::int64_t k = static_cast<std::int64_t>(segs.size());
    segs.push_back({b - lo, e - lo, s.decay, lo, 8 * (k / 10)});
  }
  REQUIRE(segs.size() > 60);
  return make_problem("llama2_7b ZeRO shard 1/4", hi - lo, segs);
}

/// Which elements of the state [0, n) and of the parameter buffer a segment covers.
struct coverage {
  std::vector<char> state, params;
  explicit coverage(const problem& p)
      : state(static_cast<std::size_t>(p.n), 0),
        params(static_cast<std::size_t>(p.params_size), 0) {
    for (const segment& s : p.segs)
      for (std::int64_t i = s.begin; i < s.end; ++i) {
        state[static_cast<std::size_t>(i)] = 1;
        params[static_cast<std::size_t>(i + s.param_shift)] = 1;
      }
  }
};

/// Elements i with mask[i] == want at which a and b differ in any bit.
template <class T>
std::int64_t differing(const std::vector<T>& a, const std::vector<T>& b,
                       const std::vector<char>& mask, char want) {
  std::int64_t count = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (mask[i] == want && std::memcmp(&a[i], &b[i], sizeof(T)) != 0) ++count;
  return count;
}

/// NaN elements among those with mask[i] == 1 (elements a step must write).
template <class T>
std::int64_t unwritten(const std::vector<T>& v, const std::vector<char>& mask) {
  std::int64_t count = 0;
  for (std::size_t i = 0; i < v.size(); ++i)
    if (mask[i] && std::isnan(as_double(v[i]))) ++count;
  return count;
}

/// The buffers of one step: parameters, master weights (empty for float
/// parameters), one or two state buffers, gradients.
template <class Param, class Grad>
struct buffers {
  static constexpr bool has_master = !std::is_same_v<Param, float>;
  std::vector<Param> params;
  std::vector<float> master, s1, s2;
  std::vector<Grad> grads;
  float* master_ptr() { return has_master ? master.data() : nullptr; }
};

/// Random state where a segment covers it and NaN where none does; the
/// parameters a segment writes NaN when they come from master weights (the
/// step must write each), random otherwise.
template <class Param, class Grad>
buffers<Param, Grad> initial(const problem& p, const coverage& cov, int states,
                             std::mt19937_64& rng) {
  buffers<Param, Grad> b;
  const auto n = static_cast<std::size_t>(p.n);
  auto state = [&](double lo, double hi) {
    std::vector<float> s = random_vector<float>(n, rng, lo, hi);
    for (std::size_t i = 0; i < n; ++i)
      if (!cov.state[i]) s[i] = nan_value<float>();
    return s;
  };
  if (b.has_master) b.master = state(-1, 1);
  b.s1 = state(-0.05, 0.05);
  if (states == 2) b.s2 = state(0, 1e-3);  // AdamW's second moment: >= 0
  b.params = random_vector<Param>(static_cast<std::size_t>(p.params_size), rng, -1, 1);
  if (b.has_master)
    for (std::size_t i = 0; i < b.params.size(); ++i)
      if (cov.params[i]) b.params[i] = nan_value<Param>();
  b.grads = random_vector<Grad>(static_cast<std::size_t>(p.grads_size), rng, -1, 1);
  return b;
}

/// The device gradient scale of a case: none (a null pointer), finite, or
/// non-finite (the step is skipped: nothing written).
struct device_scale {
  const char* name;
  std::vector<float> value;  ///< empty: d_grad_scale = nullptr
  bool skips;
  const float* ptr() const { return value.empty() ? nullptr : value.data(); }
};

std::vector<device_scale> device_scales() {
  return {{"none", {}, false},
          {"0.5", {0.5f}, false},
          {"+inf", {std::numeric_limits<float>::infinity()}, true},
          {"NaN", {nan_value<float>()}, true}};
}

/// Step t's AdamW parameters, as adamw_optimizer::update builds them.
hk::detail::adamw_step_params<float> adamw_params(const optim::adamw_config& c, double lr,
                                                  double grad_scale, std::int64_t t) {
  return {static_cast<float>(lr),
          static_cast<float>(c.beta1),
          static_cast<float>(c.beta2),
          static_cast<float>(c.eps),
          static_cast<float>(c.weight_decay),
          static_cast<float>(1.0 - std::pow(c.beta1, static_cast<double>(t))),
          static_cast<float>(1.0 - std::pow(c.beta2, static_cast<double>(t))),
          static_cast<float>(grad_scale)};
}

/// The SGD parameters, as sgd_optimizer::update builds them.
hk::detail::sgd_step_params<float> sgd_params(const optim::sgd_config& c, double lr,
                                              double grad_scale) {
  return {static_cast<float>(lr), static_cast<float>(c.momentum),
          static_cast<float>(c.weight_decay), static_cast<float>(grad_scale), c.nesterov};
}

/// The Lion parameters, as lion_optimizer::update builds them.
hk::detail::lion_step_params<float> lion_params(const optim::lion_config& c, double lr,
                                                double grad_scale) {
  return {static_cast<float>(lr), static_cast<float>(c.beta1), static_cast<float>(c.beta2),
          static_cast<float>(c.weight_decay), static_cast<float>(grad_scale)};
}

/// Registers a case's buffers with the emulator: gradients, segments and
/// the scale are inputs, the rest outputs.
template <class Param, class Grad>
void register_buffers(cuda_emulator& em, buffers<Param, Grad>& b, const problem& p,
                      const std::vector<float>& scale) {
  em.input(b.grads);
  em.input(p.segs);
  em.input(scale);
  em.output(b.params);
  em.output(b.master);
  em.output(b.s1);
  em.output(b.s2);
}

/// After one step from `before`: the emulated buffers equal the host's bit
/// for bit; elements in no segment kept their bits (state NaN, parameters
/// as they were); a skipped step wrote nothing, a taken one every covered element.
template <class Param, class Grad>
void check_step(const buffers<Param, Grad>& emu, const buffers<Param, Grad>& host,
                const buffers<Param, Grad>& before, const coverage& cov, bool skipped) {
  CHECK(same_bits(emu.params, host.params));
  CHECK(same_bits(emu.master, host.master));
  CHECK(same_bits(emu.s1, host.s1));
  CHECK(same_bits(emu.s2, host.s2));
  CHECK(differing(emu.params, before.params, cov.params, 0) == 0);
  CHECK(differing(emu.s1, before.s1, cov.state, 0) == 0);
  CHECK(differing(emu.s2, before.s2, cov.state, 0) == 0);
  CHECK(differing(emu.master, before.master, cov.state, 0) == 0);
  if (skipped) {
    CHECK(same_bits(emu.params, before.params));
    CHECK(same_bits(emu.master, before.master));
    CHECK(same_bits(emu.s1, before.s1));
    CHECK(same_bits(emu.s2, before.s2));
  } else {
    CHECK(unwritten(emu.params, cov.params) == 0);
    CHECK(unwritten(emu.master, cov.state) == 0);
    CHECK(unwritten(emu.s1, cov.state) == 0);
    CHECK(unwritten(emu.s2, cov.state) == 0);
  }
}

template <class Param, class Grad>
void adamw_case(const problem& p, const device_scale& scale, std::uint64_t seed) {
  INFO(p.name << ": adamw, " << tessera::dtype_name<Param>() << " params, "
              << tessera::dtype_name<Grad>() << " grads, device scale " << scale.name);
  std::mt19937_64 rng(seed);
  const coverage cov(p);
  const buffers<Param, Grad> before = initial<Param, Grad>(p, cov, 2, rng);
  optim::adamw_config cfg;
  cfg.weight_decay = 0.1;
  const auto step = adamw_params(cfg, 3e-4, 0.7, 3);
  const float* d_scale = scale.ptr();
  const int ns = static_cast<int>(p.segs.size());

  buffers<Param, Grad> host = before;
  hk::adamw_step(ctx, host.params.data(), host.master_ptr(), host.s1.data(), host.s2.data(),
                 host.grads.data(), p.n, p.segs.data(), ns, step, d_scale);

  buffers<Param, Grad> emu = before;
  cuda_emulator em(seed);
  register_buffers(em, emu, p, scale.value);
  std::vector<std::string> launched;
  kc::adamw_step_launch(emulator_launcher{&em, std::int64_t(1) << 24, &launched}, emu.params.data(),
                        emu.master_ptr(), emu.s1.data(), emu.s2.data(),
                        static_cast<const Grad*>(emu.grads.data()), p.n, p.segs.data(), ns, step,
                        d_scale);
  CHECK(launched == std::vector<std::string>{"adamw"});
  check_step(emu, host, before, cov, scale.skips);
}

template <class Param, class Grad>
void sgd_case(const problem& p, const optim::sgd_config& cfg, const device_scale& scale,
              std::uint64_t seed) {
  INFO(p.name << ": sgd momentum " << cfg.momentum << (cfg.nesterov ? " nesterov" : "") << " wd "
              << cfg.weight_decay << ", " << tessera::dtype_name<Param>() << " params, "
              << tessera::dtype_name<Grad>() << " grads, device scale " << scale.name);
  std::mt19937_64 rng(seed);
  const coverage cov(p);
  const buffers<Param, Grad> before = initial<Param, Grad>(p, cov, 1, rng);
  const auto step = sgd_params(cfg, 1e-2, 0.7);
  const float* d_scale = scale.ptr();
  const int ns = static_cast<int>(p.segs.size());

  buffers<Param, Grad> host = before;
  hk::sgd_step(ctx, host.params.data(), host.master_ptr(), host.s1.data(), host.grads.data(), p.n,
               p.segs.data(), ns, step, d_scale);

  buffers<Param, Grad> emu = before;
  cuda_emulator em(seed);
  register_buffers(em, emu, p, scale.value);
  std::vector<std::string> launched;
  kc::sgd_step_launch(emulator_launcher{&em, std::int64_t(1) << 24, &launched}, emu.params.data(),
                      emu.master_ptr(), emu.s1.data(), static_cast<const Grad*>(emu.grads.data()),
                      p.n, p.segs.data(), ns, step, d_scale);
  CHECK(launched == std::vector<std::string>{"sgd"});
  check_step(emu, host, before, cov, scale.skips);
}

template <class Param, class Grad>
void lion_case(const problem& p, const optim::lion_config& cfg, const device_scale& scale,
               std::uint64_t seed) {
  INFO(p.name << ": lion beta1 " << cfg.beta1 << " beta2 " << cfg.beta2 << " wd "
              << cfg.weight_decay << ", " << tessera::dtype_name<Param>() << " params, "
              << tessera::dtype_name<Grad>() << " grads, device scale " << scale.name);
  std::mt19937_64 rng(seed);
  const coverage cov(p);
  buffers<Param, Grad> before = initial<Param, Grad>(p, cov, 1, rng);
  // Some exact zeros of the gradient and the momentum: sign(0) = 0 on both.
  for (std::size_t i = 0; i < before.grads.size(); i += 97) before.grads[i] = Grad(0.0f);
  for (std::size_t i = 0; i < before.s1.size(); i += 89)
    if (!std::isnan(before.s1[i])) before.s1[i] = 0.f;
  const auto step = lion_params(cfg, 1e-2, 0.7);
  const float* d_scale = scale.ptr();
  const int ns = static_cast<int>(p.segs.size());

  buffers<Param, Grad> host = before;
  hk::lion_step(ctx, host.params.data(), host.master_ptr(), host.s1.data(), host.grads.data(), p.n,
                p.segs.data(), ns, step, d_scale);

  buffers<Param, Grad> emu = before;
  cuda_emulator em(seed);
  register_buffers(em, emu, p, scale.value);
  std::vector<std::string> launched;
  kc::lion_step_launch(emulator_launcher{&em, std::int64_t(1) << 24, &launched}, emu.params.data(),
                       emu.master_ptr(), emu.s1.data(), static_cast<const Grad*>(emu.grads.data()),
                       p.n, p.segs.data(), ns, step, d_scale);
  CHECK(launched == std::vector<std::string>{"lion"});
  check_step(emu, host, before, cov, scale.skips);
}

/// A few steps of the host optimizer `O` (adamw_optimizer or sgd_optimizer
/// over host memory, shifted owned ranges) against the emulated kernel
/// given the step parameters `params_of(t, grad_scale)` the optimizer
/// builds: steps 1-3 with a host-side scale, a step whose clip coefficient
/// is NaN (skipped, then skipped()), and step 4 with a device coefficient.
/// After each, the master weights, the state and the parameters are
/// compared bit for bit.
template <class Param, class Grad, class O, class Launch, class Params>
void optimizer_steps(const typename O::config_type& cfg, int states, const Launch& launch_fn,
                     const Params& params_of) {
  const std::int64_t n = 1500;
  const std::vector<optim::owned_range> ranges = {
      {0, 600, true, 7, 0}, {600, 610, false, 7, 2}, {700, n - 1, true, 20, 2}};
  std::vector<segment> segs;  // as flat_optimizer builds them: decay where wd != 0
  for (const auto& r : ranges)
    segs.push_back(
        {r.begin, r.end, r.decay && cfg.weight_decay != 0.0 ? 1 : 0, r.param_shift, r.grad_shift});
  const problem p = make_problem("optimizer", n, segs);
  const coverage cov(p);
  std::mt19937_64 rng(77);
  auto params = random_vector<Param>(static_cast<std::size_t>(p.params_size), rng, -1, 1);

  O host(cfg, n, ranges, ctx);
  host.init_master(params.data());
  // The emulated state as the optimizer starts: zeros, master weights cast
  // from the covered parameters.
  buffers<Param, Grad> emu;
  emu.params = params;
  emu.s1.assign(static_cast<std::size_t>(n), 0.f);
  if (states == 2) emu.s2.assign(static_cast<std::size_t>(n), 0.f);
  if (emu.has_master) {
    emu.master.assign(static_cast<std::size_t>(n), 0.f);
    for (const segment& s : segs)
      for (std::int64_t i = s.begin; i < s.end; ++i)
        emu.master[static_cast<std::size_t>(i)] =
            tessera::to<float>(params[static_cast<std::size_t>(i + s.param_shift)]);
  }
  const double lr = 1e-2;
  std::vector<float> clip(1);
  cuda_emulator em(78);
  auto compare = [&](int t) {
    INFO("after step " << t);
    CHECK(same_bits(emu.params, params));
    if (emu.has_master)
      CHECK(std::memcmp(emu.master.data(), host.master(), emu.master.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(emu.s1.data(), host.state(0), emu.s1.size() * sizeof(float)) == 0);
    if (states == 2)
      CHECK(std::memcmp(emu.s2.data(), host.state(1), emu.s2.size() * sizeof(float)) == 0);
  };
  auto emulated_step = [&](std::int64_t t, double grad_scale, const float* d_clip) {
    em.clear_regions();
    register_buffers(em, emu, p, clip);
    std::vector<std::string> launched;
    launch_fn(emulator_launcher{&em, std::int64_t(1) << 24, &launched}, emu, p,
              params_of(t, grad_scale), d_clip);
    CHECK(launched.size() == 1);
  };
  for (int t = 1; t <= 3; ++t) {
    emu.grads = random_vector<Grad>(static_cast<std::size_t>(p.grads_size), rng, -1, 1);
    host.step(params.data(), emu.grads.data(), lr, 0.7);
    emulated_step(t, 0.7, nullptr);
    compare(t);
  }
  // The gradient norm overflowed: a NaN coefficient skips the step on both.
  emu.grads = random_vector<Grad>(static_cast<std::size_t>(p.grads_size), rng, -1, 1);
  clip[0] = nan_value<float>();
  host.step(params.data(), emu.grads.data(), lr, clip.data());
  host.skipped();
  emulated_step(4, 1.0, clip.data());
  compare(3);
  clip[0] = 0.25f;
  host.step(params.data(), emu.grads.data(), lr, clip.data());
  emulated_step(4, 1.0, clip.data());
  compare(4);
  CHECK(host.steps_taken() == 4);
}

/// adamw_optimizer and sgd_optimizer with their state buffers by index.
template <class Param, class Grad>
struct host_adamw : optim::adamw_optimizer<Param, Grad, float, hk::host_context> {
  using config_type = optim::adamw_config;
  using optim::adamw_optimizer<Param, Grad, float, hk::host_context>::adamw_optimizer;
  const float* state(int k) const { return k == 0 ? this->exp_avg() : this->exp_avg_sq(); }
};
template <class Param, class Grad>
struct host_sgd : optim::sgd_optimizer<Param, Grad, float, hk::host_context> {
  using config_type = optim::sgd_config;
  using optim::sgd_optimizer<Param, Grad, float, hk::host_context>::sgd_optimizer;
  const float* state(int) const { return this->momentum_buffer(); }
};

template <class Param, class Grad>
struct host_lion : optim::lion_optimizer<Param, Grad, float, hk::host_context> {
  using config_type = optim::lion_config;
  using optim::lion_optimizer<Param, Grad, float, hk::host_context>::lion_optimizer;
  const float* state(int) const { return this->exp_avg(); }
};

template <class Param, class Grad>
void adamw_optimizer_case() {
  INFO("adamw_optimizer, " << tessera::dtype_name<Param>() << " params, "
                           << tessera::dtype_name<Grad>() << " grads");
  optim::adamw_config cfg;
  cfg.weight_decay = 0.1;
  optimizer_steps<Param, Grad, host_adamw<Param, Grad>>(
      cfg, 2,
      [](const emulator_launcher& l, buffers<Param, Grad>& b, const problem& p,
         const hk::detail::adamw_step_params<float>& s, const float* d_clip) {
        kc::adamw_step_launch(l, b.params.data(), b.master_ptr(), b.s1.data(), b.s2.data(),
                              static_cast<const Grad*>(b.grads.data()), p.n, p.segs.data(),
                              static_cast<int>(p.segs.size()), s, d_clip);
      },
      [&](std::int64_t t, double scale) { return adamw_params(cfg, 1e-2, scale, t); });
}

template <class Param, class Grad>
void sgd_optimizer_case(const optim::sgd_config& cfg) {
  INFO("sgd_optimizer momentum " << cfg.momentum << (cfg.nesterov ? " nesterov" : "") << " wd "
                                 << cfg.weight_decay << ", " << tessera::dtype_name<Param>()
                                 << " params, " << tessera::dtype_name<Grad>() << " grads");
  optimizer_steps<Param, Grad, host_sgd<Param, Grad>>(
      cfg, 1,
      [](const emulator_launcher& l, buffers<Param, Grad>& b, const problem& p,
         const hk::detail::sgd_step_params<float>& s, const float* d_clip) {
        kc::sgd_step_launch(l, b.params.data(), b.master_ptr(), b.s1.data(),
                            static_cast<const Grad*>(b.grads.data()), p.n, p.segs.data(),
                            static_cast<int>(p.segs.size()), s, d_clip);
      },
      [&](std::int64_t, double scale) { return sgd_params(cfg, 1e-2, scale); });
}

template <class Param, class Grad>
void lion_optimizer_case(const optim::lion_config& cfg) {
  INFO("lion_optimizer wd " << cfg.weight_decay << ", " << tessera::dtype_name<Param>()
                            << " params, " << tessera::dtype_name<Grad>() << " grads");
  optimizer_steps<Param, Grad, host_lion<Param, Grad>>(
      cfg, 1,
      [](const emulator_launcher& l, buffers<Param, Grad>& b, const problem& p,
         const hk::detail::lion_step_params<float>& s, const float* d_clip) {
        kc::lion_step_launch(l, b.params.data(), b.master_ptr(), b.s1.data(),
                             static_cast<const Grad*>(b.grads.data()), p.n, p.segs.data(),
                             static_cast<int>(p.segs.size()), s, d_clip);
      },
      [&](std::int64_t, double scale) { return lion_params(cfg, 1e-2, scale); });
}

/// Lion with and without weight decay, the paper's betas and others.
std::vector<optim::lion_config> lion_configs() {
  return {{0.9, 0.99, 0.1}, {0.95, 0.98, 0.0}};
}

std::vector<optim::sgd_config> sgd_configs() {
  optim::sgd_config plain, momentum, nesterov;
  plain.momentum = 0;  // plain SGD: the buffer is the gradient
  momentum.momentum = 0.9;
  momentum.weight_decay = 1e-2;
  nesterov.momentum = 0.9;
  nesterov.nesterov = true;
  nesterov.weight_decay = 1e-2;
  return {plain, momentum, nesterov};
}

}  // namespace

TEST_CASE("emulated cuda adamw equals the host adamw_step bit for bit",
          "[kernels][emulated][optimizer]") {
  std::uint64_t seed = 1;
  for (const problem& p :
       {ragged(), block_edges(), one_element(), llama2_7b_table(false), llama2_7b_table(true)})
    for (const device_scale& scale : device_scales()) {
      adamw_case<float, float>(p, scale, seed++);
      adamw_case<bf16, float>(p, scale, seed++);
      adamw_case<bf16, bf16>(p, scale, seed++);
      adamw_case<fp16, float>(p, scale, seed++);
      if (p.segs.size() < 100) adamw_case<fp16, fp16>(p, scale, seed++);
    }
}

TEST_CASE("emulated cuda sgd equals the host sgd_step bit for bit",
          "[kernels][emulated][optimizer]") {
  std::uint64_t seed = 1000;
  for (const problem& p : {ragged(), block_edges(), one_element(), llama2_7b_table(true)})
    for (const optim::sgd_config& cfg : sgd_configs())
      for (const device_scale& scale : device_scales()) {
        sgd_case<float, float>(p, cfg, scale, seed++);
        sgd_case<bf16, float>(p, cfg, scale, seed++);
        sgd_case<bf16, bf16>(p, cfg, scale, seed++);
        if (p.segs.size() < 100) {  // SGD's fp16 cases off the 7B table, for time
          sgd_case<fp16, float>(p, cfg, scale, seed++);
          sgd_case<fp16, fp16>(p, cfg, scale, seed++);
        }
      }
}

TEST_CASE("emulated cuda lion equals the host lion_step bit for bit",
          "[kernels][emulated][optimizer]") {
  std::uint64_t seed = 3000;
  for (const problem& p : {ragged(), block_edges(), one_element(), llama2_7b_table(true)})
    for (const optim::lion_config& cfg : lion_configs())
      for (const device_scale& scale : device_scales()) {
        lion_case<float, float>(p, cfg, scale, seed++);
        lion_case<bf16, float>(p, cfg, scale, seed++);
        lion_case<bf16, bf16>(p, cfg, scale, seed++);
        if (p.segs.size() < 100) {  // fp16 off the 7B table, for time, as SGD's
          lion_case<fp16, float>(p, cfg, scale, seed++);
          lion_case<fp16, fp16>(p, cfg, scale, seed++);
        }
      }
}

TEST_CASE("emulated cuda adamw, sgd and lion follow the host optimizers over steps and a skip",
          "[kernels][emulated][optimizer]") {
  adamw_optimizer_case<float, float>();
  adamw_optimizer_case<bf16, float>();
  adamw_optimizer_case<bf16, bf16>();
  adamw_optimizer_case<fp16, float>();
  adamw_optimizer_case<fp16, fp16>();
  for (const optim::sgd_config& cfg : sgd_configs()) {
    sgd_optimizer_case<float, float>(cfg);
    sgd_optimizer_case<bf16, float>(cfg);
    sgd_optimizer_case<bf16, bf16>(cfg);
    sgd_optimizer_case<fp16, float>(cfg);
    sgd_optimizer_case<fp16, fp16>(cfg);
  }
  for (const optim::lion_config& cfg : lion_configs()) {
    lion_optimizer_case<float, float>(cfg);
    lion_optimizer_case<bf16, float>(cfg);
    lion_optimizer_case<bf16, bf16>(cfg);
    lion_optimizer_case<fp16, float>(cfg);
    lion_optimizer_case<fp16, fp16>(cfg);
  }
}

TEST_CASE("emulated cuda optimizer launches: no work, bad arguments, a segment past the buffers",
          "[kernels][emulated][optimizer]") {
  const problem p = ragged();
  const coverage cov(p);
  std::mt19937_64 rng(5);
  auto b = initial<bf16, float>(p, cov, 2, rng);
  const auto before = b;
  const auto step = adamw_params(optim::adamw_config{}, 1e-3, 1.0, 1);
  const auto sstep = sgd_params(optim::sgd_config{}, 1e-3, 1.0);
  cuda_emulator em;
  register_buffers(em, b, p, {});
  std::vector<std::string> launched;
  const emulator_launcher l{&em, std::int64_t(1) << 24, &launched};
  const int ns = static_cast<int>(p.segs.size());

  // n = 0 or no segments: no launch, nothing written.
  kc::adamw_step_launch(l, b.params.data(), b.master.data(), b.s1.data(), b.s2.data(),
                        static_cast<const float*>(b.grads.data()), 0, p.segs.data(), ns, step,
                        nullptr);
  kc::adamw_step_launch(l, b.params.data(), b.master.data(), b.s1.data(), b.s2.data(),
                        static_cast<const float*>(b.grads.data()), p.n, p.segs.data(), 0, step,
                        nullptr);
  kc::sgd_step_launch(l, b.params.data(), b.master.data(), b.s1.data(),
                      static_cast<const float*>(b.grads.data()), 0, p.segs.data(), ns, sstep,
                      nullptr);
  kc::lion_step_launch(l, b.params.data(), b.master.data(), b.s1.data(),
                       static_cast<const float*>(b.grads.data()), p.n, p.segs.data(), 0,
                       lion_params(optim::lion_config{}, 1e-3, 1.0), nullptr);
  CHECK(launched.empty());
  CHECK(same_bits(b.params, before.params));
  CHECK(same_bits(b.s1, before.s1));

  // The host checks: negative sizes, a master pointer that does not match Param.
  using tessera::config_error;
  CHECK_THROWS_AS(kc::adamw_step_launch(l, b.params.data(), b.master.data(), b.s1.data(),
                                        b.s2.data(), static_cast<const float*>(b.grads.data()), -1,
                                        p.segs.data(), ns, step, nullptr),
                  config_error);
  CHECK_THROWS_AS(kc::adamw_step_launch(l, b.params.data(), b.master.data(), b.s1.data(),
                                        b.s2.data(), static_cast<const float*>(b.grads.data()), p.n,
                                        p.segs.data(), -1, step, nullptr),
                  config_error);
  CHECK_THROWS_WITH(
      kc::adamw_step_launch(l, b.params.data(), static_cast<float*>(nullptr), b.s1.data(),
                            b.s2.data(), static_cast<const float*>(b.grads.data()), p.n,
                            p.segs.data(), ns, step, nullptr),
      Catch::Contains("need float32 master weights"));
  CHECK_THROWS_WITH(kc::sgd_step_launch(l, b.s2.data(), b.master.data(), b.s1.data(),
                                        static_cast<const float*>(b.grads.data()), p.n,
                                        p.segs.data(), ns, sstep, nullptr),
                    Catch::Contains("pass d_master = nullptr"));
  CHECK_THROWS_AS(kc::sgd_step_launch(l, b.params.data(), b.master.data(), b.s1.data(),
                                      static_cast<const float*>(b.grads.data()), p.n, p.segs.data(),
                                      -1, sstep, nullptr),
                  config_error);
  CHECK_THROWS_WITH(
      kc::lion_step_launch(l, b.params.data(), static_cast<float*>(nullptr), b.s1.data(),
                           static_cast<const float*>(b.grads.data()), p.n, p.segs.data(), ns,
                           lion_params(optim::lion_config{}, 1e-3, 1.0), nullptr),
      Catch::Contains("lion_step (cuda)") && Catch::Contains("need float32 master weights"));
  CHECK(launched.empty());

  // A segment whose parameters lie past the buffer: the emulator stops the
  // body at the first access outside every buffer, naming the kernel. Far
  // past it (2^36 elements): just past it may be another registered buffer,
  // wherever the heap placed them.
  std::vector<segment> bad = p.segs;
  bad.back().param_shift = std::int64_t(1) << 36;
  em.input(bad);
  CHECK_THROWS_WITH(kc::adamw_step_launch(l, b.params.data(), b.master.data(), b.s1.data(),
                                          b.s2.data(), static_cast<const float*>(b.grads.data()),
                                          p.n, bad.data(), ns, step, nullptr),
                    Catch::Contains("adamw block") && Catch::Contains("outside every buffer"));
}

// ---- Adafactor (kernels/cuda/adafactor.cuh) -----------------------------------------------------
//
// The ten kernels against the host kernels::adafactor_step, through the
// host optimizer (optim::adafactor_optimizer builds the tensor table and
// the step parameters) over several steps: to float rounding, not bit for
// bit. The per-element arithmetic is the same functions on both sides, but
// a row's and a tensor's sums are float64 in another order (256 threads
// then CUB's block tree, against element by element on the host), so a
// stored row statistic, mean or clip divisor may differ in its last float
// bit and what is computed from it by a few float ulps; 1e-6. (Measured:
// no difference at all on these tables: float64 sums of a few thousand
// float squares are exact or round to the same float.) Parameters of 16 bits round from master
// weights that may differ so: one unit of their last place (tol_of). Exact: a skipped step writes
// nothing on either side, elements in no tensor keep their bits, every element of a tensor is
// written. A table of a ZeRO piece, row- and column-split tp shards (with
// vocabulary padding rows) and a vector's piece runs the same kernels
// against the host's, its sums areas compared too.

namespace {

/// A table of whole tensors over n optimizer elements, with the shifts of
/// their parameters and gradients, and the sizes of those buffers.
struct adafactor_problem {
  std::string name;
  std::int64_t n = 0, params_size = 0, grads_size = 0;
  std::vector<optim::owned_range> ranges;
};

adafactor_problem adafactor_table(std::string name, const std::vector<optim::owned_range>& rs,
                                  std::int64_t n) {
  adafactor_problem p{std::move(name), n, n, n, rs};
  for (const auto& r : rs) {
    REQUIRE(r.begin + r.param_shift >= 0);
    REQUIRE(r.begin + r.grad_shift >= 0);
    p.params_size = std::max(p.params_size, r.end + r.param_shift);
    p.grads_size = std::max(p.grads_size, r.end + r.grad_shift);
  }
  p.params_size += 3;
  p.grads_size += 3;
  return p;
}

/// Matrices and vectors of every kind: a row longer than a block (300
/// columns), more rows than a block (300 x 2), a vector of two reduction
/// rows (5000), a 1 x 4 matrix, gaps between tensors, shifts of both signs.
adafactor_problem adafactor_mixed() {
  std::vector<optim::owned_range> r;
  std::int64_t at = 0;
  auto add = [&](std::int64_t rows, std::int64_t cols, int dims, bool decay, std::int64_t ps,
                 std::int64_t gs, std::int64_t gap) {
    at += gap;
    r.push_back({at, at + rows * cols, decay, ps, gs, dims, rows, cols});
    at += rows * cols;
  };
  add(6, 5, 2, true, 5, 0, 0);
  add(1, 7, 1, false, 5, 3, 4);
  add(3, 300, 2, true, 9, -20, 0);
  add(1, 5000, 1, true, 0, 16, 11);
  add(1, 4, 2, true, 40, 16, 0);
  add(300, 2, 2, true, 40, 0, 1);
  return adafactor_table("mixed", r, at + 3);
}

/// The tiny preset's tensors (embedding, norms, attention and MLP
/// matrices, LM head) as one rank holds them.
adafactor_problem adafactor_tiny() {
  auto c = tessera::nn::llama_config::tiny();
  c.vocab = 256;
  const auto layout = tessera::nn::make_llama_layout(c);
  return adafactor_table("tiny", optim::owned(layout.ranges()), layout.total());
}

/// adafactor_optimizer over host memory, its state by name.
template <class Param, class Grad>
using host_adafactor = optim::adafactor_optimizer<Param, Grad, float, hk::host_context>;

/// Step t's parameters as adafactor_optimizer builds them.
hk::detail::adafactor_step_params<float> adafactor_params(const optim::adafactor_config& c,
                                                          double lr, double grad_scale,
                                                          std::int64_t t) {
  return {static_cast<float>(c.step_lr(lr, t)),
          static_cast<float>(1.0 - std::pow(static_cast<double>(t), c.decay_rate)),
          static_cast<float>(c.eps1),
          static_cast<float>(c.eps2),
          static_cast<float>(c.clip_threshold),
          static_cast<float>(c.beta1),
          static_cast<float>(c.weight_decay),
          static_cast<float>(grad_scale),
          c.beta1 > 0,
          c.scale_parameter};
}

/// The emulated side's buffers: parameters, master weights, gradients,
/// statistics, first moment, scalars and partial sums.
template <class Param, class Grad>
struct adafactor_buffers_of {
  static constexpr bool has_master = !std::is_same_v<Param, float>;
  std::vector<Param> params;
  std::vector<float> master, stats, exp_avg, scalars;
  std::vector<double> partial, sums;
  std::vector<Grad> grads;
  float* master_ptr() { return has_master ? master.data() : nullptr; }
  hk::adafactor_buffers<float> buffers() {
    return {stats.data(), exp_avg.empty() ? nullptr : exp_avg.data(), scalars.data(),
            partial.data(), sums.data()};
  }
};

template <class Param, class Grad>
void adafactor_case(const adafactor_problem& p, const optim::adafactor_config& cfg,
                    std::uint64_t seed) {
  INFO(p.name << ": adafactor beta1 " << cfg.beta1 << " d " << cfg.clip_threshold << " wd "
              << cfg.weight_decay << (cfg.scale_parameter ? " scale_parameter" : "")
              << (cfg.relative_step ? " relative_step" : "") << ", " << tessera::dtype_name<Param>()
              << " params, " << tessera::dtype_name<Grad>() << " grads");
  constexpr bool has_master = !std::is_same_v<Param, float>;
  std::mt19937_64 rng(seed);
  std::vector<char> covered(static_cast<std::size_t>(p.n), 0),
      covered_params(static_cast<std::size_t>(p.params_size), 0);
  for (const auto& r : p.ranges)
    for (std::int64_t i = r.begin; i < r.end; ++i) {
      covered[static_cast<std::size_t>(i)] = 1;
      covered_params[static_cast<std::size_t>(i + r.param_shift)] = 1;
    }
  std::vector<Param> params =
      random_vector<Param>(static_cast<std::size_t>(p.params_size), rng, -1, 1);
  host_adafactor<Param, Grad> host(cfg, p.n, p.ranges, ctx);
  host.init_master(params.data());
  const auto& table = host.tensors();
  const hk::adafactor_sizes sizes = host.sizes();
  const std::int64_t nstats = sizes.stats;
  adafactor_buffers_of<Param, Grad> emu;
  emu.params = params;
  if (has_master) {
    emu.master.assign(static_cast<std::size_t>(p.n), 0.f);
    for (const auto& r : p.ranges)
      for (std::int64_t i = r.begin; i < r.end; ++i)
        emu.master[static_cast<std::size_t>(i)] =
            tessera::to<float>(params[static_cast<std::size_t>(i + r.param_shift)]);
    // The parameters a step writes start as NaN: the step must write each.
    for (std::size_t i = 0; i < emu.params.size(); ++i)
      if (covered_params[i]) emu.params[i] = nan_value<Param>();
  }
  emu.stats.assign(static_cast<std::size_t>(nstats), 0.f);
  if (cfg.beta1 > 0) emu.exp_avg.assign(static_cast<std::size_t>(p.n), 0.f);
  emu.scalars.assign(3 * table.size(), 0.f);
  emu.partial.assign(static_cast<std::size_t>(sizes.rows), 0.0);
  emu.sums.assign(static_cast<std::size_t>(sizes.sums), 0.0);
  const std::vector<hk::adafactor_tensor> d_table = table;

  cuda_emulator em(seed);
  std::vector<float> clip(1);
  auto emulated_step = [&](std::int64_t t, double lr, double scale, const float* d_clip) {
    em.clear_regions();
    em.input(emu.grads);
    em.input(d_table);
    em.input(clip);
    em.output(emu.params);
    em.output(emu.master);
    em.output(emu.stats);
    em.output(emu.exp_avg);
    em.output(emu.scalars);
    em.output(emu.partial);
    em.output(emu.sums);
    std::vector<std::string> launched;
    kc::adafactor_step_launch(emulator_launcher{&em, std::int64_t(1) << 24, &launched},
                              emu.params.data(), emu.master_ptr(),
                              static_cast<const Grad*>(emu.grads.data()), d_table.data(), sizes,
                              emu.buffers(), adafactor_params(cfg, lr, scale, t), d_clip);
    const std::vector<std::string> want = {
        "adafactor_zero",        "adafactor_rows",      "adafactor_cols",    "adafactor_tensor_p2",
        "adafactor_stats",       "adafactor_tensor_lr", "adafactor_rows_u2", "adafactor_tensor_u2",
        "adafactor_tensor_clip", "adafactor_apply"};
    CHECK(launched == want);
  };
  auto compare = [&](int t) {
    INFO("after step " << t);
    const std::vector<float> stats(host.statistics(), host.statistics() + nstats);
    const double e_s = max_rel_error(emu.stats, stats);
    double e_m = 0, e_w = 0;
    if (cfg.beta1 > 0)
      e_m = max_rel_error(emu.exp_avg, std::vector<float>(host.exp_avg(), host.exp_avg() + p.n));
    if (has_master)
      e_w = max_rel_error(emu.master, std::vector<float>(host.master(), host.master() + p.n));
    const double e_p = max_rel_error(emu.params, params);
    UNSCOPED_INFO("statistics " << e_s << " first moment " << e_m << " master " << e_w
                                << " parameters " << e_p);
    CHECK(e_s < 1e-6);
    CHECK(e_m < 1e-6);
    CHECK(e_w < 1e-6);
    CHECK(e_p < (has_master ? tol_of<Param> : 1e-6));
    // Parameters in no tensor keep their bits on both sides.
    for (std::size_t i = 0; i < params.size(); ++i)
      if (!covered_params[i]) REQUIRE(std::memcmp(&emu.params[i], &params[i], sizeof(Param)) == 0);
  };
  const double lr = 1e-2;
  for (int t = 1; t <= 3; ++t) {
    emu.grads = random_vector<Grad>(static_cast<std::size_t>(p.grads_size), rng, -1, 1);
    for (std::size_t i = 0; i < emu.grads.size(); i += 53) emu.grads[i] = Grad(0.0f);
    host.step(params.data(), emu.grads.data(), lr, 0.7);
    emulated_step(t, lr, 0.7, nullptr);
    compare(t);
  }
  // A NaN clip coefficient skips the step on both: nothing written.
  emu.grads = random_vector<Grad>(static_cast<std::size_t>(p.grads_size), rng, -1, 1);
  const auto before = emu;
  clip[0] = nan_value<float>();
  host.step(params.data(), emu.grads.data(), lr, clip.data());
  host.skipped();
  emulated_step(4, lr, 1.0, clip.data());
  CHECK(same_bits(emu.params, before.params));
  CHECK(same_bits(emu.master, before.master));
  CHECK(same_bits(emu.stats, before.stats));
  CHECK(same_bits(emu.exp_avg, before.exp_avg));
  compare(3);
  // Step 4 with the device coefficient.
  clip[0] = 0.25f;
  host.step(params.data(), emu.grads.data(), lr, clip.data());
  emulated_step(4, lr, 1.0, clip.data());
  compare(4);
  CHECK(host.steps_taken() == 4);
}

/// Parts of tensors as the layouts cut them: a ZeRO piece of a 6 x 5
/// matrix (elements 7 to 23: part rows at both ends), tp shard 1 of a
/// row-split 10 x 5 matrix held as 6 x 5 (its last two rows vocabulary
/// padding), shard 1 of a column-split 4 x 6 matrix (4 x 3), a piece of a
/// shard of a 300 x 2 matrix, and a vector's piece.
adafactor_problem adafactor_parts() {
  std::vector<optim::owned_range> r;
  std::int64_t at = 0;
  auto add = [&](std::int64_t rows, std::int64_t cols, int dims, std::int64_t first,
                 std::int64_t len, int split, int shard, std::int64_t full_rows,
                 std::int64_t full_cols) {
    optim::owned_range o{at, at + len, true, 3, 2, dims, rows, cols};
    o.first = first;
    o.split = split;
    o.shard = shard;
    o.full_rows = full_rows;
    o.full_cols = full_cols;
    r.push_back(o);
    at += len + 1;
  };
  add(6, 5, 2, 7, 16, -1, 0, 6, 5);
  add(6, 5, 2, 0, 30, 0, 1, 10, 5);
  add(4, 3, 2, 0, 12, 1, 1, 4, 6);
  add(300, 2, 2, 101, 350, 0, 1, 600, 2);
  add(1, 5000, 1, 1200, 3000, -1, 0, 1, 5000);
  return adafactor_table("parts", r, at + 3);
}

/// The parts table: the host kernel and the emulated kernels, phase `all`
/// from the same state (every rank's local computation), over three steps:
/// the sums areas, statistics, first moment and parameters to float rounding.
void adafactor_parts_case(const optim::adafactor_config& cfg, std::uint64_t seed) {
  const adafactor_problem p = adafactor_parts();
  INFO("parts: beta1 " << cfg.beta1 << (cfg.scale_parameter ? " scale_parameter" : ""));
  std::mt19937_64 rng(seed);
  host_adafactor<float, float> opt(cfg, p.n, p.ranges, ctx);  // its table and sizes
  const auto& table = opt.tensors();
  const hk::adafactor_sizes sizes = opt.sizes();
  adafactor_buffers_of<float, float> host, emu;
  host.params = random_vector<float>(static_cast<std::size_t>(p.params_size), rng, -1, 1);
  host.stats.assign(static_cast<std::size_t>(sizes.stats), 0.f);
  if (cfg.beta1 > 0) host.exp_avg.assign(static_cast<std::size_t>(p.n), 0.f);
  host.scalars.assign(3 * table.size(), 0.f);
  host.partial.assign(static_cast<std::size_t>(sizes.rows), 0.0);
  host.sums.assign(static_cast<std::size_t>(sizes.sums), 0.0);
  emu = host;
  const std::vector<float> params0 = host.params;
  cuda_emulator em(seed);
  const std::vector<hk::adafactor_tensor> d_table = table;
  for (int t = 1; t <= 3; ++t) {
    INFO("step " << t);
    host.grads = random_vector<float>(static_cast<std::size_t>(p.grads_size), rng, -1, 1);
    emu.grads = host.grads;
    const auto step = adafactor_params(cfg, 1e-2, 0.7, t);
    hk::adafactor_step(ctx, host.params.data(), static_cast<float*>(nullptr), host.grads.data(),
                       table.data(), sizes, host.buffers(), step,
                       static_cast<const float*>(nullptr));
    em.clear_regions();
    em.input(emu.grads);
    em.input(d_table);
    em.output(emu.params);
    em.output(emu.stats);
    em.output(emu.exp_avg);
    em.output(emu.scalars);
    em.output(emu.partial);
    em.output(emu.sums);
    std::vector<std::string> launched;
    kc::adafactor_step_launch(emulator_launcher{&em, std::int64_t(1) << 24, &launched},
                              emu.params.data(), static_cast<float*>(nullptr),
                              static_cast<const float*>(emu.grads.data()), d_table.data(), sizes,
                              emu.buffers(), step, static_cast<const float*>(nullptr));
    CHECK(launched.size() == 10);
    CHECK(max_rel_error(emu.sums, host.sums) < 1e-12);
    CHECK(max_rel_error(emu.stats, host.stats) < 1e-6);
    CHECK(max_rel_error(emu.exp_avg, host.exp_avg) < 1e-6);
    CHECK(max_rel_error(emu.params, host.params) < 1e-6);
  }
  // The padding rows of the row-split shard are never written, on either side.
  const auto& shard = p.ranges[1];
  for (std::int64_t i = shard.begin + 20; i < shard.end; ++i) {
    const auto at = static_cast<std::size_t>(i + shard.param_shift);
    CHECK(emu.params[at] == params0[at]);
    CHECK(host.params[at] == params0[at]);
  }
}

std::vector<optim::adafactor_config> adafactor_configs() {
  optim::adafactor_config plain, momentum, scaled;
  momentum.beta1 = 0.9;
  momentum.weight_decay = 0.1;
  momentum.clip_threshold = 0.5;
  scaled.scale_parameter = true;
  scaled.relative_step = true;
  return {plain, momentum, scaled};
}

}  // namespace

TEST_CASE("emulated cuda adafactor follows the host adafactor_step to float rounding",
          "[kernels][emulated][optimizer]") {
  std::uint64_t seed = 5000;
  const adafactor_problem mixed = adafactor_mixed(), tiny = adafactor_tiny();
  for (const optim::adafactor_config& cfg : adafactor_configs()) {
    adafactor_case<float, float>(mixed, cfg, seed++);
    adafactor_case<bf16, float>(mixed, cfg, seed++);
    adafactor_case<bf16, bf16>(mixed, cfg, seed++);
    adafactor_case<fp16, float>(mixed, cfg, seed++);
    adafactor_case<fp16, fp16>(mixed, cfg, seed++);
    // The tiny model's 1000-odd rows, each a 256-thread block under the
    // emulator: one type pair a configuration, for time.
    adafactor_case<bf16, float>(tiny, cfg, seed++);
  }
  adafactor_case<float, float>(tiny, adafactor_configs()[1], seed++);
  for (const optim::adafactor_config& cfg : adafactor_configs()) adafactor_parts_case(cfg, seed++);
}

TEST_CASE("emulated cuda adafactor: no tensors, bad arguments", "[kernels][emulated][optimizer]") {
  cuda_emulator em;
  std::vector<std::string> launched;
  const emulator_launcher l{&em, std::int64_t(1) << 24, &launched};
  std::vector<float> params(8), master(8), stats(8), scalars(3);
  std::vector<double> partial(2), sums(2);
  const std::vector<float> grads(8);
  const hk::adafactor_buffers<float> b{stats.data(), nullptr, scalars.data(), partial.data(),
                                       sums.data()};
  const auto step = adafactor_params(optim::adafactor_config{}, 1e-3, 1.0, 1);
  kc::adafactor_step_launch(l, params.data(), static_cast<float*>(nullptr), grads.data(),
                            static_cast<const hk::adafactor_tensor*>(nullptr),
                            hk::adafactor_sizes{0, 0, 0, 8}, b, step, nullptr);
  CHECK(launched.empty());
  using tessera::config_error;
  CHECK_THROWS_WITH(kc::adafactor_step_launch(l, params.data(), master.data(), grads.data(),
                                              static_cast<const hk::adafactor_tensor*>(nullptr),
                                              hk::adafactor_sizes{0, 0, 0, 8}, b, step, nullptr),
                    Catch::Contains("adafactor_step (cuda)") && Catch::Contains("pass master"));
  CHECK_THROWS_WITH(
      kc::adafactor_step_launch(l, params.data(), static_cast<float*>(nullptr), grads.data(),
                                static_cast<const hk::adafactor_tensor*>(nullptr),
                                hk::adafactor_sizes{1, -1, 0, 8}, b, step, nullptr),
      Catch::Contains("rows=-1"));
  auto with_m = adafactor_params(optim::adafactor_config{0.9}, 1e-3, 1.0, 1);
  CHECK_THROWS_WITH(
      kc::adafactor_step_launch(l, params.data(), static_cast<float*>(nullptr), grads.data(),
                                static_cast<const hk::adafactor_tensor*>(nullptr),
                                hk::adafactor_sizes{0, 0, 0, 8}, b, with_m, nullptr),
      Catch::Contains("exp_avg is null"));
  CHECK(launched.empty());
}

TEST_CASE("emulated cuda adafactor_sum_ranks adds the ranks' sums areas as the host does",
          "[kernels][emulated][optimizer]") {
  // The ranks' gathered sums areas (n doubles, stride apart, the gap poisoned):
  // the device adds them in rank order, the host's bits; n 0 launches nothing.
  std::mt19937_64 rng(20261207);
  for (auto [ranks, n, stride] : {std::tuple<int, std::int64_t, std::int64_t>{1, 5, 5},
                                  {2, 37, 40},
                                  {4, 300, 301},
                                  {8, 1025, 1025}}) {
    INFO("ranks " << ranks << " n " << n << " stride " << stride);
    std::vector<double> gathered =
        random_vector<double>(static_cast<std::size_t>(ranks * stride), rng, -1e3, 1e3);
    for (int r = 0; r < ranks; ++r)
      for (std::int64_t j = n; j < stride; ++j)
        gathered[static_cast<std::size_t>(r * stride + j)] = NAN;
    std::vector<double> want(static_cast<std::size_t>(n)), got(want.size(), NAN);
    hk::adafactor_sum_ranks(hk::host_context{}, want.data(), gathered.data(), ranks, n, stride);
    cuda_emulator em(7);
    em.input(gathered);
    em.output(got);
    std::vector<std::string> launched;
    kc::adafactor_sum_ranks_launch(emulator_launcher{&em, std::int64_t(1) << 24, &launched},
                                   got.data(), static_cast<const double*>(gathered.data()), ranks,
                                   n, stride);
    CHECK(launched == std::vector<std::string>{"adafactor_sum_ranks"});
    CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(double)) == 0);
  }
  cuda_emulator em(7);
  std::vector<std::string> launched;
  const emulator_launcher l{&em, std::int64_t(1) << 24, &launched};
  kc::adafactor_sum_ranks_launch(l, static_cast<double*>(nullptr), nullptr, 2, 0, 0);
  CHECK(launched.empty());
  CHECK_THROWS_WITH(
      kc::adafactor_sum_ranks_launch(l, static_cast<double*>(nullptr), nullptr, 2, 8, 7),
      Catch::Contains("stride=7"));
  CHECK_THROWS_WITH(
      kc::adafactor_sum_ranks_launch(l, static_cast<double*>(nullptr), nullptr, 0, 8, 8),
      Catch::Contains("ranks=0"));
}

}  // namespace test_kernels_emulated_optimizer
