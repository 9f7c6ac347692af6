// The global gradient norm's CUDA kernels (include/tessera/kernels/cuda/grad_norm.cuh),
// their own bodies run by the block emulator (tests/support/cuda_emulator.hpp)
// through the launch functions the GPU path calls, against a float64
// reference and the host kernels (include/tessera/kernels/optimizer.hpp) on
// fresh random inputs with a NaN-poisoned result and scratch: n = 0, small
// n, n no multiple of the vector width or of a block's 2048 elements, n
// that fills the 1024 partial sums with several grid-stride steps, and a
// misaligned pointer (the scalar variant).
//
// The sum of squares: every square of a float, bf16 or fp16 value is exact
// in float64 (at most 48 significant bits), so the only rounding is in the
// additions, in another order than the host's (a CUB block tree over
// grid-stride shares against blocks of 4096 in order). A float64 sum of
// positive terms whose longest chain of additions is d has a relative error
// below d * 2^-53: the kernel's chains are short (a thread's share of at
// most ceil(n / 262144) elements, 5 shuffle levels, 8 warps, a thread's
// partials, 5 + 8 again: under 60 for these n, 7e-15), the host's up to
// 4096 + n / 4096 (5e-13 at n = 3M). Against a long double (64-bit
// mantissa) reference and against the host, 1e-12 relative (f64_tol), as
// the GPU test (tests/cuda/kernels.cpp). Bit for bit: the same n (and the
// same alignment of g, which picks the variant and so each thread's share)
// twice, with another block order and thread interleaving; and accumulate,
// which adds the same total to the value there.
//
// The clip coefficient is the host's function on the same double (sqrt is
// correctly rounded on both): bit for bit with kernels::clip_coefficient,
// NaN for a non-finite sum.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <tessera/kernels/cuda/grad_norm.cuh>
#include <tessera/kernels/optimizer.hpp>
#include <tessera/optim/clip.hpp>

#include "../support/cuda_emulator.hpp"
#include "kernel_testing.hpp"

namespace test_kernels_emulated_grad_norm {

namespace kc = tessera::kernels::cuda;
namespace hk = tessera::kernels;
using tessera::bf16;
using tessera::fp16;
using namespace tessera::testing;

namespace {

/// float64 sums of positive terms in two orders (see the header comment).
constexpr double f64_tol = 1e-12;

const std::vector<std::string> sum_squares_kernels = {"sum_squares_partial", "sum_squares_final"};

template <class T>
bool same_bits(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

/// sum of g^2 in long double, in order.
template <class G>
double reference_sum_squares(const G* g, std::int64_t n) {
  long double s = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const long double x = as_double(g[i]);
    s += x * x;
  }
  return static_cast<double>(s);
}

/// grad_sum_squares on the emulator (`seed` orders its blocks and threads):
/// *out (poisoned unless accumulating onto `init`), and the scratch, with
/// three poisoned doubles past what the launch needs to check that exactly
/// the partial count is written.
struct emulated_sum {
  double out = 0;
  std::vector<double> scratch;
  std::int64_t partials = 0;
};
template <class G>
emulated_sum run_sum_squares(const std::vector<G>& g, int offset, std::int64_t n, bool accumulate,
                             double init, std::uint64_t seed) {
  cuda_emulator em(seed);
  std::vector<double> out(1, accumulate ? init : nan_value<double>());
  const std::size_t bytes = kc::grad_sum_squares_scratch_bytes(n);
  auto scratch = std::vector<double>(bytes / sizeof(double) + 3, nan_value<double>());
  if (!g.empty()) em.input(g);
  em.output(out);
  em.output(scratch);
  std::vector<std::string> launched;
  kc::grad_sum_squares_launch(emulator_launcher{&em, std::int64_t(1) << 24, &launched}, out.data(),
                              n == 0 ? nullptr : g.data() + offset, n, scratch.data(), bytes,
                              accumulate);
  CHECK(launched == sum_squares_kernels);
  return {out[0], scratch, static_cast<std::int64_t>(bytes / sizeof(double))};
}

template <class G>
void sum_squares_case(std::int64_t n, int offset, std::uint64_t seed) {
  INFO("n=" << n << " offset=" << offset);
  std::mt19937_64 rng(seed);
  const auto g = random_vector<G>(static_cast<std::size_t>(n + offset), rng, -2, 2);
  const G* gp = g.data() + offset;
  const double ref = reference_sum_squares(gp, n);
  double host = nan_value<double>();
  hk::grad_sum_squares(ctx, &host, gp, n);

  const emulated_sum a = run_sum_squares(g, offset, n, false, 0, seed);
  CHECK(std::abs(a.out - ref) <= f64_tol * ref);
  CHECK(std::abs(a.out - host) <= f64_tol * host);
  // One partial per block of stage 1, a function of n only; nothing past them.
  CHECK(a.partials == kc::grad_norm_partial_config(n).grid_x);
  for (std::int64_t i = 0; i < a.partials + 3; ++i)
    CHECK(std::isnan(a.scratch[static_cast<std::size_t>(i)]) == (i >= a.partials));

  // Same n, same bits: another block order and thread interleaving.
  const emulated_sum b = run_sum_squares(g, offset, n, false, 0, seed + 1000);
  CHECK(same_bits(a.out, b.out));
  CHECK(std::memcmp(a.scratch.data(), b.scratch.data(), a.scratch.size() * sizeof(double)) == 0);

  // accumulate adds the same total to what *out holds.
  const double init = std::uniform_real_distribution<double>(0, 100)(rng);
  const emulated_sum c = run_sum_squares(g, offset, n, true, init, seed + 2000);
  CHECK(same_bits(c.out, init + a.out));
}

}  // namespace

TEST_CASE("emulated cuda grad_sum_squares matches float64 and the host, same bits for the same n",
          "[kernels][emulated][grad_norm]") {
  std::uint64_t seed = 1;
  for (auto [n, offset] : {std::pair<std::int64_t, int>{1, 0},
                           {7, 0},             // fewer than a pack of 8 bf16
                           {255, 0},           // fewer than the block's threads
                           {2049, 0},          // two partials, the second of one element
                           {2048 * 3 + 1, 0},  // four partials
                           {100003, 1},        // misaligned: the scalar variant; 49 partials
                           {3'000'001, 0}}) {  // 1024 partials, threads loop (grid-stride)
    sum_squares_case<float>(n, offset, seed++);
    sum_squares_case<bf16>(n, offset, seed++);
    // fp16 (precision::fp16_mixed's storage) takes bf16's 2-byte path; the
    // 3M-element case stays float and bf16 only, for time.
    if (n < 3'000'001) sum_squares_case<fp16>(n, offset, seed++);
  }
}

TEST_CASE("emulated cuda grad_sum_squares of nothing writes zero, or adds zero",
          "[kernels][emulated][grad_norm]") {
  // What the ZeRO optimizer relies on (parallel/zero.hpp): n = 0 with a null
  // pointer still writes *out.
  const std::vector<float> none;
  const emulated_sum a = run_sum_squares(none, 0, 0, false, 0, 1);
  CHECK(same_bits(a.out, 0.0));
  CHECK(a.partials == 1);
  const emulated_sum b = run_sum_squares(none, 0, 0, true, 2.5, 2);
  CHECK(b.out == 2.5);
}

TEST_CASE("emulated cuda grad_sum_squares over two buffers, as the host and the GPU test",
          "[kernels][emulated][grad_norm]") {
  // bf16 then float32 accumulated into one double (tests/cuda/kernels.cpp).
  std::mt19937_64 rng(108);
  const std::int64_t n = 300'001;
  const auto g = random_vector<bf16>(static_cast<std::size_t>(n), rng);
  const auto f = random_vector<float>(static_cast<std::size_t>(n), rng);
  double host = 0;
  hk::grad_sum_squares(ctx, &host, g.data(), n);
  hk::grad_sum_squares(ctx, &host, f.data(), n, /*accumulate=*/true);
  const double ref = reference_sum_squares(g.data(), n) + reference_sum_squares(f.data(), n);

  cuda_emulator em(3);
  std::vector<double> out(1, nan_value<double>());
  const std::size_t bytes = kc::grad_sum_squares_scratch_bytes(n);
  auto scratch = std::vector<double>(bytes / sizeof(double), nan_value<double>());
  em.input(g);
  em.input(f);
  em.output(out);
  em.output(scratch);
  std::vector<std::string> launched;
  const emulator_launcher launch{&em, std::int64_t(1) << 24, &launched};
  kc::grad_sum_squares_launch(launch, out.data(), g.data(), n, scratch.data(), bytes, false);
  kc::grad_sum_squares_launch(launch, out.data(), f.data(), n, scratch.data(), bytes, true);
  CHECK(launched == std::vector<std::string>{"sum_squares_partial", "sum_squares_final",
                                             "sum_squares_partial", "sum_squares_final"});
  CHECK(std::abs(out[0] - ref) <= f64_tol * ref);
  CHECK(std::abs(out[0] - host) <= f64_tol * host);

  // Too little scratch and a negative n are refused before any launch.
  launched.clear();
  CHECK_THROWS_AS(kc::grad_sum_squares_launch(launch, out.data(), g.data(), n, scratch.data(),
                                              bytes - 1, false),
                  tessera::config_error);
  CHECK_THROWS_AS(
      kc::grad_sum_squares_launch(launch, out.data(), g.data(), -1, scratch.data(), bytes, false),
      tessera::config_error);
  CHECK(launched.empty());
}

TEST_CASE("emulated cuda clip_coefficient equals the host's, NaN for a non-finite sum",
          "[kernels][emulated][grad_norm]") {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (double ss : {0.0, 1e-14, 0.25, 1.0, 4.0, 123.456, 1e6, 1e300, inf, nan}) {
    for (double max_norm : {1.0, 0.5, 1e6, 0.0, -1.0}) {
      INFO("sum_squares=" << ss << " max_norm=" << max_norm);
      float host = nan_value<float>();
      hk::clip_coefficient(ctx, &host, &ss, max_norm);

      cuda_emulator em;
      const std::vector<double> in(1, ss);
      std::vector<float> coef(1, nan_value<float>());
      em.input(in);
      em.output(coef);
      std::vector<std::string> launched;
      kc::clip_coefficient_launch(emulator_launcher{&em, std::int64_t(1) << 24, &launched},
                                  coef.data(), in.data(), max_norm);
      CHECK(launched == std::vector<std::string>{"clip_coefficient"});
      CHECK(same_bits(coef[0], host));
      if (std::isfinite(ss)) {
        CHECK(coef[0] ==
              static_cast<float>(tessera::optim::clip_coefficient(std::sqrt(ss), max_norm)));
        CHECK(coef[0] >= 0.f);
        CHECK(coef[0] <= 1.f);
      } else {
        CHECK(std::isnan(coef[0]));  // the optimizer skips the step
      }
    }
  }
}

}  // namespace test_kernels_emulated_grad_norm
