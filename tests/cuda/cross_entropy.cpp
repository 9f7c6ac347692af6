// The fused LM head + cross-entropy on the GPU (include/tessera/kernels/cuda/cross_entropy.hpp)
// against a float64 reference of the same bf16 inputs, and the element-wise
// kernels of the CUDA model (residual_add, count_nonfinite in
// kernels/cuda/elementwise.cuh) against the host; the vocabulary-parallel
// form (kernels::lm_head_cross_entropy_vocab_parallel, kernels/cuda/ops.hpp)
// over two ranks emulated by host threads. Fresh seeded random inputs,
// outputs poisoned with NaN (bytes 0xFF) before each launch, dwlm pre-filled
// with known values to check that it accumulates. Skipped without a device
// (main.cpp).
#include <atomic>
#include <barrier>
#include <cstring>
#include <string>
#include <thread>
#include <tuple>

#include <tessera/kernels/cross_entropy.hpp>
#include <tessera/kernels/cuda/cross_entropy.hpp>
#include <tessera/kernels/cuda/kernels.hpp>
#include <tessera/kernels/cuda/ops.hpp>
#include <tessera/kernels/elementwise.hpp>
#include <tessera/kernels/embedding.hpp>

#include "cuda_testing.hpp"

namespace kc = tessera::kernels::cuda;
namespace hk = tessera::kernels;
/// The host context of the reference kernels.
const tessera::kernels::host_context hctx{};
using tessera::bf16;
using namespace tessera::testing;

namespace {

constexpr std::int32_t ignore = -100;

/// The float64 reference of the same bf16 inputs, with the scale of each
/// output's rounding error (sums of absolute terms) for the bounds below.
struct ce_reference {
  double loss_sum = 0;
  double loss_scale = 0;               // sum over scored rows of |loss| + |max| + |z_y|
  std::vector<double> dx, dx_scale;    // (N, H): grad_scale sum_v |g w|
  std::vector<double> dwlm, dw_scale;  // (V, H): dw0 + ..., grad_scale sum_n |g x|
};

ce_reference ce_ref(const std::vector<bf16>& x, const std::vector<bf16>& w,
                    const std::vector<std::int32_t>& targets, std::int64_t N, std::int64_t V,
                    std::int64_t H, double grad_scale, const std::vector<float>& dw0) {
  const auto xd = to_double(x), wd = to_double(w);
  ce_reference r;
  r.dx.assign(static_cast<std::size_t>(N * H), 0.0);
  r.dx_scale = r.dx;
  r.dwlm = to_double(dw0);
  r.dw_scale.assign(r.dwlm.size(), 0.0);
  std::vector<double> z(static_cast<std::size_t>(V)), g(z.size());
  for (std::int64_t n = 0; n < N; ++n) {
    const std::int32_t y = targets[n];
    if (y == ignore) continue;
    const double* xn = xd.data() + n * H;
    double m = -INFINITY;
    for (std::int64_t v = 0; v < V; ++v) {
      double s = 0;
      for (std::int64_t h = 0; h < H; ++h) s += xn[h] * wd[v * H + h];
      z[v] = s;
      m = std::max(m, s);
    }
    double se = 0;
    for (std::int64_t v = 0; v < V; ++v) se += std::exp(z[v] - m);
    const double loss = m + std::log(se) - z[y];
    r.loss_sum += loss;
    r.loss_scale += std::abs(loss) + std::abs(m) + std::abs(z[y]);
    for (std::int64_t v = 0; v < V; ++v)
      g[v] = grad_scale * (std::exp(z[v] - m) / se - (v == y ? 1.0 : 0.0));
    for (std::int64_t v = 0; v < V; ++v)
      for (std::int64_t h = 0; h < H; ++h) {
        const double a = g[v] * wd[v * H + h], b = g[v] * xn[h];
        r.dx[n * H + h] += a;
        r.dx_scale[n * H + h] += std::abs(a);
        r.dwlm[v * H + h] += b;
        r.dw_scale[v * H + h] += std::abs(b);
      }
  }
  return r;
}

/// Largest |got - want| / (rel_scale * scale + rel_want * |want|), +inf on
/// NaN; <= 1 passes. An element with a zero bound must be exactly right.
template <class G>
double bounded_error(const std::vector<G>& got, const std::vector<double>& want,
                     const std::vector<double>& scale, double rel_scale, double rel_want) {
  REQUIRE(got.size() == want.size());
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = as_double(got[i]);
    if (std::isnan(g)) return INFINITY;
    const double err = std::abs(g - want[i]);
    const double bound = rel_scale * scale[i] + rel_want * std::abs(want[i]);
    if (err > 0) worst = std::max(worst, bound > 0 ? err / bound : INFINITY);
  }
  return worst;
}

// Tolerances (STYLE.md: named and justified next to the assertion). bf16
// rounding errs by at most 2^-8 (bf16_tol) of the value; float32 work by
// far less than f32_tol of the terms it adds (random signs).
// - dx (bf16): the logit gradient is rounded to bf16 before the GEMM (at most
//   bf16_tol of each term: bf16_tol * dx_scale), the float32 GEMM adds
//   f32_tol * dx_scale, and the result is rounded once to bf16 (bf16_tol |dx|).
constexpr double dx_rel_scale = bf16_tol + f32_tol, dx_rel_value = bf16_tol;
// - dwlm (float32): the same bf16 rounding of the logit gradient and float32
//   GEMM (bf16_tol + f32_tol of dw_scale), added to dw0 in float32 (f32_tol |dwlm|).
constexpr double dw_rel_scale = bf16_tol + f32_tol, dw_rel_value = f32_tol;
// - loss (float64 sum of float32 rows): each row is max + log(sum) - z_y in
//   float32 from float32 logits of H bf16 products: f32_tol of those terms
//   (loss_scale). A host simulation of the kernels' arithmetic (float
//   logits, 256-way online states merged in a tree, bf16 gradient, float
//   GEMMs) on these three problems reached 0.53 (dx), 0.95 (dwlm, a single
//   term rounded near the worst case) and 0.001 (loss) of these bounds.

/// Random targets in [0, V), every 5th row ignored, plus rows [7, 14) (one
/// whole chunk of 7 with nothing to score).
std::vector<std::int32_t> make_targets(std::int64_t N, std::int64_t V, std::mt19937_64& rng) {
  std::vector<std::int32_t> t(static_cast<std::size_t>(N));
  for (std::int64_t n = 0; n < N; ++n)
    t[n] = (n % 5 == 3 || (n >= 7 && n < 14)) ? ignore : static_cast<std::int32_t>(rng() % V);
  return t;
}

std::int64_t scored(const std::vector<std::int32_t>& t) {
  return static_cast<std::int64_t>(
      std::count_if(t.begin(), t.end(), [](auto y) { return y != ignore; }));
}

/// Results of one call.
struct ce_run {
  double loss;
  std::vector<bf16> dx;
  std::vector<float> dwlm;
};

/// Runs lm_head_cross_entropy with poisoned outputs (dwlm starts at dw0);
/// train = false passes null gradients.
ce_run run_ce(kc::cublaslt_context& ctx, tessera::cuda::stream& s, const std::vector<bf16>& x,
              const std::vector<bf16>& w, const std::vector<std::int32_t>& targets,
              const std::vector<float>& dw0, std::int64_t N, std::int64_t V, std::int64_t H,
              float grad_scale, std::int64_t chunk, bool train = true) {
  auto d_x = to_device(x), d_w = to_device(w);
  auto d_t = to_device(targets);
  auto d_loss = poisoned_device<double>(1);
  auto d_dx = poisoned_device<bf16>(static_cast<std::size_t>(N * H));
  auto d_dw = to_device(dw0);
  const std::size_t sb = kc::lm_head_cross_entropy_scratch_bytes(N, V, H, chunk);
  auto scratch = poisoned_device<char>(sb);
  kc::lm_head_cross_entropy(ctx, d_loss.data(), d_x.data(), d_w.data(), d_t.data(), N, V, H, ignore,
                            grad_scale, train ? d_dx.data() : nullptr,
                            train ? d_dw.data() : nullptr, chunk, scratch.data(), sb, s);
  s.synchronize();
  return {to_host(d_loss)[0], to_host(d_dx), to_host(d_dw)};
}

/// What one emulated tp rank of the vocabulary-parallel head returns.
struct vp_rank_run {
  double loss = 0;
  std::vector<double> dx;    // (N, H) this rank's partial sum (empty: evaluation)
  std::vector<bool> dx_zero; // (N, H) whether each dx element's bits are +0
  std::vector<float> dwlm;   // (Vl, H) this rank's rows
  std::string error;         // an exception's message (threads cannot use Catch)
};

/// tp = 2 on one GPU: rank r (a host thread with its own context and
/// stream) holds rows [r Vl, (r + 1) Vl) of the vocabulary padded to 2 Vl,
/// the padding rows' weights set to 30 (they would dominate the softmax if
/// they entered it); its reduce callback combines both ranks' statistics
/// through host memory, rank 0's values first. dwlm starts at dw0 (0 on
/// padding rows). GA: dx's type (bf16, or float through the bf16 scratch);
/// train = false passes null gradients. A rank that fails drops out of the
/// barrier and flags it, so the other fails too instead of waiting.
template <class GA>
std::vector<vp_rank_run> run_vp(const std::vector<bf16>& x, const std::vector<bf16>& w,
                                const std::vector<std::int32_t>& targets,
                                const std::vector<float>& dw0, std::int64_t N, std::int64_t V,
                                std::int64_t H, float grad_scale, std::int64_t chunk,
                                bool train = true) {
  constexpr int tp = 2;
  const std::int64_t Vl = (V + tp - 1) / tp;
  std::barrier<> sync(tp);
  std::atomic<bool> failed{false};
  std::vector<float> slot[tp];
  std::vector<vp_rank_run> out(tp);
  auto rank = [&](int r) {
    try {
      TESSERA_CUDA_CHECK(cudaSetDevice(0));
      tessera::kernels::cuda_context ctx;
      std::vector<bf16> wl(static_cast<std::size_t>(Vl * H), tessera::to<bf16>(30.0f));
      std::vector<float> dwl(static_cast<std::size_t>(Vl * H), 0.0f);
      for (std::int64_t v = r * Vl; v < std::min(V, (r + 1) * Vl); ++v)
        for (std::int64_t h = 0; h < H; ++h) {
          wl[(v - r * Vl) * H + h] = w[v * H + h];
          dwl[(v - r * Vl) * H + h] = dw0[v * H + h];
        }
      auto d_x = to_device(x), d_w = to_device(wl);
      auto d_t = to_device(targets);
      auto d_dw = to_device(dwl);
      auto d_loss = poisoned_device<double>(1);
      auto d_dx = poisoned_device<GA>(static_cast<std::size_t>(N * H));
      auto reduce = [&](bool max, float* v, std::int64_t n) {
        slot[r].resize(static_cast<std::size_t>(n));
        ctx.to_host(slot[r].data(), v, slot[r].size() * sizeof(float));
        sync.arrive_and_wait();
        if (failed) throw std::runtime_error("the other rank failed");
        std::vector<float> c(slot[r].size());
        for (std::size_t i = 0; i < c.size(); ++i)
          c[i] = max ? std::max(slot[0][i], slot[1][i]) : slot[0][i] + slot[1][i];
        sync.arrive_and_wait();  // both have read both slots
        ctx.from_host(v, c.data(), c.size() * sizeof(float));
      };
      tessera::kernels::lm_head_cross_entropy_vocab_parallel(
          ctx, d_loss.data(), d_x.data(), d_w.data(), d_t.data(), N, V, r * Vl, Vl, H, ignore,
          grad_scale, train ? d_dx.data() : nullptr, train ? d_dw.data() : nullptr, chunk,
          reduce);
      ctx.synchronize();
      vp_rank_run& o = out[static_cast<std::size_t>(r)];
      o.loss = to_host(d_loss)[0];
      if (train) {
        for (const GA& g : to_host(d_dx)) {
          o.dx.push_back(as_double(g));
          o.dx_zero.push_back(std::signbit(as_double(g)) == 0 && as_double(g) == 0.0);
        }
      }
      o.dwlm = to_host(d_dw);
    } catch (const std::exception& e) {
      out[static_cast<std::size_t>(r)].error = e.what();
      failed = true;
      sync.arrive_and_drop();
    }
  };
  std::thread t0(rank, 0), t1(rank, 1);
  t0.join();
  t1.join();
  return out;
}

/// The two ranks' run against the float64 reference of the whole vocabulary.
void check_vp(const std::vector<vp_rank_run>& runs, const ce_reference& ref, std::int64_t N,
              std::int64_t V, std::int64_t H, const std::vector<std::int32_t>& targets) {
  const std::int64_t Vl = (V + 1) / 2;
  for (const auto& r : runs) {
    INFO(r.error);
    REQUIRE(r.error.empty());
  }
  // Every rank reduces the same statistics in the same order: the same loss bits.
  CHECK(std::memcmp(&runs[0].loss, &runs[1].loss, sizeof(double)) == 0);
  CHECK(std::abs(runs[0].loss - ref.loss_sum) <= f32_tol * ref.loss_scale);
  if (runs[0].dx.empty()) return;  // evaluation
  // dx: the sum of two partial sums, each rounded once to bf16 (bf16_tol
  // of its own terms, which dx_scale bounds), after the dense bounds.
  std::vector<double> dx(static_cast<std::size_t>(N * H));
  for (std::size_t i = 0; i < dx.size(); ++i) dx[i] = runs[0].dx[i] + runs[1].dx[i];
  CHECK(bounded_error(dx, ref.dx, ref.dx_scale, dx_rel_scale + bf16_tol, dx_rel_value) <= 1.0);
  for (std::int64_t n = 0; n < N; ++n)
    if (targets[n] == ignore)
      for (int r = 0; r < 2; ++r)
        for (std::int64_t h = 0; h < H; ++h) REQUIRE(runs[r].dx_zero[n * H + h]);
  // dwlm: each rank's rows as the dense kernel's bounds; padding untouched (0).
  for (int r = 0; r < 2; ++r) {
    std::vector<float> got;
    std::vector<double> want, scale;
    for (std::int64_t v = r * Vl; v < (r + 1) * Vl; ++v)
      for (std::int64_t h = 0; h < H; ++h) {
        const float g = runs[r].dwlm[(v - r * Vl) * H + h];
        if (v >= V) {
          REQUIRE(g == 0.0f);  // padding: no gradient
          continue;
        }
        got.push_back(g);
        want.push_back(ref.dwlm[v * H + h]);
        scale.push_back(ref.dw_scale[v * H + h]);
      }
    CHECK(bounded_error(got, want, scale, dw_rel_scale, dw_rel_value) <= 1.0);
  }
}

}  // namespace

TEST_CASE("cuda vocabulary-parallel cross-entropy over tp 2 equals the whole vocabulary's",
          "[cuda][cross_entropy][tp]") {
  std::mt19937_64 rng(305);
  const std::int64_t N = 40, V = 257, H = 64;  // padded to 258: one padding row on rank 1
  const auto x = random_vector<bf16>(static_cast<std::size_t>(N * H), rng);
  const auto w = random_vector<bf16>(static_cast<std::size_t>(V * H), rng);
  const auto dw0 = random_vector<float>(static_cast<std::size_t>(V * H), rng, -0.01, 0.01);
  SECTION("targets on both ranks, ignored rows and an ignored chunk") {
    const auto targets = make_targets(N, V, rng);
    const float grad_scale = 1.0f / static_cast<float>(scored(targets));
    const ce_reference ref = ce_ref(x, w, targets, N, V, H, grad_scale, dw0);
    for (std::int64_t chunk : {std::int64_t(7), N}) {
      INFO("chunk=" << chunk);
      check_vp(run_vp<bf16>(x, w, targets, dw0, N, V, H, grad_scale, chunk), ref, N, V, H,
               targets);
    }
    // A float32 dx (through the bf16 scratch) and evaluation (no gradients,
    // the same loss bits).
    const auto f32 = run_vp<float>(x, w, targets, dw0, N, V, H, grad_scale, 7);
    check_vp(f32, ref, N, V, H, targets);
    const auto eval = run_vp<bf16>(x, w, targets, dw0, N, V, H, grad_scale, 7, false);
    check_vp(eval, ref, N, V, H, targets);
    CHECK(std::memcmp(&eval[0].loss, &f32[0].loss, sizeof(double)) == 0);
    for (int r = 0; r < 2; ++r)  // evaluation leaves dwlm as it was: dw0's rows, 0 on padding
      for (std::int64_t v = r * 129; v < (r + 1) * 129; ++v)
        for (std::int64_t h = 0; h < H; ++h)
          REQUIRE(eval[r].dwlm[(v - r * 129) * H + h] == (v < V ? dw0[v * H + h] : 0.0f));
  }
  SECTION("a target outside [0, V) makes the loss NaN on both ranks") {
    auto targets = make_targets(N, V, rng);
    targets[2] = static_cast<std::int32_t>(V);  // the padding row's index: no rank owns it
    const auto runs = run_vp<bf16>(x, w, targets, dw0, N, V, H, 1.0f / 40, 16);
    for (const auto& r : runs) {
      INFO(r.error);
      REQUIRE(r.error.empty());
      CHECK(std::isnan(r.loss));
    }
  }
  SECTION("every target owned by rank 1 (the one with the padding row)") {
    auto targets = make_targets(N, V, rng);
    for (auto& t : targets)
      if (t != ignore) t = static_cast<std::int32_t>(129 + rng() % (V - 129));
    const float grad_scale = 1.0f / static_cast<float>(scored(targets));
    const ce_reference ref = ce_ref(x, w, targets, N, V, H, grad_scale, dw0);
    check_vp(run_vp<bf16>(x, w, targets, dw0, N, V, H, grad_scale, 16), ref, N, V, H, targets);
  }
}

TEST_CASE("cuda embedding_local_ids maps the ids of a vocabulary slice", "[cuda][embedding][tp]") {
  const std::vector<std::int32_t> ids = {0, 128, 129, 256, ignore, 200, 5};
  auto d = to_device(ids);
  auto o = poisoned_device<std::int32_t>(ids.size());
  tessera::kernels::cuda_context ctx;
  std::vector<std::int32_t> want(ids.size());
  tessera::kernels::embedding_local_ids(hctx, want.data(), ids.data(), 7, 257, 129, 129, ignore);
  tessera::kernels::embedding_local_ids(ctx, o.data(), d.data(), 7, 257, 129, 129, ignore);
  ctx.synchronize();
  CHECK(to_host(o) == want);
  CHECK(want == std::vector<std::int32_t>{ignore, ignore, 0, 127, ignore, 71, ignore});
}

TEST_CASE("cuda lm_head_cross_entropy matches float64 for chunks 1, 7, N and > N",
          "[cuda][cross_entropy]") {
  std::mt19937_64 rng(301);
  tessera::cuda::stream s;
  kc::cublaslt_context ctx;
  const std::int64_t N = 67, V = 997, H = 64;  // V odd: the scalar path of the row kernel
  const auto x = random_vector<bf16>(static_cast<std::size_t>(N * H), rng);
  const auto w = random_vector<bf16>(static_cast<std::size_t>(V * H), rng);
  const auto targets = make_targets(N, V, rng);
  const auto dw0 = random_vector<float>(static_cast<std::size_t>(V * H), rng, -0.01, 0.01);
  // The global count: three micro-batches of this size (grad_scale known on the host).
  const float grad_scale = 1.0f / static_cast<float>(3 * scored(targets));
  const ce_reference ref = ce_ref(x, w, targets, N, V, H, grad_scale, dw0);
  for (std::int64_t chunk : {std::int64_t(1), std::int64_t(7), N, N + 33}) {
    INFO("chunk=" << chunk);
    const ce_run r = run_ce(ctx, s, x, w, targets, dw0, N, V, H, grad_scale, chunk);
    CHECK(std::abs(r.loss - ref.loss_sum) <= f32_tol * ref.loss_scale);
    CHECK(first_nan(r.dx) == -1);
    CHECK(first_nan(r.dwlm) == -1);
    CHECK(bounded_error(r.dx, ref.dx, ref.dx_scale, dx_rel_scale, dx_rel_value) <= 1.0);
    CHECK(bounded_error(r.dwlm, ref.dwlm, ref.dw_scale, dw_rel_scale, dw_rel_value) <= 1.0);
    // Ignored rows of dx: exactly +0 (bits 0), whatever the GEMM did.
    for (std::int64_t n = 0; n < N; ++n)
      if (targets[n] == ignore)
        for (std::int64_t h = 0; h < H; ++h) REQUIRE(r.dx[n * H + h].bits == 0);
  }
}

TEST_CASE("cuda lm_head_cross_entropy: vector path, the host kernel, evaluation mode",
          "[cuda][cross_entropy]") {
  std::mt19937_64 rng(302);
  tessera::cuda::stream s;
  kc::cublaslt_context ctx;
  const std::int64_t N = 40, V = 1000, H = 128;  // V % 4 == 0: 16-byte loads
  const auto x = random_vector<bf16>(static_cast<std::size_t>(N * H), rng);
  const auto w = random_vector<bf16>(static_cast<std::size_t>(V * H), rng, -0.5, 0.5);
  const auto targets = make_targets(N, V, rng);
  const auto dw0 = random_vector<float>(static_cast<std::size_t>(V * H), rng, -0.01, 0.01);
  const float grad_scale = 1.0f / static_cast<float>(scored(targets));
  const ce_reference ref = ce_ref(x, w, targets, N, V, H, grad_scale, dw0);

  // The reference agrees with the host kernel in float64.
  {
    const auto xd = to_double(x), wd = to_double(w);
    std::vector<double> hdx(static_cast<std::size_t>(N * H)), hdw = to_double(dw0);
    struct {
      double loss_sum = 0;
    } hr;
    hk::lm_head_cross_entropy(hctx, &hr.loss_sum, xd.data(), wd.data(), targets.data(), N, V, H,
                              ignore, static_cast<double>(grad_scale), hdx.data(), hdw.data(), 16);
    CHECK(std::abs(hr.loss_sum - ref.loss_sum) <= 1e-12 * ref.loss_scale);
    CHECK(max_rel_error(hdx, ref.dx) < 1e-12);
    CHECK(max_rel_error(hdw, ref.dwlm) < 1e-12);
  }

  const ce_run r = run_ce(ctx, s, x, w, targets, dw0, N, V, H, grad_scale, 16);
  CHECK(std::abs(r.loss - ref.loss_sum) <= f32_tol * ref.loss_scale);
  CHECK(bounded_error(r.dx, ref.dx, ref.dx_scale, dx_rel_scale, dx_rel_value) <= 1.0);
  CHECK(bounded_error(r.dwlm, ref.dwlm, ref.dw_scale, dw_rel_scale, dw_rel_value) <= 1.0);

  // Evaluation (no gradients): the same loss bits; dx and dwlm untouched.
  const ce_run e = run_ce(ctx, s, x, w, targets, dw0, N, V, H, grad_scale, 16, /*train=*/false);
  CHECK(std::memcmp(&e.loss, &r.loss, sizeof(double)) == 0);
  CHECK(same_bits(e.dwlm, dw0));
  for (const bf16& v : e.dx) REQUIRE(v.bits == 0xFFFF);  // still the poison
}

TEST_CASE("cuda lm_head_cross_entropy at V = 32000 is correct and deterministic",
          "[cuda][cross_entropy]") {
  std::mt19937_64 rng(303);
  tessera::cuda::stream s;
  kc::cublaslt_context ctx;
  const std::int64_t N = 24, V = 32000, H = 64;
  const auto x = random_vector<bf16>(static_cast<std::size_t>(N * H), rng);
  const auto w = random_vector<bf16>(static_cast<std::size_t>(V * H), rng);
  const auto targets = make_targets(N, V, rng);
  const auto dw0 = random_vector<float>(static_cast<std::size_t>(V * H), rng, -0.01, 0.01);
  const float grad_scale = 1.0f / static_cast<float>(scored(targets));
  const ce_reference ref = ce_ref(x, w, targets, N, V, H, grad_scale, dw0);
  const ce_run a = run_ce(ctx, s, x, w, targets, dw0, N, V, H, grad_scale, 7);
  const ce_run b = run_ce(ctx, s, x, w, targets, dw0, N, V, H, grad_scale, 7);
  CHECK(std::abs(a.loss - ref.loss_sum) <= f32_tol * ref.loss_scale);
  CHECK(bounded_error(a.dx, ref.dx, ref.dx_scale, dx_rel_scale, dx_rel_value) <= 1.0);
  CHECK(bounded_error(a.dwlm, ref.dwlm, ref.dw_scale, dw_rel_scale, dw_rel_value) <= 1.0);
  // Determinism: two runs, the same bits (fixed-order reductions, no atomics).
  CHECK(std::memcmp(&a.loss, &b.loss, sizeof(double)) == 0);
  CHECK(same_bits(a.dx, b.dx));
  CHECK(same_bits(a.dwlm, b.dwlm));
}

TEST_CASE("cuda lm_head_cross_entropy: a target outside [0, V) shows as NaN",
          "[cuda][cross_entropy]") {
  std::mt19937_64 rng(304);
  tessera::cuda::stream s;
  kc::cublaslt_context ctx;
  const std::int64_t N = 12, V = 1000, H = 64;
  const auto x = random_vector<bf16>(static_cast<std::size_t>(N * H), rng);
  const auto w = random_vector<bf16>(static_cast<std::size_t>(V * H), rng);
  std::vector<std::int32_t> targets(static_cast<std::size_t>(N));
  for (auto& t : targets) t = static_cast<std::int32_t>(rng() % V);
  auto bad = targets;
  bad[2] = static_cast<std::int32_t>(V);  // one past the vocabulary
  bad[9] = -5;                            // negative, not the ignore index
  const std::vector<float> dw0(static_cast<std::size_t>(V * H), 0.f);
  const float grad_scale = 0.125f;
  const ce_run r = run_ce(ctx, s, x, w, bad, dw0, N, V, H, grad_scale, 5);
  CHECK(std::isnan(r.loss));
  // The bad rows' dx are NaN; every other row is what it would be with the
  // bad rows ignored (a row's dx depends on its own logits only).
  auto as_ignored = bad;
  as_ignored[2] = as_ignored[9] = ignore;
  const ce_reference ref = ce_ref(x, w, as_ignored, N, V, H, grad_scale, dw0);
  for (std::int64_t n = 0; n < N; ++n) {
    INFO("row " << n);
    std::vector<bf16> row(r.dx.begin() + n * H, r.dx.begin() + (n + 1) * H);
    if (n == 2 || n == 9) {
      for (const bf16& v : row) REQUIRE(std::isnan(as_double(v)));
    } else {
      const std::vector<double> want(ref.dx.begin() + n * H, ref.dx.begin() + (n + 1) * H),
          sc(ref.dx_scale.begin() + n * H, ref.dx_scale.begin() + (n + 1) * H);
      CHECK(bounded_error(row, want, sc, dx_rel_scale, dx_rel_value) <= 1.0);
    }
  }
  CHECK(first_nan(r.dwlm) != -1);  // the step's inf/NaN check sees it
}

TEST_CASE("cuda lm_head_cross_entropy: N = 0 and argument errors", "[cuda][cross_entropy]") {
  tessera::cuda::stream s;
  kc::cublaslt_context ctx;
  const std::int64_t N = 4, V = 8, H = 16, chunk = 2;
  std::mt19937_64 rng(305);
  auto d_x = to_device(random_vector<bf16>(static_cast<std::size_t>(N * H), rng));
  auto d_w = to_device(random_vector<bf16>(static_cast<std::size_t>(V * H), rng));
  auto d_t = to_device(std::vector<std::int32_t>{1, 2, 3, 4});
  auto d_loss = poisoned_device<double>(1);
  auto d_dx = poisoned_device<bf16>(static_cast<std::size_t>(N * H));
  auto d_dw = poisoned_device<float>(static_cast<std::size_t>(V * H));
  const std::size_t sb = kc::lm_head_cross_entropy_scratch_bytes(N, V, H, chunk);
  auto scratch = poisoned_device<char>(sb + 512);

  // N = 0: the loss sum is 0, nothing else is touched (null inputs allowed).
  kc::lm_head_cross_entropy(ctx, d_loss.data(), nullptr, nullptr, nullptr, 0, V, H, ignore, 1.0f,
                            d_dx.data(), d_dw.data(), chunk, scratch.data(), sb, s);
  s.synchronize();
  CHECK(to_host(d_loss)[0] == 0.0);
  for (const bf16& v : to_host(d_dx)) REQUIRE(v.bits == 0xFFFF);

  auto call = [&](double* loss, std::int64_t n, std::int64_t v, std::int64_t h, std::int64_t c,
                  bf16* dx, float* dw, void* scr, std::size_t bytes) {
    kc::lm_head_cross_entropy(ctx, loss, d_x.data(), d_w.data(), d_t.data(), n, v, h, ignore, 1.0f,
                              dx, dw, c, scr, bytes, s);
  };
  using tessera::config_error;
  void* scr = scratch.data();
  CHECK_THROWS_AS(call(d_loss.data(), -1, V, H, chunk, d_dx.data(), d_dw.data(), scr, sb),
                  config_error);
  CHECK_THROWS_AS(call(d_loss.data(), N, 0, H, chunk, d_dx.data(), d_dw.data(), scr, sb),
                  config_error);
  CHECK_THROWS_AS(call(d_loss.data(), N, V, 0, chunk, d_dx.data(), d_dw.data(), scr, sb),
                  config_error);
  CHECK_THROWS_AS(call(d_loss.data(), N, V, H, 0, d_dx.data(), d_dw.data(), scr, sb), config_error);
  CHECK_THROWS_AS(call(d_loss.data(), N, V, H, chunk, d_dx.data(), nullptr, scr, sb), config_error);
  CHECK_THROWS_AS(call(d_loss.data(), N, V, H, chunk, nullptr, d_dw.data(), scr, sb), config_error);
  CHECK_THROWS_AS(call(nullptr, N, V, H, chunk, d_dx.data(), d_dw.data(), scr, sb), config_error);
  CHECK_THROWS_AS(call(d_loss.data(), N, V, H, chunk, d_dx.data(), d_dw.data(), scr, sb - 1),
                  config_error);
  CHECK_THROWS_AS(call(d_loss.data(), N, V, H, chunk, d_dx.data(), d_dw.data(), nullptr, sb),
                  config_error);
  CHECK_THROWS_AS(call(d_loss.data(), N, V, H, chunk, d_dx.data(), d_dw.data(),
                       static_cast<char*>(scr) + 16, sb),
                  config_error);  // not 256-byte aligned
  CHECK_THROWS_AS(
      kc::lm_head_cross_entropy(ctx, d_loss.data(), nullptr, d_w.data(), d_t.data(), N, V, H,
                                ignore, 1.0f, nullptr, nullptr, chunk, scr, sb, s),
      config_error);
  // Nothing was written by the refused calls.
  s.synchronize();
  for (const bf16& v : to_host(d_dx)) REQUIRE(v.bits == 0xFFFF);
}

namespace {
/// residual_add on the device against the host's bits, out of place and in
/// place (out = a, then out = b), at an element offset (misaligned: scalar path).
template <class T>
void check_residual_add(std::int64_t n, int offset, std::mt19937_64& rng,
                        tessera::cuda::stream& s) {
  const auto un = static_cast<std::size_t>(n + offset);
  const auto a = random_vector<T>(un, rng, -3, 3), b = random_vector<T>(un, rng, -3, 3);
  std::vector<T> want(a.size());
  hk::residual_add(hctx, want.data() + offset, a.data() + offset, b.data() + offset, n);
  auto d_a = to_device(a), d_b = to_device(b), d_a2 = to_device(a), d_b2 = to_device(b);
  auto d_out = poisoned_device<T>(un);
  kc::residual_add(d_out.data() + offset, d_a.data() + offset, d_b.data() + offset, n, s);
  kc::residual_add(d_a.data() + offset, d_a.data() + offset, d_b.data() + offset, n, s);
  kc::residual_add(d_b2.data() + offset, d_a2.data() + offset, d_b2.data() + offset, n, s);
  s.synchronize();
  for (auto* d : {&d_out, &d_a, &d_b2}) {
    auto got = to_host(*d);
    CHECK(std::memcmp(got.data() + offset, want.data() + offset,
                      static_cast<std::size_t>(n) * sizeof(T)) == 0);
  }
}
}  // namespace

TEST_CASE("cuda residual_add gives the host's bits, in place too", "[cuda][residual_add]") {
  std::mt19937_64 rng(306);
  tessera::cuda::stream s;
  for (auto [n, offset] : {std::tuple<std::int64_t, int>{(std::int64_t(1) << 20) + 3, 0},
                           {777, 0},
                           {4099, 1}}) {  // misaligned: scalar path
    INFO("n=" << n << " offset=" << offset);
    check_residual_add<float>(n, offset, rng, s);
    check_residual_add<bf16>(n, offset, rng, s);
  }
  float* none = nullptr;
  CHECK_THROWS_AS(kc::residual_add(none, none, none, -1, s), tessera::config_error);
}

TEST_CASE("cuda count_nonfinite flags inf and NaN and never clears", "[cuda][count_nonfinite]") {
  std::mt19937_64 rng(307);
  tessera::cuda::stream s;
  auto d_flag = to_device(std::vector<std::int32_t>{0});
  auto flag = [&] { return to_host(d_flag)[0]; };
  auto reset = [&](std::int32_t v) {
    TESSERA_CUDA_CHECK(cudaMemcpy(d_flag.data(), &v, sizeof v, cudaMemcpyHostToDevice));
  };
  const std::int64_t n = (std::int64_t(1) << 20) + 5;  // a scalar tail after the vector body
  const auto un = static_cast<std::size_t>(n);
  SECTION("float") {
    auto g = random_vector<float>(un, rng, -1e30, 1e30);
    g[1] = -0.0f;
    g[2] = 1e-45f;                             // smallest subnormal
    g[3] = std::numeric_limits<float>::max();  // finite
    g[4] = -std::numeric_limits<float>::max();
    for (auto [pos, bad, offset] :
         {std::tuple<std::int64_t, float, int>{-1, 0.f, 0},     // all finite
          {n - 1, INFINITY, 0},                                 // in the tail
          {n / 2, std::numeric_limits<float>::quiet_NaN(), 0},  // in the vector body
          {1, -INFINITY, 1}}) {                                 // misaligned: scalar path
      INFO("pos=" << pos << " offset=" << offset);
      auto h = g;
      if (pos >= 0) h[pos] = bad;
      auto d_g = to_device(h);
      reset(0);
      kc::count_nonfinite(d_flag.data(), d_g.data() + offset, n - offset, s);
      s.synchronize();
      CHECK(flag() == (pos >= offset ? 1 : 0));
    }
    // Never clears: a finite buffer leaves a set flag set.
    auto d_g = to_device(g);
    reset(1);
    kc::count_nonfinite(d_flag.data(), d_g.data(), n, s);
    s.synchronize();
    CHECK(flag() == 1);
  }
  SECTION("bf16") {
    auto g = random_vector<bf16>(un, rng, -1e30, 1e30);
    g[1] = bf16::from_bits(0x8000);  // -0
    g[2] = bf16::from_bits(0x0001);  // smallest subnormal
    g[3] = bf16::from_bits(0x7f7f);  // largest finite
    for (auto [pos, bits] : {std::tuple<std::int64_t, std::uint16_t>{-1, 0},
                             {n - 1, 0x7f80},  // +inf, in the tail
                             {n / 3, 0xffc1},  // a negative NaN
                             {0, 0xff80}}) {   // -inf, first element
      INFO("pos=" << pos);
      auto h = g;
      if (pos >= 0) h[pos] = bf16::from_bits(bits);
      auto d_g = to_device(h);
      reset(0);
      kc::count_nonfinite(d_flag.data(), d_g.data(), n, s);
      s.synchronize();
      CHECK(flag() == (pos >= 0 ? 1 : 0));
    }
  }
  reset(0);
  kc::count_nonfinite(d_flag.data(), static_cast<const float*>(nullptr), 0, s);  // n = 0: nothing
  s.synchronize();
  CHECK(flag() == 0);
  CHECK_THROWS_AS(kc::count_nonfinite(d_flag.data(), static_cast<const float*>(nullptr), -1, s),
                  tessera::config_error);
}
