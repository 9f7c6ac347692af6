// RMSNorm's CUDA kernels (include/tessera/kernels/cuda/rmsnorm.cuh), their
// own bodies run by the block emulator (tests/support/cuda_emulator.hpp)
// through the launch functions the GPU path calls, against the host kernels
// (include/tessera/kernels/rmsnorm.hpp) on fresh random inputs with
// NaN-poisoned outputs, at small sizes, sizes that are no multiple of the
// block or the vector width, misaligned pointers (the scalar variant), and
// the hidden sizes of the presets.
//
// Bit for bit where the order of arithmetic is the host's: out and dinp given
// the same rstd and mean, dweight for N <= 256 rows (one chunk, rows in order
// from 0). rstd and the row sums in dinp come from CUB's block tree instead
// of the host's row loop: within f32_tol in float32; a bf16 result and the
// host's are each one rounding of float32 values that differ by that much,
// so they may land on neighbouring bf16 values: one ulp, at most 2^-7
// relative (pair_tol; fp16 likewise, one ulp of 11 bits, 2^-10). Each for
// float32, bf16 and fp16 storage (precision::fp16_mixed), with float32 or
// the storage type's activation gradients.
#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <tessera/kernels/cuda/rmsnorm.cuh>
#include <tessera/kernels/rmsnorm.hpp>

#include "../support/cuda_emulator.hpp"
#include "kernel_testing.hpp"

namespace test_kernels_emulated_rmsnorm {

namespace kc = tessera::kernels::cuda;
namespace hk = tessera::kernels;
using tessera::bf16;
using tessera::fp16;
using namespace tessera::testing;

namespace {

// Hidden sizes: Llama-2 7B and Llama-3 8B (4096), 13B (5120), and sizes no
// multiple of 256 threads or 8 lanes.
constexpr std::int64_t H7 = 4096, H13 = 5120;

/// Two 16-bit roundings of nearly equal float32 values: one ulp apart at
/// most (2^-7 relative for bf16, 2^-10 for fp16); f32_tol for float.
template <class T>
constexpr double pair_tol = tessera::is_half_v<T> ? 2 * tol_of<T> : f32_tol;

template <class T>
void forward_case(std::int64_t N, std::int64_t H, int offset, std::uint64_t seed) {
  INFO("N=" << N << " H=" << H << " offset=" << offset);
  std::mt19937_64 rng(seed);
  const auto x = random_vector<T>(static_cast<std::size_t>(N * H + offset), rng, -2, 2);
  const auto w = random_vector<T>(static_cast<std::size_t>(H + offset), rng, 0.5, 1.5);
  std::vector<T> y_host(static_cast<std::size_t>(N * H));
  std::vector<float> r_host(static_cast<std::size_t>(N));
  hk::rmsnorm_forward(ctx, y_host.data(), r_host.data(), x.data() + offset, w.data() + offset, N, H,
                      1e-5);

  cuda_emulator em(seed);
  auto y = poisoned<T>(static_cast<std::size_t>(N * H + offset));
  auto r = poisoned<float>(static_cast<std::size_t>(N));
  em.input(x);
  em.input(w);
  em.output(y);
  em.output(r);
  std::vector<std::string> launched;
  kc::rmsnorm_forward_launch(emulator_launcher{&em, std::int64_t(1) << 24, &launched},
                             y.data() + offset, r.data(), x.data() + offset, w.data() + offset, N,
                             H, 1e-5);
  CHECK(launched ==
        (N == 0 ? std::vector<std::string>{} : std::vector<std::string>{"rmsnorm_forward"}));
  y.erase(y.begin(), y.begin() + offset);
  CHECK(first_nan(y) == -1);
  CHECK(first_nan(r) == -1);
  CHECK(max_rel_error(r, r_host) < f32_tol);
  CHECK(max_rel_error(y, y_host) < pair_tol<T>);

  // Given the emulated rstd, out is the host's formula element for element.
  std::vector<T> y_same(static_cast<std::size_t>(N * H));
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t h = 0; h < H; ++h)
      y_same[static_cast<std::size_t>(n * H + h)] = tessera::to<T>(hk::detail::rmsnorm_out(
          tessera::to<float>(x[static_cast<std::size_t>(offset + n * H + h)]),
          tessera::to<float>(w[static_cast<std::size_t>(offset + h)]),
          r[static_cast<std::size_t>(n)]));
  CHECK(same_bits(y, y_same));
}

template <class T, class G>
void backward_case(std::int64_t N, std::int64_t H, bool accumulate, int offset,
                   std::uint64_t seed) {
  INFO("N=" << N << " H=" << H << " accumulate=" << accumulate << " offset=" << offset);
  std::mt19937_64 rng(seed);
  const auto x = random_vector<T>(static_cast<std::size_t>(N * H + offset), rng, -2, 2);
  const auto w = random_vector<T>(static_cast<std::size_t>(H + offset), rng, 0.5, 1.5);
  const auto dy = random_vector<G>(static_cast<std::size_t>(N * H + offset), rng, -1, 1);
  std::vector<T> y(static_cast<std::size_t>(N * H));
  std::vector<float> r(static_cast<std::size_t>(N));
  hk::rmsnorm_forward(ctx, y.data(), r.data(), x.data() + offset, w.data() + offset, N, H, 1e-5);
  const auto dx0 = random_vector<G>(static_cast<std::size_t>(N * H + offset), rng, -1, 1);

  std::vector<G> dx_host(dx0.begin() + offset, dx0.end());
  std::vector<float> dw_host(static_cast<std::size_t>(H), 0.f);  // from 0: one chunk is exact
  hk::rmsnorm_backward(ctx, dx_host.data(), dw_host.data(), dy.data() + offset, x.data() + offset,
                       w.data() + offset, r.data(), N, H, accumulate);

  cuda_emulator em(seed);
  std::vector<G> dx = accumulate ? dx0 : poisoned<G>(dx0.size());
  std::vector<float> dw(static_cast<std::size_t>(H), 0.f);
  const std::size_t scratch_bytes = kc::rmsnorm_backward_scratch_bytes(N, H);
  auto scratch = poisoned<float>(scratch_bytes / sizeof(float));
  for (auto* v : {&x, &w}) em.input(*v);
  em.input(dy);
  em.input(r);
  em.output(dx);
  em.output(dw);
  em.output(scratch);
  std::vector<std::string> launched;
  kc::rmsnorm_backward_launch(emulator_launcher{&em, std::int64_t(1) << 24, &launched},
                              dx.data() + offset, dw.data(), dy.data() + offset, x.data() + offset,
                              w.data() + offset, r.data(), N, H, scratch.data(), scratch_bytes,
                              accumulate);
  CHECK(launched == std::vector<std::string>{"rmsnorm_dinp", "rmsnorm_dweight_partial",
                                             "rmsnorm_dweight_reduce"});
  dx.erase(dx.begin(), dx.begin() + offset);
  CHECK(first_nan(dx) == -1);
  CHECK(first_nan(dw) == -1);
  CHECK(max_rel_error(dx, dx_host) < pair_tol<G>);
  if (N <= kc::rmsnorm_dweight_rows)
    CHECK(same_bits(dw, dw_host));
  else
    CHECK(max_rel_error(dw, dw_host) < f32_tol);

  // dweight accumulates: a second backward into the same dweight adds the same sums.
  std::vector<float> dw_twice = dw;
  em.output(dw_twice);
  kc::rmsnorm_backward_launch(emulator_launcher{&em}, dx.data(), dw_twice.data(),
                              dy.data() + offset, x.data() + offset, w.data() + offset, r.data(), N,
                              H, scratch.data(), scratch_bytes, accumulate);
  for (std::size_t h = 0; h < dw.size(); ++h) CHECK(dw_twice[h] == dw[h] + dw[h]);
}

}  // namespace

TEST_CASE("emulated cuda rmsnorm_forward equals the host kernel", "[kernels][emulated][rmsnorm]") {
  std::uint64_t seed = 1;
  for (auto [N, H, offset] : {std::tuple<std::int64_t, std::int64_t, int>{1, 1, 0},
                              {3, 7, 0},      // fewer columns than threads
                              {5, 1001, 0},   // no multiple of the vector width
                              {4, 1024, 1},   // misaligned: the scalar variant
                              {3, H7, 0},     // 7B / 8B
                              {2, H13, 0},    // 13B
                              {0, 64, 0}}) {  // no rows: no launch
    forward_case<float>(N, H, offset, seed++);
    forward_case<bf16>(N, H, offset, seed++);
    forward_case<fp16>(N, H, offset, seed++);
  }
}

TEST_CASE("emulated cuda rmsnorm_backward equals the host kernel", "[kernels][emulated][rmsnorm]") {
  std::uint64_t seed = 100;
  for (auto [N, H, offset] : {std::tuple<std::int64_t, std::int64_t, int>{1, 1, 0},
                              {3, 7, 0},
                              {5, 1001, 0},
                              {4, 1024, 1},
                              {3, H7, 0},
                              {300, 40, 0}}) {  // two dweight chunks
    for (bool accumulate : {false, true}) {
      backward_case<float, float>(N, H, accumulate, offset, seed++);
      backward_case<bf16, float>(N, H, accumulate, offset, seed++);
      backward_case<bf16, bf16>(N, H, accumulate, offset, seed++);
      backward_case<fp16, float>(N, H, accumulate, offset, seed++);
      backward_case<fp16, fp16>(N, H, accumulate, offset, seed++);
    }
  }
}

TEST_CASE("emulated cuda rmsnorm: an out-of-bounds read and a write to an input are caught",
          "[kernels][emulated][rmsnorm]") {
  // The emulator itself: the forward body without its scratch (H past the
  // buffers) fails naming the kernel, never reads silently.
  const std::int64_t N = 2, H = 300;
  std::mt19937_64 rng(7);
  const auto x = random_vector<float>(static_cast<std::size_t>(N * H), rng);
  const auto w = random_vector<float>(static_cast<std::size_t>(H - 1), rng);  // one short
  auto y = poisoned<float>(static_cast<std::size_t>(N * H));
  auto r = poisoned<float>(static_cast<std::size_t>(N));
  cuda_emulator em;
  em.input(x);
  em.input(w);
  em.output(y);
  em.output(r);
  CHECK_THROWS_WITH(
      kc::rmsnorm_forward_launch(emulator_launcher{&em}, y.data(), r.data(), x.data(), w.data(), N,
                                 H, 1e-5),
      Catch::Contains("rmsnorm_forward block") && Catch::Contains("outside every buffer"));
  // An output registered as an input: the store is refused.
  cuda_emulator em2;
  const std::vector<float> w_ok(static_cast<std::size_t>(H), 1.f);
  em2.input(x);
  em2.input(w_ok);
  em2.input(y);
  em2.output(r);
  CHECK_THROWS_WITH(kc::rmsnorm_forward_launch(emulator_launcher{&em2}, y.data(), r.data(),
                                               x.data(), w_ok.data(), N, H, 1e-5),
                    Catch::Contains("write to an input buffer"));
}

}  // namespace test_kernels_emulated_rmsnorm
