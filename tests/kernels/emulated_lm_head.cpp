// The chunk loop of the fused LM head and cross-entropy on the GPU
// (lm_head_cross_entropy_chunks in include/tessera/kernels/cuda/
// cross_entropy.cuh, the very function the CUDA entry point calls) run on
// the host: its row kernels by the block emulator (tests/support/
// cuda_emulator.hpp), its three GEMMs per chunk by a float64 reference in
// place of cuBLASLt, so what is checked is the loop itself: the scratch
// layout and its alignment, each chunk's offsets into x, the targets, the
// row losses and dx, the accumulation of dwlm over chunks, evaluation
// without gradients, and its argument checks.
//
// Oracles:
// - chunking changes nothing a row owns: the loss sum and dx are the same
//   bits for every chunk size (each row's logits, kernel and GEMM are its
//   own; the loss is summed once, by one block, over all rows);
// - dwlm, one float32 addition per chunk, within (chunks + 1) 2^-24 of the
//   sum of |terms| of a float64 sum over all rows of bf16(dlogit) x;
// - against the host kernel (kernels::lm_head_cross_entropy, float32
//   logits and gradients, the same bf16 inputs): the loss within the row
//   tolerance of tests/kernels/emulated_cross_entropy.cpp summed over the
//   rows, dx within bf16's rounding of the output plus that of each
//   dlogit (2^-8 each) of the sum of |dlogit w|; the same for fp16 storage
//   (precision::fp16_mixed) with fp16's 2^-11.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <tessera/kernels/cross_entropy.hpp>
#include <tessera/kernels/cuda/cross_entropy.cuh>

#include "../support/cuda_emulator.hpp"
#include "kernel_testing.hpp"

namespace test_kernels_emulated_lm_head {

namespace kc = tessera::kernels::cuda;
namespace hk = tessera::kernels;
using tessera::bf16;
using tessera::fp16;
using namespace tessera::testing;

namespace {

constexpr std::int32_t ignore = -100;

std::size_t sz(std::int64_t n) {
  return static_cast<std::size_t>(n);
}
template <class T>
double d(T v) {
  return static_cast<double>(static_cast<float>(v));
}

/// The chunk's GEMMs in float64, rounded once (cuBLASLt's stand-in), over
/// the storage type T (bf16 or fp16).
template <class T>
struct reference_gemms {
  void forward(float* logits, const T* x, const T* wlm, std::int64_t rows, std::int64_t V,
               std::int64_t H) const {
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t v = 0; v < V; ++v) {
        double s = 0;
        for (std::int64_t h = 0; h < H; ++h) s += d(x[r * H + h]) * d(wlm[v * H + h]);
        logits[r * V + v] = static_cast<float>(s);
      }
  }
  void backward_input(T* dx, const T* dlogits, const T* wlm, std::int64_t rows, std::int64_t V,
                      std::int64_t H) const {
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t h = 0; h < H; ++h) {
        double s = 0;
        for (std::int64_t v = 0; v < V; ++v) s += d(dlogits[r * V + v]) * d(wlm[v * H + h]);
        dx[r * H + h] = tessera::to<T>(static_cast<float>(s));
      }
  }
  void backward_weight(float* dwlm, const T* dlogits, const T* x, std::int64_t rows, std::int64_t V,
                       std::int64_t H) const {
    for (std::int64_t v = 0; v < V; ++v)
      for (std::int64_t h = 0; h < H; ++h) {
        double s = 0;
        for (std::int64_t r = 0; r < rows; ++r) s += d(dlogits[r * V + v]) * d(x[r * H + h]);
        dwlm[v * H + h] += static_cast<float>(s);
      }
  }
};

template <class T>
struct inputs {
  std::int64_t N, V, H;
  std::vector<T> x, wlm;
  std::vector<std::int32_t> targets;
};
template <class T>
inputs<T> make_inputs(std::int64_t N, std::int64_t V, std::int64_t H, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  inputs<T> in{N,
               V,
               H,
               random_vector<T>(sz(N * H), rng, -1, 1),
               random_vector<T>(sz(V * H), rng, -1, 1),
               std::vector<std::int32_t>(sz(N))};
  for (std::int64_t n = 0; n < N; ++n)
    in.targets[sz(n)] = n % 5 == 3 ? ignore : static_cast<std::int32_t>(rng() % sz(V));
  return in;
}

/// What the loop wrote.
template <class T>
struct result {
  double loss = 0;
  std::vector<T> dx;
  std::vector<float> dwlm;
  std::vector<std::string> launched;
};

template <class T>
result<T> run_loop(const inputs<T>& in, std::int64_t chunk, bool train, float grad_scale,
                   std::uint64_t seed) {
  const std::int64_t N = in.N, V = in.V, H = in.H;
  cuda_emulator em(seed);
  result<T> r;
  auto loss = poisoned<double>(1);
  if (train) {
    r.dx = poisoned<T>(sz(N * H));
    r.dwlm.assign(sz(V * H), 0.f);
  }
  // The scratch at a 256-byte boundary, its bytes poisoned.
  const std::size_t bytes = kc::lm_head_cross_entropy_scratch_bytes(N, V, H, chunk);
  std::vector<unsigned char> raw(bytes + kc::lm_head_ce_scratch_align, 0xFF);
  void* scratch =
      raw.data() + (kc::lm_head_ce_scratch_align -
                    reinterpret_cast<std::uintptr_t>(raw.data()) % kc::lm_head_ce_scratch_align);
  em.input(in.x);
  em.input(in.wlm);
  em.input(in.targets);
  em.output(loss);
  em.output(r.dx);
  em.add_region(scratch, bytes, true);
  kc::lm_head_cross_entropy_chunks(
      emulator_launcher{&em, std::int64_t(1) << 24, &r.launched}, reference_gemms<T>{}, loss.data(),
      in.x.data(), in.wlm.data(), in.targets.data(), N, V, H, ignore, grad_scale,
      train ? r.dx.data() : nullptr, train ? r.dwlm.data() : nullptr, chunk, scratch, bytes);
  r.loss = loss[0];
  return r;
}

}  // namespace

TEMPLATE_TEST_CASE(
    "emulated cuda lm_head_cross_entropy chunk loop: the same rows whatever the chunk, "
    "and the host's values",
    "[kernels][emulated][cross_entropy]", bf16, fp16) {
  using T = TestType;  // the storage type: bf16, or fp16 (precision::fp16_mixed)
  constexpr double tol16 = tol_of<T>;
  std::uint64_t seed = 900;
  // V % 4 == 0 (16-byte rows) and not (scalar); N not a multiple of the chunks.
  for (const auto& [N, V, H] :
       {std::tuple<std::int64_t, std::int64_t, std::int64_t>{23, 96, 16}, {17, 101, 8}}) {
    const inputs<T> in = make_inputs<T>(N, V, H, seed++);
    INFO("N=" << N << " V=" << V << " H=" << H);
    const float grad_scale = 1.0f / 19;

    // The host kernel (float32 logits and gradients) on the same bf16 inputs.
    double host_loss = 0;
    std::vector<float> host_dx(sz(N * H)), host_dwlm(sz(V * H), 0.f);
    hk::lm_head_cross_entropy<T, float, float>(ctx, &host_loss, in.x.data(), in.wlm.data(),
                                               in.targets.data(), N, V, H, ignore, grad_scale,
                                               host_dx.data(), host_dwlm.data(), 4);

    const result<T> whole = run_loop(in, 64, true, grad_scale, seed++);
    for (const std::int64_t chunk : {1, 4, 7}) {
      INFO("chunk=" << chunk);
      const result<T> r = run_loop(in, chunk, true, grad_scale, seed++);
      const std::int64_t chunks = (N + chunk - 1) / chunk;
      CHECK(std::count(r.launched.begin(), r.launched.end(), "ce_softmax") == chunks);
      CHECK(same_bits(&r.loss, &whole.loss, 1));
      CHECK(same_bits(r.dx.data(), whole.dx.data(), sz(N * H)));
      // dwlm: one float32 addition per chunk against the one chunk's float64
      // sum rounded once; its terms dlogit x with |dlogit| <= grad_scale.
      for (std::int64_t v = 0; v < V; ++v)
        for (std::int64_t h = 0; h < H; ++h) {
          double abs_sum = 0;
          for (std::int64_t n = 0; n < N; ++n)
            abs_sum += grad_scale * std::abs(d(in.x[sz(n * H + h)]));
          const double got = r.dwlm[sz(v * H + h)], want = whole.dwlm[sz(v * H + h)];
          CHECK(std::abs(got - want) <=
                static_cast<double>(chunks + 1) * 0x1p-24 * abs_sum + 1e-30);
        }
    }
    // The loss against the host's: per row within f32_tol of its magnitude
    // (|max| + |z_y| + log V + 1, |z| <= H here) plus the host's sum of exp
    // (emulated_cross_entropy.cpp), summed over the rows.
    double tol = 0;
    for (std::int64_t n = 0; n < N; ++n)
      if (in.targets[sz(n)] != ignore)
        tol += f32_tol * (2.0 * double(H) + std::log(double(V)) + 1) + 1e-4;
    CHECK(std::abs(whole.loss - host_loss) <= tol);
    // dx against the host's: 16-bit dlogits (tol16 each) and one rounding to T.
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t h = 0; h < H; ++h) {
        const double want = host_dx[sz(n * H + h)];
        double scale = 0;  // sum of |dlogit w| bounded by sum |w| grad_scale (|dlogit| <= 1)
        for (std::int64_t v = 0; v < V; ++v) scale += std::abs(d(in.wlm[sz(v * H + h)]));
        scale *= grad_scale;
        const double got = d(whole.dx[sz(n * H + h)]);
        if (in.targets[sz(n)] == ignore)
          CHECK(got == 0.0);
        else
          CHECK(std::abs(got - want) <= tol16 * std::abs(want) + (tol16 + 1e-4) * scale);
      }
    // dwlm against the host's float32 sum: as dx.
    for (std::size_t i = 0; i < host_dwlm.size(); ++i) {
      double scale = 0;
      const std::int64_t h = static_cast<std::int64_t>(i) % H;
      for (std::int64_t n = 0; n < N; ++n) scale += std::abs(d(in.x[sz(n * H + h)]));
      scale *= grad_scale;
      CHECK(std::abs(double(whole.dwlm[i]) - double(host_dwlm[i])) <= (tol16 + 1e-4) * scale);
    }
    // Evaluation: no gradients, the same loss bits.
    const result<T> eval = run_loop(in, 4, false, grad_scale, seed++);
    CHECK(same_bits(&eval.loss, &whole.loss, 1));
    CHECK(eval.launched.back() == "ce_loss_sum");
    CHECK(std::count(eval.launched.begin(), eval.launched.end(), "ce_zero_ignored_rows") == 0);
  }
}

TEST_CASE("emulated cuda lm_head_cross_entropy chunk loop refuses bad arguments before any work",
          "[kernels][emulated][cross_entropy]") {
  const inputs<bf16> in = make_inputs<bf16>(6, 32, 8, 7);
  cuda_emulator em(1);
  std::vector<std::string> launched;
  const emulator_launcher l{&em, std::int64_t(1) << 24, &launched};
  const std::size_t bytes = kc::lm_head_cross_entropy_scratch_bytes(6, 32, 8, 4);
  std::vector<unsigned char> raw(bytes + 2 * kc::lm_head_ce_scratch_align);
  auto* scratch =
      raw.data() + (kc::lm_head_ce_scratch_align -
                    reinterpret_cast<std::uintptr_t>(raw.data()) % kc::lm_head_ce_scratch_align);
  std::vector<double> loss(1);
  std::vector<bf16> dx(48);
  std::vector<float> dwlm(256);
  em.input(in.x);
  em.input(in.wlm);
  em.input(in.targets);
  em.output(loss);
  em.output(dx);
  em.add_region(scratch, bytes, true);
  auto call = [&](double* lp, bf16* dxp, float* dwp, void* s, std::size_t b) {
    kc::lm_head_cross_entropy_chunks(l, reference_gemms<bf16>{}, lp, in.x.data(), in.wlm.data(),
                                     in.targets.data(), 6, 32, 8, ignore, 1.f, dxp, dwp, 4, s, b);
  };
  using Catch::Contains;
  CHECK_THROWS_WITH(call(loss.data(), dx.data(), dwlm.data(), scratch, bytes - 1),
                    Contains("below the " + std::to_string(bytes)));
  CHECK_THROWS_WITH(call(loss.data(), dx.data(), dwlm.data(), scratch + 16, bytes),
                    Contains("not aligned to 256"));
  CHECK_THROWS_WITH(call(loss.data(), dx.data(), nullptr, scratch, bytes),
                    Contains("pass both d_dx and d_dwlm"));
  CHECK_THROWS_WITH(call(nullptr, nullptr, nullptr, scratch, bytes),
                    Contains("d_loss_sum is null"));
  CHECK(launched.empty());
  CHECK_NOTHROW(call(loss.data(), dx.data(), dwlm.data(), scratch, bytes));
  CHECK_FALSE(launched.empty());
}

}  // namespace test_kernels_emulated_lm_head
