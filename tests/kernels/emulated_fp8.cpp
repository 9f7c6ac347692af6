// The FP8 scaling kernels on the GPU (include/tessera/kernels/cuda/fp8.cuh),
// their own bodies run by the block emulator (tests/support/cuda_emulator.hpp)
// through the launch functions the GPU path calls, against the host kernels
// (include/tessera/kernels/fp8.hpp), bit for bit: every kernel is the host's
// arithmetic element for element (the scaled cast of kernels/detail/fp8.hpp,
// fp8_amax_max and fp8_scale_of of core/fp8_scale.hpp, one float division
// for the inverse scale), and a maximum rounds nothing, so no order differs.
//
// Inputs are float32, bf16 and fp16 (the GPU's), drawn over many binades so
// that the casts round to subnormals and zeros and saturate, with NaN (a
// negative one with a payload), +-inf, +-0 and the largest values planted;
// the scale is no power of two. Every buffer is registered as exactly the
// elements a call may touch, so one access outside fails; outputs are
// poisoned, and each cast runs twice with two poison bytes (0x7f, NaN, and
// 0x80, -0: no element can be both), so an element left unwritten shows.
//
// - fp8_amax_accumulate: n = 0 (nothing launched, the amax kept), 1, below a
//   pack, below a block, two and four partials, a misaligned x (the scalar
//   variant), and 1024 partials whose threads loop (grid-stride); running
//   amaxes below and above the buffer's and NaN; a NaN at the first element,
//   in the middle and at the last, each of which the result must keep (a
//   max that drops NaN, in a thread, the block reduction or the final fold,
//   loses it at one of these places); exactly the partial count written.
// - fp8_update_scale: fp8_scale_of over amaxes that give a scale, overflow
//   it (a subnormal amax) or keep it (0, -0, inf, NaN), both formats' maxima
//   and margins.
// - fp8_quantize: the same sizes, x or q misaligned (the scalar variant),
//   with and without the inverse scale, both formats; a scale that is not
//   finite > 0, which the device does not check, casts as kernels.hpp says.
// - fp8_quantize_transposed: 1 x 1, 1 x n, n x 1, one tile, sizes no
//   multiple of the tile, several tiles each way, empty; and a grid smaller
//   than the tiles, so the body's tile loops take the rest.
// - current scaling end to end: amax, scale from it, cast with its inverse,
//   all on the device, as the host does it.
#include <algorithm>
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <tessera/kernels/cuda/fp8.cuh>
#include <tessera/kernels/fp8.hpp>

#include "../support/cuda_emulator.hpp"
#include "kernel_testing.hpp"

namespace test_kernels_emulated_fp8 {

namespace kc = tessera::kernels::cuda;
namespace hk = tessera::kernels;
using tessera::bf16;
using tessera::fp16;
using tessera::fp8_e4m3;
using tessera::fp8_e5m2;
using namespace tessera::testing;

namespace {

using strings = std::vector<std::string>;

/// A scale that is no power of two: x * scale rounds (E4M3's 448 over an
/// amax of 5.3).
const float scale_np2 = 448.0f / 5.3f;

/// A negative NaN with a payload (its bits unlike the canonical NaN's).
const float neg_nan = tessera::detail::bits_float(0xffc10000u);

bool same_float(float a, float b) {
  return std::memcmp(&a, &b, sizeof(float)) == 0;
}

/// n values +-e^u, u uniform in [-spread/2, spread/2) (rounded to T), so a
/// scaled cast meets zeros, subnormals, normals and saturation.
template <class T>
std::vector<T> wide_values(std::int64_t n, std::mt19937_64& rng, double spread = 26) {
  std::uniform_real_distribution<double> u(-0.5, 0.5);
  std::vector<T> x(static_cast<std::size_t>(n));
  for (auto& v : x) v = tessera::to<T>((rng() & 1 ? -1.0 : 1.0) * std::exp(u(rng) * spread));
  return x;
}

/// Plants NaN, +-inf, +-0 and T's largest finite value over the first
/// elements of x[offset, offset + n), where there are that many.
template <class T>
void plant_specials(std::vector<T>& x, int offset, std::int64_t n) {
  const float big = std::is_same_v<T, fp16> ? 65504.0f : 3.0e38f;
  const float special[] = {neg_nan, INFINITY, -INFINITY, 0.0f, -0.0f, big, -big};
  for (std::size_t k = 0; k < 7 && static_cast<std::int64_t>(k) < n; ++k)
    x[static_cast<std::size_t>(offset) + k] = tessera::to<T>(special[k]);
}

// ---- amax -------------------------------------------------------------------------------------

/// fp8_amax_accumulate over x[offset, offset + n) from `init` on the
/// emulator; CHECKs the launches and that the scratch holds exactly the
/// partial count (poisoned with -1, which no partial can be).
template <class T>
float emulated_amax(const std::vector<T>& x, int offset, std::int64_t n, float init,
                    std::uint64_t seed) {
  cuda_emulator em(seed);
  std::vector<float> amax(1, init);
  const std::size_t bytes = kc::fp8_amax_scratch_bytes(n);
  std::vector<float> scratch(bytes / sizeof(float) + 3, -1.0f);
  em.buffer(x.data() + offset, n, false);
  em.output(amax);
  em.output(scratch);
  strings launched;
  kc::fp8_amax_accumulate_launch(emulator_launcher{&em, std::int64_t(1) << 24, &launched},
                                 amax.data(), x.data() + offset, n, scratch.data(), bytes);
  CHECK(launched == (n == 0 ? strings{} : strings{"fp8_amax_partial", "fp8_amax_final"}));
  const std::int64_t partials = n == 0 ? 0 : kc::fp8_amax_partial_config(n).grid_x;
  CHECK(static_cast<std::int64_t>(bytes / sizeof(float)) == kc::fp8_amax_partial_config(n).grid_x);
  std::int64_t wrong = 0;
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(scratch.size()); ++i)
    wrong += (scratch[static_cast<std::size_t>(i)] == -1.0f) != (i >= partials);
  CHECK(wrong == 0);
  return amax[0];
}

/// One size and alignment: the buffer's amax from several running amaxes,
/// then with a NaN planted at `nan_at` (the first, a middle and the last
/// element), bit for bit with the host: +inf (an amax is never NaN).
template <class T>
void amax_case(std::int64_t n, int offset, std::uint64_t seed) {
  INFO("T=" << tessera::dtype_name<T>() << " n=" << n << " offset=" << offset);
  std::mt19937_64 rng(seed);
  auto x = wide_values<T>(n + offset, rng, 20);
  const T* xp = x.data() + offset;
  for (const float init : {0.0f, 1e-3f, 3e38f, NAN, -1.0f}) {
    INFO("init=" << init);
    float want = init;
    hk::fp8_amax_accumulate(ctx, &want, xp, n);
    const float got = emulated_amax(x, offset, n, init, seed);
    CHECK(same_float(got, want));
    if (n > 0 && init == 0.0f) CHECK(got == hk::fp8_amax(ctx, xp, n));
  }
  if (n == 0) return;
  for (const std::int64_t at : {std::int64_t(0), n / 2, n - 1}) {
    INFO("NaN at " << at);
    auto y = x;
    y[static_cast<std::size_t>(offset + at)] = tessera::to<T>(neg_nan);
    float want = 2.0f;
    hk::fp8_amax_accumulate(ctx, &want, y.data() + offset, n);
    const float got = emulated_amax(y, offset, n, 2.0f, seed + 7);
    CHECK(got == INFINITY);
    CHECK(same_float(got, want));
  }
}

// ---- the casts --------------------------------------------------------------------------------

/// fp8_quantize of x[xo, xo + n) into q[qo, qo + n) on the emulator with
/// the scale `s` (and the inverse when `inv` is not null), q poisoned with
/// `poison`; returns the n bytes written.
template <class F8, class T>
std::vector<F8> emulated_quantize(const std::vector<T>& x, int xo, int qo, std::int64_t n, float s,
                                  float* inv, unsigned char poison, std::uint64_t seed) {
  cuda_emulator em(seed);
  std::vector<F8> q(static_cast<std::size_t>(n + qo));
  std::fill(q.begin(), q.end(), F8::from_bits(poison));  // memset(nullptr, .., 0) is undefined
  const std::vector<float> scale(1, s);
  std::vector<float> inv_out(1, NAN);
  em.buffer(x.data() + xo, n, false);
  em.buffer(q.data() + qo, n, true);
  em.input(scale);
  if (inv) em.output(inv_out);
  strings launched;
  kc::fp8_quantize_launch(emulator_launcher{&em, std::int64_t(1) << 24, &launched}, q.data() + qo,
                          inv ? inv_out.data() : nullptr, x.data() + xo, n, scale.data());
  CHECK(launched == (n == 0 && !inv ? strings{} : strings{"fp8_quantize"}));
  if (inv) *inv = inv_out[0];
  return std::vector<F8>(q.begin() + qo, q.end());
}

template <class F8>
bool same_bytes(const std::vector<F8>& a, const std::vector<F8>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size()) == 0);
}

/// One size and alignment of fp8_quantize, with and without the inverse,
/// against the host's pointer form.
template <class F8, class T>
void quantize_case(std::int64_t n, int xo, int qo, float s, std::uint64_t seed) {
  INFO("F8=" << tessera::dtype_name<F8>() << " T=" << tessera::dtype_name<T>() << " n=" << n
             << " x offset=" << xo << " q offset=" << qo << " scale=" << s);
  std::mt19937_64 rng(seed);
  auto x = wide_values<T>(n + xo, rng);
  plant_specials(x, xo, n);
  std::vector<F8> want(static_cast<std::size_t>(n));
  float want_inv = NAN;
  hk::fp8_quantize(ctx, want.data(), &want_inv, x.data() + xo, n, &s);
  for (const unsigned char poison : {0x7f, 0x80}) {
    float inv = 0.0f;
    CHECK(same_bytes(emulated_quantize<F8>(x, xo, qo, n, s, &inv, poison, seed + poison), want));
    CHECK(same_float(inv, want_inv));
    CHECK(same_bytes(emulated_quantize<F8>(x, xo, qo, n, s, nullptr, poison, seed + 1), want));
  }
}

/// fp8_quantize_transposed of x (rows, cols) on the emulator, qt poisoned
/// with `poison`; `grid` overrides the launch's grid (x, y) to run the
/// body over fewer blocks than tiles (0: the launch function's). The
/// inverse scale it writes must be 1 / s.
template <class F8, class T>
std::vector<F8> emulated_transposed(const std::vector<T>& x, std::int64_t rows, std::int64_t cols,
                                    float s, unsigned char poison, std::uint64_t seed,
                                    std::int64_t grid_x = 0, std::int64_t grid_y = 0) {
  cuda_emulator em(seed);
  std::vector<F8> qt(x.size());
  std::fill(qt.begin(), qt.end(), F8::from_bits(poison));
  const std::vector<float> scale(1, s);
  std::vector<float> inv(1, NAN);
  em.input(x);
  em.output(qt);
  em.input(scale);
  em.output(inv);
  strings launched;
  const emulator_launcher launch{&em, std::int64_t(1) << 24, &launched};
  if (grid_x == 0) {
    kc::fp8_quantize_transposed_launch(launch, qt.data(), inv.data(), x.data(), rows, cols,
                                       scale.data());
  } else {
    kc::launch_config c = kc::fp8_transpose_config(rows, cols);
    c.grid_x = grid_x;
    c.grid_y = grid_y;
    launch.template run<kc::detail::fp8_quantize_transposed_body<F8, T>>(
        c, qt.data(), inv.data(), x.data(), rows, cols, scale.data());
  }
  CHECK(launched == strings{"fp8_quantize_transposed"});  // an empty x still writes the inverse
  CHECK(inv[0] == 1.0f / s);
  return qt;
}

template <class F8, class T>
void transposed_case(std::int64_t rows, std::int64_t cols, std::uint64_t seed,
                     std::int64_t grid_x = 0, std::int64_t grid_y = 0) {
  INFO("F8=" << tessera::dtype_name<F8>() << " T=" << tessera::dtype_name<T>() << " rows=" << rows
             << " cols=" << cols << " grid=" << grid_x << "x" << grid_y);
  std::mt19937_64 rng(seed);
  auto x = wide_values<T>(rows * cols, rng);
  plant_specials(x, 0, rows * cols);
  std::vector<F8> want(x.size());
  hk::fp8_quantize_transposed(ctx, want.data(), nullptr, x.data(), rows, cols, &scale_np2);
  for (const unsigned char poison : {0x7f, 0x80})
    CHECK(same_bytes(
        emulated_transposed<F8>(x, rows, cols, scale_np2, poison, seed + poison, grid_x, grid_y),
        want));
}

}  // namespace

TEST_CASE("emulated cuda fp8_amax_accumulate equals the host's bits, NaN kept wherever it is",
          "[kernels][emulated][fp8]") {
  std::uint64_t seed = 1;
  for (const auto& c : {std::pair<std::int64_t, int>{0, 0},
                        {1, 0},
                        {7, 0},             // fewer than a pack of 8 bf16
                        {255, 0},           // fewer than the block's threads
                        {2049, 0},          // two partials, the second of one element
                        {2048 * 3 + 1, 0},  // four partials
                        {100003, 1}}) {     // misaligned: the scalar variant; 49 partials
    amax_case<float>(c.first, c.second, seed++);
    amax_case<bf16>(c.first, c.second, seed++);
    amax_case<fp16>(c.first, c.second, seed++);
  }
  // 1024 partials, each thread two grid-stride steps (bf16 only, for time).
  amax_case<bf16>(2048 * 1024 + 12345, 0, seed++);
}

TEST_CASE("emulated cuda fp8_amax_accumulate refuses bad arguments before any launch",
          "[kernels][emulated][fp8]") {
  cuda_emulator em;
  const std::vector<float> x(5000, 1.0f);
  std::vector<float> amax(1, 0.0f);
  const std::size_t bytes = kc::fp8_amax_scratch_bytes(5000);
  std::vector<float> scratch(bytes / sizeof(float));
  strings launched;
  const emulator_launcher launch{&em, std::int64_t(1) << 24, &launched};
  CHECK_THROWS_WITH(kc::fp8_amax_accumulate_launch(launch, amax.data(), x.data(), 5000,
                                                   scratch.data(), bytes - 1),
                    Catch::Contains("fp8_amax_accumulate (cuda): scratch of 11 bytes"));
  CHECK_THROWS_WITH(
      kc::fp8_amax_accumulate_launch(launch, amax.data(), x.data(), -1, scratch.data(), bytes),
      Catch::Contains("n=-1 must be >= 0"));
  CHECK_THROWS_WITH(
      kc::fp8_amax_accumulate_launch(launch, nullptr, x.data(), 5000, scratch.data(), bytes),
      Catch::Contains("d_amax is null"));
  CHECK(launched.empty());
}

TEST_CASE("emulated cuda fp8_update_scale equals the host's, keeping the scale where it must",
          "[kernels][emulated][fp8]") {
  const float previous = 0.8125f;
  for (const float fmax : {fp8_e4m3::max_finite, fp8_e5m2::max_finite})
    for (const int margin : {0, 2})
      for (const float a : {1.0f, 3.7f, 1e-3f, 6e4f, 1e-41f, 0.0f, -0.0f, INFINITY, NAN}) {
        INFO("fp8_max=" << fmax << " margin=" << margin << " amax=" << a);
        float want = previous;
        hk::fp8_update_scale(ctx, &want, &a, fmax, margin);
        cuda_emulator em;
        std::vector<float> scale(1, previous);
        const std::vector<float> amax(1, a);
        em.output(scale);
        em.input(amax);
        strings launched;
        kc::fp8_update_scale_launch(emulator_launcher{&em, std::int64_t(1) << 24, &launched},
                                    scale.data(), amax.data(), fmax, margin);
        CHECK(launched == strings{"fp8_update_scale"});
        CHECK(same_float(scale[0], want));
        CHECK(same_float(scale[0], tessera::fp8_scale_of(a, fmax, margin, previous)));
        if (!(a > 0.0f) || !std::isfinite(a) || a < 1e-40f) CHECK(scale[0] == previous);
      }
  cuda_emulator em;
  std::vector<float> scale(1, 1.0f);
  const std::vector<float> amax(1, 2.0f);
  strings launched;
  const emulator_launcher launch{&em, std::int64_t(1) << 24, &launched};
  CHECK_THROWS_WITH(kc::fp8_update_scale_launch(launch, scale.data(), amax.data(), NAN, 0),
                    Catch::Contains("fp8_max nan must be a finite value > 0"));
  CHECK_THROWS_WITH(kc::fp8_update_scale_launch(launch, scale.data(), amax.data(), 448.0f, -1),
                    Catch::Contains("margin -1 must be in [0, 64]"));
  CHECK_THROWS_WITH(kc::fp8_update_scale_launch(launch, scale.data(), nullptr, 448.0f, 0),
                    Catch::Contains("d_amax is null"));
  CHECK(launched.empty());
}

TEST_CASE("emulated cuda fp8_quantize equals the host's bytes and inverse scale",
          "[kernels][emulated][fp8]") {
  std::uint64_t seed = 100;
  struct size_case {
    std::int64_t n;
    int xo, qo;  // elements before x and q: odd is misaligned, the scalar variant
  };
  for (const size_case c : {size_case{0, 0, 0},
                            {1, 0, 0},
                            {7, 0, 0},
                            {255, 0, 0},
                            {4097, 0, 0},  // three blocks of bf16 packs, a scalar tail
                            {100003, 0, 0},
                            {4097, 1, 0},      // x misaligned
                            {4097, 0, 3}}) {   // q misaligned
    for (const float s : {scale_np2, 1e4f}) {  // 1e4: most of the casts saturate
      quantize_case<fp8_e4m3, float>(c.n, c.xo, c.qo, s, seed++);
      quantize_case<fp8_e4m3, bf16>(c.n, c.xo, c.qo, s, seed++);
      quantize_case<fp8_e4m3, fp16>(c.n, c.xo, c.qo, s, seed++);
      quantize_case<fp8_e5m2, float>(c.n, c.xo, c.qo, s, seed++);
      quantize_case<fp8_e5m2, bf16>(c.n, c.xo, c.qo, s, seed++);
      quantize_case<fp8_e5m2, fp16>(c.n, c.xo, c.qo, s, seed++);
    }
  }
}

TEST_CASE("emulated cuda fp8_quantize saturates large values, keeps non-finite ones",
          "[kernels][emulated][fp8]") {
  // Finite values past the largest FP8 value land on it (sign kept); NaN and
  // infinity do not (E5M2 keeps infinity, E4M3 has none: NaN).
  const std::vector<float> x = {1e6f, -1e6f, 3e38f, INFINITY, -INFINITY, NAN, 448.0f, 0.5f};
  float inv = 0;
  const auto q4 = emulated_quantize<fp8_e4m3>(x, 0, 0, 8, 4.0f, &inv, 0x80, 5);
  CHECK(inv == 0.25f);
  const std::vector<unsigned> want4 = {0x7e, 0xfe, 0x7e, 0x7f, 0xff, 0x7f, 0x7e, 0x40};
  const auto q5 = emulated_quantize<fp8_e5m2>(x, 0, 0, 8, 4.0f, nullptr, 0x80, 6);
  const std::vector<unsigned> want5 = {0x7b, 0xfb, 0x7b, 0x7c, 0xfc, 0x7f, 0x67, 0x40};
  for (std::size_t i = 0; i < x.size(); ++i) {
    INFO("x=" << x[i]);
    CHECK(q4[i].bits == want4[i]);
    CHECK(q5[i].bits == want5[i]);
  }
}

TEST_CASE("emulated cuda fp8_quantize casts with a scale the device cannot check, as documented",
          "[kernels][emulated][fp8]") {
  // kernels/cuda/kernels.hpp: q = F8(x * s) whatever s is; the host refuses
  // such a scale, so the reference is the cast itself.
  std::mt19937_64 rng(9);
  auto x = wide_values<bf16>(300, rng, 10);
  plant_specials(x, 0, 300);
  for (const float s : {0.0f, -0.0f, -2.5f, NAN, INFINITY}) {
    INFO("scale=" << s);
    float inv = 0;
    const auto q = emulated_quantize<fp8_e4m3>(x, 0, 0, 300, s, &inv, 0x80, 11);
    const auto q_pos = emulated_quantize<fp8_e4m3>(x, 0, 0, 300, 2.5f, nullptr, 0x80, 12);
    CHECK(same_float(inv, 1.0f / s));
    std::int64_t wrong = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const float v = tessera::to<float>(x[i]);
      const unsigned b = q[i].bits;
      wrong += b != hk::detail::fp8_scaled_cast<fp8_e4m3>(x[i], s).bits;
      const bool finite = std::isfinite(v);
      if (s == 0.0f && finite) wrong += (b & 0x7fu) != 0;                         // +-0
      if (std::isnan(s)) wrong += (b & 0x7fu) != 0x7fu;                           // NaN
      if (s == INFINITY && finite && v != 0) wrong += (b & 0x7fu) != 0x7eu;       // +-448
      if (s == INFINITY && v == 0) wrong += (b & 0x7fu) != 0x7fu;                 // 0 * inf: NaN
      if (s == -2.5f && finite && v != 0) wrong += b != (q_pos[i].bits ^ 0x80u);  // sign flipped
    }
    CHECK(wrong == 0);
  }
  cuda_emulator em;
  strings launched;
  std::vector<fp8_e4m3> q(4);
  const emulator_launcher launch{&em, std::int64_t(1) << 24, &launched};
  CHECK_THROWS_WITH(kc::fp8_quantize_launch(launch, q.data(), nullptr, x.data(), -2, &scale_np2),
                    Catch::Contains("fp8_quantize (cuda): n=-2 must be >= 0"));
  CHECK_THROWS_WITH(kc::fp8_quantize_launch(launch, q.data(), nullptr, x.data(), 4,
                                            static_cast<const float*>(nullptr)),
                    Catch::Contains("d_scale is null"));
  CHECK(launched.empty());
}

TEST_CASE("emulated cuda fp8_quantize_transposed equals the host's transposed cast",
          "[kernels][emulated][fp8]") {
  std::uint64_t seed = 500;
  for (const auto& rc : {std::pair<std::int64_t, std::int64_t>{1, 1},
                         {1, 77},   // one row: a column of qt
                         {77, 1},   // one column: a row of qt
                         {32, 32},  // one whole tile
                         {33, 65},  // edge tiles of 1 row and 1 column
                         {100, 37},
                         {64, 96},  // whole tiles, several each way
                         {0, 5},
                         {5, 0}}) {
    transposed_case<fp8_e4m3, float>(rc.first, rc.second, seed++);
    transposed_case<fp8_e4m3, bf16>(rc.first, rc.second, seed++);
    transposed_case<fp8_e4m3, fp16>(rc.first, rc.second, seed++);
    transposed_case<fp8_e5m2, float>(rc.first, rc.second, seed++);
    transposed_case<fp8_e5m2, bf16>(rc.first, rc.second, seed++);
    transposed_case<fp8_e5m2, fp16>(rc.first, rc.second, seed++);
  }
  // A grid of 2 x 3 blocks over 5 x 4 tiles (150 columns, 100 rows): the
  // blocks loop over the tiles past the grid, as past the grid's limits.
  transposed_case<fp8_e4m3, bf16>(100, 150, seed++, 2, 3);
  transposed_case<fp8_e5m2, float>(100, 150, seed++, 2, 3);

  cuda_emulator em;
  strings launched;
  const std::vector<float> x(4, 1.0f);
  std::vector<fp8_e4m3> qt(4);
  const emulator_launcher launch{&em, std::int64_t(1) << 24, &launched};
  CHECK_THROWS_WITH(
      kc::fp8_quantize_transposed_launch(launch, qt.data(), nullptr, x.data(), 2, -2, &scale_np2),
      Catch::Contains("rows=2 and cols=-2 must be >= 0"));
  CHECK_THROWS_WITH(
      kc::fp8_quantize_transposed_launch(launch, qt.data(), nullptr, x.data(), std::int64_t(1) << 40,
                                         std::int64_t(1) << 30, &scale_np2),
      Catch::Contains("overflow a 64-bit size"));
  CHECK_THROWS_WITH(kc::fp8_quantize_transposed_launch(launch, qt.data(), nullptr, x.data(), 2, 2,
                                                       static_cast<const float*>(nullptr)),
                    Catch::Contains("d_scale is null"));
  CHECK(launched.empty());
}

TEST_CASE("emulated cuda current scaling: amax, scale and cast on the device, as the host",
          "[kernels][emulated][fp8]") {
  // The three kernels in the order current scaling runs them, the amax and
  // the scale never leaving the device, against the same calls on the host.
  std::mt19937_64 rng(77);
  const std::int64_t n = 20001;
  const auto x = wide_values<bf16>(n, rng, 12);
  float h_amax = 0.0f, h_scale = 1.0f, h_inv = NAN;
  std::vector<fp8_e4m3> h_q(static_cast<std::size_t>(n));
  hk::fp8_amax_accumulate(ctx, &h_amax, x.data(), n);
  hk::fp8_update_scale(ctx, &h_scale, &h_amax, fp8_e4m3::max_finite, 1);
  hk::fp8_quantize(ctx, h_q.data(), &h_inv, x.data(), n, &h_scale);

  cuda_emulator em(78);
  std::vector<float> amax(1, 0.0f), scale(1, 1.0f), inv(1, NAN);
  const std::size_t bytes = kc::fp8_amax_scratch_bytes(n);
  std::vector<float> scratch(bytes / sizeof(float));
  std::vector<fp8_e4m3> q(static_cast<std::size_t>(n));
  em.input(x);
  for (auto* v : {&amax, &scale, &inv, &scratch}) em.output(*v);
  em.output(q);
  strings launched;
  const emulator_launcher launch{&em, std::int64_t(1) << 24, &launched};
  kc::fp8_amax_accumulate_launch(launch, amax.data(), x.data(), n, scratch.data(), bytes);
  kc::fp8_update_scale_launch(launch, scale.data(), amax.data(), fp8_e4m3::max_finite, 1);
  kc::fp8_quantize_launch(launch, q.data(), inv.data(), x.data(), n, scale.data());
  CHECK(launched ==
        strings{"fp8_amax_partial", "fp8_amax_final", "fp8_update_scale", "fp8_quantize"});
  CHECK(same_float(amax[0], h_amax));
  CHECK(same_float(scale[0], h_scale));
  CHECK(scale[0] != 1.0f);  // the scale moved
  CHECK(same_float(inv[0], h_inv));
  CHECK(same_bytes(q, h_q));
}

}  // namespace test_kernels_emulated_fp8
