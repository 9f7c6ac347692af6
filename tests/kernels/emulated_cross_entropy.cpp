// The row kernels of the fused LM head and cross-entropy
// (include/tessera/kernels/cuda/cross_entropy.cuh), their own bodies run by
// the block emulator (tests/support/cuda_emulator.hpp) through the launch
// functions the GPU path calls, against the host kernels of
// include/tessera/kernels/cross_entropy.hpp, on fresh random logits with
// NaN-poisoned outputs: V = 1, 7, 1001 (the scalar variant), 1000 and the
// Llama vocabularies 32000 and 128256 (the 16-byte variant), a misaligned
// pointer (scalar), ignored rows, targets outside [0, V), grad_scale,
// evaluation (no dlogits), vocabulary slices with padding, and the chunk
// loop's end (ignored dx rows zeroed, the loss summed).
//
// The host reference of a row: kernels::lm_head_cross_entropy (and its
// vocab-parallel form) with H = 1, x = 1 and wlm = the row's logits (V, 1),
// so its GEMMs are exact: the logits are the row's (1 * z), dwlm from 0 is
// the host's float32 logit gradient (d * 1 + 0) and *loss_sum the row's
// loss. The host takes the row max first, then the sum of exp in order; the
// GPU keeps an online (max, sum) per thread merged in CUB's block tree
// (ce_softmax), or sums in that tree (vp_ce_row_sums). The max is exact
// either way. The tree's sum is within f32_tol of a float64 sum of the same
// float32 terms (checked for vp_ce_row_sums); the host's, one term at a
// time into a float32 total, drops every term below half an ulp of the
// running sum, a bias of up to (n - 1) u (Higham, gamma_{n-1}); measured
// 2.4e-5 at n = 25652 logits in [-8, 8]. host_sum_tol = 1e-4 bounds it at
// the sizes here. So, against the host:
// - the sums within host_sum_tol, relative;
// - a row loss (max + log sum - z_y, float32) within f32_tol of
//   |max| + |z_y| + log V + 1 (the magnitude its float32 terms round at)
//   plus host_sum_tol (log(1 + d) <= d);
// - a bf16 logit gradient within bf16_tol + host_sum_tol of the host's
//   float32 one: one rounding to bf16 (at most 2^-8 relative) of a value
//   that close to it; an fp16 one (precision::fp16_mixed) within fp16_tol +
//   host_sum_tol, likewise.
// Bit for bit where the order is the same: the vocab-parallel row maxima,
// the owned target logits, and vp_ce_row_grad given the host's reduced max
// and sums (row loss and bf16(host dlogit) exactly); the zeroed dx rows and
// the untouched ones. ce_softmax is also checked bit for bit against the
// kernel's documented order restated here (block_order_normaliser: each
// thread folds its strided logits with ce_online_update, then CUB's
// warp-reductions tree as the emulator applies it), which pins the row
// arithmetic (1 / sum once, then per-logit ce_dlogit) and the variant W. The
// loss sum (one block: strided per thread, then the tree) against the host's
// sum in row order within 2 N 2^-53 of sum |loss| (float64 adds, another order).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <tessera/kernels/cross_entropy.hpp>
#include <tessera/kernels/cuda/cross_entropy.cuh>

#include "../support/cuda_emulator.hpp"
#include "kernel_testing.hpp"

namespace test_kernels_emulated_cross_entropy {

namespace kc = tessera::kernels::cuda;
namespace hk = tessera::kernels;
namespace hd = tessera::kernels::detail;
using tessera::bf16;
using tessera::fp16;
using namespace tessera::testing;

namespace {

constexpr std::int32_t ignore = -100;
constexpr std::int64_t V2 = 32000, V3 = 128256;  // Llama 2 and Llama 3 vocabularies
constexpr int threads = kc::lm_head_ce_threads;
/// The host's in-order float32 sum of exp against any other order (above).
constexpr double host_sum_tol = 1e-4;
/// A loss against the host's; a bf16 logit gradient against the host's float32.
double loss_tol(double scale) {
  return f32_tol * scale + host_sum_tol;
}
template <class T>
constexpr double dlogit_tol = tol_of<T> + host_sum_tol;
/// max_rel_error of a 16-bit logit gradient against the host's float32 one,
/// except that for fp16 an element is measured against at least fp16's
/// smallest normal, 2^-14: below it fp16 rounds to an absolute 2^-25 (its
/// subnormal step's half), which no relative bound covers (a vocabulary
/// slice of two small probabilities, or a tiny grad_scale). In training the
/// loss scale keeps the gradients above it.
template <class T>
double dlogit_error(const std::vector<T>& got, const std::vector<float>& want) {
  if constexpr (!std::is_same_v<T, fp16>) {
    return max_rel_error(got, want);
  } else {
    REQUIRE(got.size() == want.size());
    double ss = 0;
    for (float w : want) ss += double(w) * w;
    const double rms = std::sqrt(ss / static_cast<double>(std::max<std::size_t>(1, want.size())));
    double worst = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      const double g = as_double(got[i]), w = want[i];
      if (std::isnan(g) || std::isnan(w)) return INFINITY;
      worst = std::max(worst, std::abs(g - w) / std::max({std::abs(w), rms, 0x1p-14}));
    }
    return worst;
  }
}
using strings = std::vector<std::string>;
using state = hd::ce_online<float>;

std::size_t sz(std::int64_t n) {
  return static_cast<std::size_t>(n);
}

/// The host's loss and float32 logit gradient of one row `z` (V) with
/// target y: kernels::lm_head_cross_entropy with H = 1, x = 1, wlm = z.
struct host_row {
  double loss = 0;
  std::vector<float> dlogits;
};
host_row host_ce_row(const float* z, std::int64_t V, std::int32_t y, float grad_scale) {
  const float one = 1.f;
  float dx = 0.f;
  host_row r;
  r.dlogits.assign(sz(V), 0.f);
  hk::lm_head_cross_entropy<float, float, float>(ctx, &r.loss, &one, z, &y, 1, V, 1, ignore,
                                                 grad_scale, &dx, r.dlogits.data(), 1);
  return r;
}

/// The magnitude a row loss's float32 terms round at.
double loss_scale(const float* z, std::int64_t V, std::int32_t y) {
  const float mx = *std::max_element(z, z + V);
  return std::abs(mx) + std::abs(z[y]) + std::log(static_cast<double>(V)) + 1;
}

/// ce_softmax's normaliser in its own order: thread t folds logits
/// [t W, t W + W), [t W + 256 W, ...) with ce_online_update; per warp a
/// shuffle-down tree (lane l merges lane l + 1, 2, 4, 8, 16), then the warps
/// in order, as CUB's BLOCK_REDUCE_WARP_REDUCTIONS (and the emulator) do.
state block_order_normaliser(const float* z, std::int64_t V, int W) {
  std::vector<state> st(threads, state{-INFINITY, 0.f});
  for (int t = 0; t < threads; ++t)
    for (std::int64_t i = std::int64_t(t) * W; i < V; i += std::int64_t(threads) * W)
      for (int k = 0; k < W; ++k) st[sz(t)] = hd::ce_online_update(st[sz(t)], z[i + k]);
  state total{};
  for (int w = 0; w < threads / 32; ++w) {
    state lanes[32];
    for (int l = 0; l < 32; ++l) lanes[l] = st[sz(32 * w + l)];
    for (int off = 1; off < 32; off *= 2)
      for (int l = 0; l + off < 32; ++l) lanes[l] = hd::ce_online_combine(lanes[l], lanes[l + off]);
    total = w == 0 ? lanes[0] : hd::ce_online_combine(total, lanes[0]);
  }
  return total;
}

/// One chunk through ce_softmax: `rows` rows of V logits at element offset
/// `offset` (1: misaligned, the scalar variant), with the given targets.
template <class T>
void softmax_case(std::int64_t V, const std::vector<std::int32_t>& targets, int offset, bool train,
                  float grad_scale, std::uint64_t seed) {
  const auto rows = static_cast<std::int64_t>(targets.size());
  const int W = V % 4 == 0 && offset == 0 ? 4 : 1;
  INFO("V=" << V << " rows=" << rows << " offset=" << offset << " train=" << train << " W=" << W);
  std::mt19937_64 rng(seed);
  const auto logits = random_vector<float>(sz(rows * V + offset), rng, -8, 8);
  const float* z0 = logits.data() + offset;

  cuda_emulator em(seed);
  auto row_loss = poisoned<double>(sz(rows));
  auto dlogits = poisoned<T>(train ? sz(rows * V + offset) : 0);
  em.input(logits);
  em.input(targets);
  em.output(row_loss);
  em.output(dlogits);
  strings launched;
  T* dz0 = train ? dlogits.data() + offset : nullptr;
  kc::lm_head_ce_softmax_launch(emulator_launcher{&em, std::int64_t(1) << 24, &launched},
                                row_loss.data(), dz0, z0, targets.data(), rows, V, ignore,
                                grad_scale);
  CHECK(launched == (rows == 0 ? strings{} : strings{"ce_softmax"}));

  for (std::int64_t r = 0; r < rows; ++r) {
    INFO("row " << r << " target " << targets[sz(r)]);
    const float* z = z0 + r * V;
    const T* dz = train ? dz0 + r * V : nullptr;
    const std::int32_t y = targets[sz(r)];
    if (y == ignore) {
      CHECK(row_loss[sz(r)] == 0.0);
      if (train) CHECK(std::all_of(dz, dz + V, [](T v) { return v.bits == 0; }));
      continue;
    }
    if (y < 0 || y >= V) {  // the host refuses; the device shows NaN in the loss and the row
      CHECK_THROWS_AS(host_ce_row(z, V, y, grad_scale), tessera::config_error);
      CHECK(std::isnan(row_loss[sz(r)]));
      if (train)
        CHECK(std::all_of(dz, dz + V, [](T v) { return std::isnan(tessera::to<float>(v)); }));
      continue;
    }
    // Against the host: a tolerance (another order of the sum).
    const host_row h = host_ce_row(z, V, y, grad_scale);
    CHECK(std::abs(row_loss[sz(r)] - h.loss) <= loss_tol(loss_scale(z, V, y)));
    if (train) {
      const std::vector<T> got(dz, dz + V);
      CHECK(first_nan(got) == -1);
      CHECK(dlogit_error(got, h.dlogits) < dlogit_tol<T>);
    }
    // Against the kernel's own order: bit for bit.
    const state s = block_order_normaliser(z, V, W);
    const double want = static_cast<double>(hd::ce_row_loss(s.max, s.sum, z[y]));
    CHECK(same_bits(&row_loss[sz(r)], &want, 1));
    if (train) {
      const float inv = 1.f / s.sum;
      std::vector<T> want_dz(sz(V));
      for (std::int64_t i = 0; i < V; ++i)
        want_dz[sz(i)] =
            tessera::to<T>(hd::ce_dlogit(hd::ce_exp(z[i], s.max), inv, i == y, grad_scale));
      CHECK(same_bits(dz, want_dz.data(), sz(V)));
    }
  }
  if (train && offset > 0) CHECK(std::isnan(tessera::to<float>(dlogits[0])));  // before the row
}

/// The host's view of one row of the vocabulary-parallel loss over `tp`
/// slices of Vl columns (the last padded): each rank's local max, sum of exp
/// and target logit (before the all-reduces), the reduced values, the loss
/// and each rank's float32 logit gradient (Vl). The host runs one rank at a
/// time: its `reduce` callback substitutes the group's result, computed
/// from the earlier passes (max, then the sums in rank order).
struct vp_host_row {
  std::vector<float> local_max, local_sum, local_target;
  float max = 0, sum = 0, target = 0;
  double loss = 0;
  std::vector<std::vector<float>> dlogits;
};
vp_host_row host_vp_row(const std::vector<std::vector<float>>& slices, std::int64_t row,
                        std::int64_t V, std::int64_t Vl, std::int32_t y, float grad_scale,
                        bool train) {
  const int tp = static_cast<int>(slices.size());
  vp_host_row h;
  h.local_max.assign(sz(tp), 0.f);
  h.local_sum = h.local_target = h.local_max;
  h.dlogits.assign(sz(tp), std::vector<float>(sz(Vl), 0.f));
  const float one = 1.f;
  for (int pass = 0; pass < 3; ++pass)
    for (int r = 0; r < tp; ++r) {
      auto reduce = [&](bool is_max, float* v, std::int64_t n) {
        REQUIRE(n == (is_max ? 1 : 2));
        if (is_max) {
          if (pass == 0) h.local_max[sz(r)] = v[0];
          if (pass > 0) v[0] = h.max;
        } else if (pass == 1) {
          h.local_sum[sz(r)] = v[0];
          h.local_target[sz(r)] = v[1];
        } else if (pass == 2) {
          v[0] = h.sum;
          v[1] = h.target;
        }
      };
      float dx = 0.f;
      double loss = 0;
      std::vector<float> dw(sz(Vl), 0.f);
      hk::lm_head_cross_entropy_vocab_parallel<float, float, float>(
          ctx, &loss, &one, slices[sz(r)].data() + row * Vl, &y, 1, V, r * Vl, Vl, 1, ignore,
          grad_scale, train ? &dx : nullptr, train ? dw.data() : nullptr, 1, reduce);
      if (pass == 2) {
        h.loss = loss;
        h.dlogits[sz(r)] = dw;
      }
      if (pass == 0 && r == tp - 1)
        h.max = *std::max_element(h.local_max.begin(), h.local_max.end());
      if (pass == 1 && r == tp - 1)
        for (int q = 0; q < tp; ++q) {  // rank order, as a ring or tree of 2 would not promise:
          h.sum += h.local_sum[sz(q)];  // the test only needs one fixed order for both sides
          h.target += h.local_target[sz(q)];
        }
    }
  return h;
}

/// The vocab-parallel row kernels over `tp` slices of Vl = ceil(V / tp)
/// columns (the last rank's tail is padding, NaN here: never read), the
/// all-reduces done by the test in rank order.
template <class T>
void vp_case(std::int64_t V, int tp, const std::vector<std::int32_t>& targets, bool train,
             float grad_scale, std::uint64_t seed) {
  const auto rows = static_cast<std::int64_t>(targets.size());
  const std::int64_t Vl = (V + tp - 1) / tp;
  INFO("V=" << V << " tp=" << tp << " Vl=" << Vl << " rows=" << rows << " train=" << train);
  std::mt19937_64 rng(seed);
  const auto full = random_vector<float>(sz(rows * V), rng, -8, 8);
  std::vector<std::vector<float>> slices(sz(tp));
  std::vector<std::int64_t> real(sz(tp));
  for (int r = 0; r < tp; ++r) {
    real[sz(r)] = std::max<std::int64_t>(0, std::min(Vl, V - r * Vl));
    auto& s = slices[sz(r)];
    s.assign(sz(rows * Vl), std::numeric_limits<float>::quiet_NaN());
    for (std::int64_t i = 0; i < rows; ++i)
      std::copy_n(full.data() + i * V + r * Vl, real[sz(r)], s.data() + i * Vl);
  }

  // Emulated: per rank max, all-reduce(max), per rank sums, all-reduce(sum), per rank grad.
  std::vector<std::vector<float>> maxes(sz(tp)), sums(sz(tp));
  std::vector<float> gmax(sz(rows), -INFINITY), gsums(sz(2 * rows), 0.f);
  for (int r = 0; r < tp; ++r) {
    cuda_emulator em(seed + static_cast<std::uint64_t>(r));
    maxes[sz(r)] = poisoned<float>(sz(rows));
    em.input(slices[sz(r)]);
    em.output(maxes[sz(r)]);
    strings launched;
    kc::vocab_parallel_ce_row_max_launch(emulator_launcher{&em, std::int64_t(1) << 24, &launched},
                                         maxes[sz(r)].data(), slices[sz(r)].data(), rows, Vl,
                                         real[sz(r)]);
    CHECK(launched == strings{"vp_ce_row_max"});
    for (std::int64_t i = 0; i < rows; ++i)
      gmax[sz(i)] = std::max(gmax[sz(i)], maxes[sz(r)][sz(i)]);
  }
  for (int r = 0; r < tp; ++r) {
    cuda_emulator em(seed + 100 + static_cast<std::uint64_t>(r));
    sums[sz(r)] = poisoned<float>(sz(2 * rows));
    em.input(slices[sz(r)]);
    em.input(gmax);
    em.input(targets);
    em.output(sums[sz(r)]);
    strings launched;
    kc::vocab_parallel_ce_row_sums_launch(emulator_launcher{&em, std::int64_t(1) << 24, &launched},
                                          sums[sz(r)].data(), slices[sz(r)].data(), gmax.data(),
                                          targets.data(), rows, V, r * Vl, Vl, real[sz(r)], ignore);
    CHECK(launched == strings{"vp_ce_row_sums"});
    for (std::int64_t i = 0; i < 2 * rows; ++i) gsums[sz(i)] += sums[sz(r)][sz(i)];
  }
  // row_grad over the given reduced max and sums, on every rank.
  auto run_grad = [&](const std::vector<float>& mx, const std::vector<float>& se,
                      std::vector<double>& loss, std::vector<std::vector<T>>& dz) {
    loss = poisoned<double>(sz(tp * rows));
    dz.assign(sz(tp), poisoned<T>(train ? sz(rows * Vl) : 0));
    for (int r = 0; r < tp; ++r) {
      cuda_emulator em(seed + 200 + static_cast<std::uint64_t>(r));
      em.input(slices[sz(r)]);
      em.input(mx);
      em.input(se);
      em.input(targets);
      em.output(loss);
      em.output(dz[sz(r)]);
      strings launched;
      kc::vocab_parallel_ce_row_grad_launch(
          emulator_launcher{&em, std::int64_t(1) << 24, &launched}, loss.data() + r * rows,
          train ? dz[sz(r)].data() : nullptr, slices[sz(r)].data(), mx.data(), se.data(),
          targets.data(), rows, r * Vl, Vl, real[sz(r)], ignore, grad_scale);
      CHECK(launched == strings{"vp_ce_row_grad"});
    }
  };
  std::vector<double> loss;
  std::vector<std::vector<T>> dz;
  run_grad(gmax, gsums, loss, dz);

  // The host's reduced values, for the bit-for-bit pass of row_grad.
  std::vector<float> hmax(sz(rows)), hsums(sz(2 * rows));
  std::vector<vp_host_row> host(sz(rows));
  for (std::int64_t i = 0; i < rows; ++i) {
    const std::int32_t y = targets[sz(i)];
    INFO("row " << i << " target " << y);
    for (int r = 0; r < tp; ++r) {  // padding: 0 gradient whatever the row
      if (train)
        CHECK(std::all_of(dz[sz(r)].begin() + i * Vl + real[sz(r)],
                          dz[sz(r)].begin() + (i + 1) * Vl, [](T v) { return v.bits == 0; }));
    }
    if (y == ignore) {
      for (int r = 0; r < tp; ++r) {
        CHECK(sums[sz(r)][sz(i)] == 0.f);
        CHECK(sums[sz(r)][sz(rows + i)] == 0.f);
        CHECK(loss[sz(r * rows + i)] == 0.0);
        if (train)
          CHECK(std::all_of(dz[sz(r)].begin() + i * Vl, dz[sz(r)].begin() + (i + 1) * Vl,
                            [](T v) { return v.bits == 0; }));
      }
    }
    if (y != ignore && (y < 0 || y >= V)) {  // the host refuses; NaN on every rank
      CHECK_THROWS_AS(host_vp_row(slices, i, V, Vl, y, grad_scale, train), tessera::config_error);
      for (int r = 0; r < tp; ++r) {
        CHECK(std::isnan(sums[sz(r)][sz(rows + i)]));
        CHECK(std::isnan(loss[sz(r * rows + i)]));
        if (train)
          CHECK(std::all_of(dz[sz(r)].begin() + i * Vl, dz[sz(r)].begin() + i * Vl + real[sz(r)],
                            [](T v) { return std::isnan(tessera::to<float>(v)); }));
      }
      hmax[sz(i)] = gmax[sz(i)];
      hsums[sz(i)] = gsums[sz(i)];
      hsums[sz(rows + i)] = gsums[sz(rows + i)];
      continue;
    }
    const vp_host_row h = host_vp_row(slices, i, V, Vl, y, grad_scale, train);
    host[sz(i)] = h;
    hmax[sz(i)] = h.max;
    hsums[sz(i)] = h.sum;
    hsums[sz(rows + i)] = h.target;
    if (y == ignore) continue;
    double scale = std::abs(h.max) + std::log(static_cast<double>(V)) + 1;
    for (int r = 0; r < tp; ++r) {
      CHECK(same_bits(&maxes[sz(r)][sz(i)], &h.local_max[sz(r)], 1));           // exact
      CHECK(same_bits(&sums[sz(r)][sz(rows + i)], &h.local_target[sz(r)], 1));  // exact
      CHECK(std::abs(sums[sz(r)][sz(i)] - h.local_sum[sz(r)]) <= host_sum_tol * h.local_sum[sz(r)]);
      double exact = 0;  // float64 sum of the same float32 terms
      for (std::int64_t v = 0; v < real[sz(r)]; ++v)
        exact += hd::ce_exp(slices[sz(r)][sz(i * Vl + v)], gmax[sz(i)]);
      CHECK(std::abs(sums[sz(r)][sz(i)] - exact) <= f32_tol * exact);
      scale += std::abs(h.local_target[sz(r)]);
      // The pipeline with the emulated sums: within the tolerances.
      CHECK(std::abs(loss[sz(r * rows + i)] - h.loss) <= loss_tol(scale));
      if (train) {
        const std::vector<T> got(dz[sz(r)].begin() + i * Vl, dz[sz(r)].begin() + (i + 1) * Vl);
        CHECK(first_nan(got) == -1);
        CHECK(dlogit_error(got, h.dlogits[sz(r)]) < dlogit_tol<T>);
      }
    }
  }

  // Given the host's reduced max and sums, row_grad is the host's arithmetic
  // element for element: the loss and T(host dlogit) bit for bit.
  std::vector<double> loss_h;
  std::vector<std::vector<T>> dz_h;
  run_grad(hmax, hsums, loss_h, dz_h);
  for (std::int64_t i = 0; i < rows; ++i) {
    const std::int32_t y = targets[sz(i)];
    if (y == ignore || y < 0 || y >= V) continue;
    INFO("row " << i << " target " << y);
    for (int r = 0; r < tp; ++r) {
      CHECK(same_bits(&loss_h[sz(r * rows + i)], &host[sz(i)].loss, 1));
      if (!train) continue;
      std::vector<T> want(sz(Vl));
      for (std::int64_t v = 0; v < Vl; ++v)
        want[sz(v)] = tessera::to<T>(host[sz(i)].dlogits[sz(r)][sz(v)]);
      CHECK(same_bits(dz_h[sz(r)].data() + i * Vl, want.data(), sz(Vl)));
    }
  }
}

/// The chunk loop's end: dx (N, H) bf16 at element offset `offset`, its
/// ignored rows zeroed, the others untouched; the loss sum.
template <class T>
void finish_case(std::int64_t N, std::int64_t H, int offset, bool train, std::uint64_t seed) {
  INFO("N=" << N << " H=" << H << " offset=" << offset << " train=" << train);
  std::mt19937_64 rng(seed);
  std::vector<std::int32_t> targets(sz(N));
  for (std::int64_t n = 0; n < N; ++n)
    targets[sz(n)] = n % 3 == 1 ? ignore : static_cast<std::int32_t>(rng() % 1000);
  auto row_loss = random_vector<double>(sz(N), rng, 0, 12);
  for (std::int64_t n = 0; n < N; ++n)
    if (targets[sz(n)] == ignore) row_loss[sz(n)] = 0;
  const auto dx0 = random_vector<T>(train ? sz(N * H + offset) : 0, rng, -1, 1);

  cuda_emulator em(seed);
  auto dx = dx0;
  auto loss_sum = poisoned<double>(1);
  em.input(row_loss);
  em.input(targets);
  em.output(dx);
  em.output(loss_sum);
  strings launched;
  kc::lm_head_ce_finish_launch(emulator_launcher{&em, std::int64_t(1) << 24, &launched},
                               loss_sum.data(), row_loss.data(),
                               train ? dx.data() + offset : nullptr, targets.data(), N, H, ignore);
  CHECK(launched ==
        (train && N > 0 ? strings{"ce_zero_ignored_rows", "ce_loss_sum"} : strings{"ce_loss_sum"}));
  double want = 0, abs_sum = 0;  // the host's: in row order
  for (double l : row_loss) {
    want += l;
    abs_sum += std::abs(l);
  }
  CHECK(std::abs(loss_sum[0] - want) <= 2.0 * static_cast<double>(N) * 0x1p-53 * abs_sum);
  if (!train) return;
  CHECK(same_bits(dx.data(), dx0.data(), sz(offset)));
  for (std::int64_t n = 0; n < N; ++n) {
    const T* got = dx.data() + offset + n * H;
    if (targets[sz(n)] == ignore)
      CHECK(std::all_of(got, got + H, [](T v) { return v.bits == 0; }));
    else
      CHECK(same_bits(got, dx0.data() + offset + n * H, sz(H)));
  }
}

}  // namespace

TEST_CASE("emulated cuda ce_softmax equals the host's row loss and logit gradient",
          "[kernels][emulated][cross_entropy]") {
  std::uint64_t seed = 1;
  const std::int32_t big = static_cast<std::int32_t>(V3 - 1);
  for (auto [V, targets, offset] :
       {std::tuple<std::int64_t, std::vector<std::int32_t>, int>{1, {0, ignore, 0}, 0},
        {7, {3, ignore, 6, 0}, 0},         // fewer logits than threads, V % 4 != 0: scalar
        {1001, {1000, 17, ignore}, 0},     // scalar
        {1000, {999, ignore, 4, 500}, 0},  // 16-byte loads
        {1000, {999, 3}, 1},               // misaligned: scalar
        {V2, {31999, ignore, 12345}, 0},   // Llama 2
        {V3, {big, 77}, 0},                // Llama 3
        {V3, {5}, 1},                      // Llama 3, misaligned
        {64, {}, 0}}) {                    // no rows: no launch
    for (bool train : {true, false}) {
      if (!train && V == V3) continue;  // evaluation at V3 adds runtime, not coverage
      softmax_case<bf16>(V, targets, offset, train, train ? 1.f / 3 : 1.f, seed++);
      // fp16 (precision::fp16_mixed) takes the same path; the vocabularies of
      // the presets stay bf16-only, for time.
      if (V < V2) softmax_case<fp16>(V, targets, offset, train, train ? 1.f / 3 : 1.f, seed++);
    }
  }
}

TEST_CASE("emulated cuda ce_softmax: targets outside [0, V) give NaN, ignored rows 0, grad_scale",
          "[kernels][emulated][cross_entropy]") {
  std::uint64_t seed = 50;
  for (std::int64_t V : {std::int64_t(7), std::int64_t(1000), std::int64_t(1001)})
    for (int offset : {0, 1}) {
      const auto v = static_cast<std::int32_t>(V);
      softmax_case<bf16>(V, {-5, v, ignore, v - 1, ignore - 1}, offset, true, 0.125f, seed++);
      softmax_case<fp16>(V, {-5, v, ignore, v - 1, ignore - 1}, offset, true, 0.125f, seed++);
      softmax_case<bf16>(V, {v, 2}, offset, false, 1.f, seed++);
    }
  // grad_scale scales the gradient only: 0 gives a zero gradient, the same loss.
  softmax_case<bf16>(1001, {3, 900}, 0, true, 0.f, seed++);
  softmax_case<bf16>(1000, {3, 900}, 0, true, 1e-6f, seed++);
  softmax_case<fp16>(1001, {3, 900}, 0, true, 0.f, seed++);
  softmax_case<fp16>(1000, {3, 900}, 0, true, 1e-6f, seed++);
}

TEST_CASE("emulated cuda vocab-parallel row kernels equal the host over padded slices",
          "[kernels][emulated][cross_entropy]") {
  std::uint64_t seed = 300;
  for (auto [V, tp, targets] :
       {std::tuple<std::int64_t, int, std::vector<std::int32_t>>{
            1, 2, {0, ignore}},                  // rank 1: all padding
        {7, 4, {6, 0, ignore, 3}},               // Vl 2, the last rank 1 real column
        {1001, 4, {1000, 250, 251, ignore, 3}},  // Vl 251: 3 padding columns
        {V2, 3, {31999, ignore, 10667}},         // Vl 10667: 1 padding column
        {V3, 5, {128255, 25652}}}) {             // Vl 25652: 4 padding columns
    vp_case<bf16>(V, tp, targets, true, 1.f / 5, seed++);
    if (V < V2) vp_case<fp16>(V, tp, targets, true, 1.f / 5, seed++);  // presets: bf16 only
    if (V < V2) vp_case<bf16>(V, tp, targets, false, 1.f, seed++);     // evaluation: losses only
  }
  // Targets outside [0, V): NaN target logit on every rank, NaN loss and
  // real gradient; V itself is the padding column's index (no rank owns it).
  vp_case<bf16>(1001, 4, {-5, 1001, ignore, 17}, true, 0.25f, seed++);
  vp_case<fp16>(1001, 4, {-5, 1001, ignore, 17}, true, 0.25f, seed++);
  vp_case<bf16>(7, 4, {7, 6}, false, 1.f, seed++);
  {  // no rows: no launch
    cuda_emulator em;
    strings launched;
    emulator_launcher l{&em, std::int64_t(1) << 24, &launched};
    kc::vocab_parallel_ce_row_max_launch(l, nullptr, nullptr, 0, 8, 8);
    kc::vocab_parallel_ce_row_sums_launch(l, nullptr, nullptr, nullptr, nullptr, 0, 8, 0, 8, 8,
                                          ignore);
    kc::vocab_parallel_ce_row_grad_launch(l, nullptr, static_cast<bf16*>(nullptr), nullptr, nullptr,
                                          nullptr, nullptr, 0, 0, 8, 8, ignore, 1.f);
    CHECK(launched.empty());
  }
}

TEST_CASE("emulated cuda lm_head_ce_finish zeroes ignored dx rows and sums the loss",
          "[kernels][emulated][cross_entropy]") {
  std::uint64_t seed = 400;
  for (auto [N, H, offset] : {std::tuple<std::int64_t, std::int64_t, int>{1, 4096, 0},
                              {5, 7, 0},      // H % 8 != 0: scalar
                              {6, 4096, 0},   // Llama hidden size, 16-byte stores
                              {300, 64, 1},   // misaligned: scalar; two rows per thread
                              {0, 64, 0}}) {  // no rows: the loss sum only (0)
    finish_case<bf16>(N, H, offset, true, seed++);
    finish_case<bf16>(N, H, offset, false, seed++);
    finish_case<fp16>(N, H, offset, true, seed++);
  }
}

TEST_CASE("emulated cuda cross-entropy launchers refuse bad sizes before any launch",
          "[kernels][emulated][cross_entropy]") {
  cuda_emulator em;
  strings launched;
  emulator_launcher l{&em, std::int64_t(1) << 24, &launched};
  using tessera::config_error;
  CHECK_THROWS_AS(kc::lm_head_ce_softmax_launch(l, nullptr, static_cast<bf16*>(nullptr), nullptr,
                                                nullptr, -1, 8, ignore, 1.f),
                  config_error);
  CHECK_THROWS_AS(kc::lm_head_ce_softmax_launch(l, nullptr, static_cast<fp16*>(nullptr), nullptr,
                                                nullptr, 2, 0, ignore, 1.f),
                  config_error);
  CHECK_THROWS_AS(kc::lm_head_ce_finish_launch(l, nullptr, nullptr, static_cast<bf16*>(nullptr),
                                               nullptr, -1, 8, ignore),
                  config_error);
  CHECK_THROWS_AS(kc::vocab_parallel_ce_row_max_launch(l, nullptr, nullptr, 2, 0, 0), config_error);
  CHECK_THROWS_AS(kc::vocab_parallel_ce_row_max_launch(l, nullptr, nullptr, 2, 8, 9), config_error);
  CHECK_THROWS_AS(kc::vocab_parallel_ce_row_sums_launch(l, nullptr, nullptr, nullptr, nullptr, -1,
                                                        8, 0, 8, 8, ignore),
                  config_error);
  CHECK_THROWS_AS(
      kc::vocab_parallel_ce_row_grad_launch(l, nullptr, static_cast<fp16*>(nullptr), nullptr,
                                            nullptr, nullptr, nullptr, 2, 0, 8, -1, ignore, 1.f),
      config_error);
  CHECK(launched.empty());
}

}  // namespace test_kernels_emulated_cross_entropy
