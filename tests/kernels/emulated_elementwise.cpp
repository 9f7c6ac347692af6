// The element-wise CUDA kernels (include/tessera/kernels/cuda/elementwise.cuh:
// cast, residual_add, count_nonfinite), their own bodies run by the block
// emulator (tests/support/cuda_emulator.hpp) through the launch functions the
// GPU path calls, against the host kernels (include/tessera/kernels/
// elementwise.hpp) on fresh random inputs with NaN-poisoned outputs: sizes
// below one block, no multiple of the block (256) or the vector width, a
// misaligned pointer (the scalar variant), several blocks, and the presets'
// hidden, FFN and vocabulary sizes (4096, 11008, 14336, 32000, 128256).
// Every buffer is registered as exactly the elements the call may touch, so
// a read or write one element outside fails.
//
// cast and residual_add: bit for bit (memcmp). Both are the host's arithmetic
// element for element (tessera::to; one float32 add rounded once), with no
// order to differ. residual_add also in place (out = a, out = b).
//
// Each for float32, bf16 and fp16 (precision::fp16_mixed's storage).
//
// count_nonfinite has no host kernel: the reference is std::isfinite over the
// buffer. The flag is 1 exactly when some element is inf or NaN (each kind at
// the first element, in the vector body, at the last one of the vector body,
// in the scalar tail and at the last element; finite extremes, -0 and
// subnormals do not set it), and a set flag is never cleared.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <tessera/kernels/cuda/elementwise.cuh>
#include <tessera/kernels/elementwise.hpp>

#include "../support/cuda_emulator.hpp"
#include "kernel_testing.hpp"

namespace test_kernels_emulated_elementwise {

namespace kc = tessera::kernels::cuda;
namespace hk = tessera::kernels;
using tessera::bf16;
using tessera::fp16;
using namespace tessera::testing;

namespace {

// Llama 2 7B / Llama 3 8B hidden size, FFN sizes of 7B (11008) and 8B
// (14336), vocabularies of Llama 2 (32000) and Llama 3 (128256).
constexpr std::int64_t H7 = 4096, F7 = 11008, F8 = 14336, V2 = 32000, V3 = 128256;

using strings = std::vector<std::string>;

/// in_offset, out_offset: elements before the input(s) and the output (odd:
/// misaligned, the scalar variant).
template <class To, class From>
void cast_case(std::int64_t n, int in_offset, int out_offset, std::uint64_t seed) {
  INFO("n=" << n << " in_offset=" << in_offset << " out_offset=" << out_offset);
  std::mt19937_64 rng(seed);
  const int io = in_offset, oo = out_offset;
  auto in = random_vector<From>(static_cast<std::size_t>(n + io), rng, -1e3, 1e3);
  // inf, -0, a float32 subnormal (bf16 keeps float32's exponent range), a
  // negative NaN with a payload (bits unlike the poison's), and for fp16 a
  // value past its largest (65504: rounds to inf) and one of its subnormals.
  const float special[] = {1e38f * 10, -0.0f, 1e-40f, tessera::detail::bits_float(0xffc10000u),
                           7e4f,       3e-6f};
  for (std::size_t k = 0; k < 6 && static_cast<std::int64_t>(k) < n; ++k)
    in[static_cast<std::size_t>(io) + k] = tessera::to<From>(special[k]);
  std::vector<To> want(static_cast<std::size_t>(n));
  hk::cast(ctx, want.data(), in.data() + io, n);

  cuda_emulator em(seed);
  auto out = poisoned<To>(static_cast<std::size_t>(n + oo));
  em.buffer(in.data() + io, n, false);
  em.buffer(out.data() + oo, n, true);
  strings launched;
  kc::cast_launch(emulator_launcher{&em, std::int64_t(1) << 24, &launched}, out.data() + oo,
                  in.data() + io, n);
  CHECK(launched == (n == 0 ? strings{} : strings{"cast"}));
  CHECK(same_bits(out.data() + oo, want.data(), n));
}

template <class T>
void residual_add_case(std::int64_t n, int in_offset, int out_offset, std::uint64_t seed) {
  INFO("n=" << n << " in_offset=" << in_offset << " out_offset=" << out_offset);
  std::mt19937_64 rng(seed);
  const int io = in_offset, oo = out_offset;
  const auto a = random_vector<T>(static_cast<std::size_t>(n + io), rng, -3, 3);
  const auto b = random_vector<T>(a.size(), rng, -3, 3);
  std::vector<T> want(static_cast<std::size_t>(n));
  hk::residual_add(ctx, want.data(), a.data() + io, b.data() + io, n);

  // Out of place.
  cuda_emulator em(seed);
  auto out = poisoned<T>(static_cast<std::size_t>(n + oo));
  em.buffer(a.data() + io, n, false);
  em.buffer(b.data() + io, n, false);
  em.buffer(out.data() + oo, n, true);
  strings launched;
  const emulator_launcher launch{&em, std::int64_t(1) << 24, &launched};
  kc::residual_add_launch(launch, out.data() + oo, a.data() + io, b.data() + io, n);
  CHECK(same_bits(out.data() + oo, want.data(), n));
  CHECK(launched == (n == 0 ? strings{} : strings{"residual_add"}));
  if (io != oo) return;

  // In place: out = a, then out = b (the kernels.hpp aliasing rule).
  std::vector<T> a2 = a, b2 = b;
  em.clear_regions();
  em.buffer(a2.data() + io, n, true);
  em.buffer(b.data() + io, n, false);
  kc::residual_add_launch(launch, a2.data() + io, a2.data() + io, b.data() + io, n);
  CHECK(same_bits(a2.data() + io, want.data(), n));
  em.clear_regions();
  em.buffer(a.data() + io, n, false);
  em.buffer(b2.data() + io, n, true);
  kc::residual_add_launch(launch, b2.data() + io, a.data() + io, b2.data() + io, n);
  CHECK(same_bits(b2.data() + io, want.data(), n));
  CHECK(launched == (n == 0 ? strings{} : strings(3, "residual_add")));
}

/// The flag after count_nonfinite over g[offset, offset + n) from `flag0`,
/// only that range registered; CHECKs the launches.
template <class G>
std::int32_t run_count_nonfinite(const std::vector<G>& g, std::int64_t n, int offset,
                                 std::int32_t flag0, std::uint64_t seed) {
  cuda_emulator em(seed);
  std::vector<std::int32_t> flag{flag0};
  em.buffer(g.data() + offset, n, false);
  em.output(flag);
  strings launched;
  kc::count_nonfinite_launch(emulator_launcher{&em, std::int64_t(1) << 24, &launched}, flag.data(),
                             g.data() + offset, n);
  CHECK(launched == (n == 0 ? strings{} : strings{"count_nonfinite"}));
  return flag[0];
}

/// The reference: 1 when any of the n elements from `offset` is inf or NaN.
template <class G>
std::int32_t any_nonfinite(const std::vector<G>& g, std::int64_t n, int offset) {
  for (std::int64_t i = 0; i < n; ++i)
    if (!std::isfinite(as_double(g[static_cast<std::size_t>(offset + i)]))) return 1;
  return 0;
}

/// Finite random values with the extremes that must not set the flag: -0,
/// the smallest subnormal, the largest finite value and its negative.
template <class G>
std::vector<G> finite_gradient(std::int64_t n, std::mt19937_64& rng) {
  const double range = std::is_same_v<G, fp16> ? 6e4 : 1e30;  // fp16's largest is 65504
  auto g = random_vector<G>(static_cast<std::size_t>(n), rng, -range, range);
  std::vector<G> extremes;
  if constexpr (std::is_same_v<G, bf16>)
    extremes = {bf16::from_bits(0x8000), bf16::from_bits(0x0001), bf16::from_bits(0x7f7f),
                bf16::from_bits(0xff7f)};
  else if constexpr (std::is_same_v<G, fp16>)
    extremes = {fp16::from_bits(0x8000), fp16::from_bits(0x0001), fp16::from_bits(0x7bff),
                fp16::from_bits(0xfbff)};
  else
    extremes = {-0.0f, 1e-45f, std::numeric_limits<float>::max(),
                -std::numeric_limits<float>::max()};
  for (std::size_t k = 0; k < extremes.size() && k + 1 < g.size(); ++k) g[k + 1] = extremes[k];
  return g;
}

template <class G>
void count_nonfinite_cases(std::int64_t n, std::uint64_t seed) {
  INFO("n=" << n);
  constexpr int V = kc::detail::vec_width<G>;
  std::mt19937_64 rng(seed);
  const auto g = finite_gradient<G>(n, rng);
  CHECK(run_count_nonfinite(g, n, 0, 0, seed) == 0);
  CHECK(run_count_nonfinite(g, n, 0, 1, seed) == 1);  // never cleared

  // Non-finite values of each kind: +inf, -inf, a quiet NaN, a negative NaN
  // with a payload (bits; std::isfinite sees the same).
  std::vector<G> bad;
  if constexpr (std::is_same_v<G, bf16>)
    bad = {bf16::from_bits(0x7f80), bf16::from_bits(0xff80), bf16::from_bits(0x7fc0),
           bf16::from_bits(0xffc1)};
  else if constexpr (std::is_same_v<G, fp16>)
    bad = {fp16::from_bits(0x7c00), fp16::from_bits(0xfc00), fp16::from_bits(0x7e00),
           fp16::from_bits(0xfe01)};
  else
    bad = {INFINITY, -INFINITY, std::numeric_limits<float>::quiet_NaN(),
           tessera::detail::bits_float(0xffc00001u)};
  const std::int64_t body_end = n / V * V;  // the first element of the scalar tail
  for (std::int64_t pos : {std::int64_t(0), n / 2, body_end - 1, body_end, n - 1}) {
    if (pos < 0 || pos >= n) continue;
    for (const G& x : bad) {
      INFO("pos=" << pos << " bits=" << tessera::detail::float_bits(tessera::to<float>(x)));
      auto h = g;
      h[static_cast<std::size_t>(pos)] = x;
      REQUIRE(any_nonfinite(h, n, 0) == 1);
      CHECK(run_count_nonfinite(h, n, 0, 0, seed) == 1);
      CHECK(run_count_nonfinite(h, n, 0, 1, seed) == 1);
    }
  }

  // Misaligned (the scalar variant): the view g[1, n) sees a NaN at its
  // first element, and not one just before it.
  if (n >= 2) {
    auto h = g;
    h[1] = bad[2];
    CHECK(run_count_nonfinite(h, n - 1, 1, 0, seed) == 1);
    h[1] = g[1];
    h[0] = bad[2];
    CHECK(run_count_nonfinite(h, n - 1, 1, 0, seed) == 0);
  }

  // Every block sees one: still 1 (integer OR, any order).
  auto h = g;
  for (std::int64_t i = 0; i < n; i += 97) h[static_cast<std::size_t>(i)] = bad[3];
  CHECK(run_count_nonfinite(h, n, 0, 0, seed) == 1);
}

}  // namespace

TEST_CASE("emulated cuda cast gives the host's bits", "[kernels][emulated][elementwise]") {
  std::uint64_t seed = 1;
  for (auto [n, io, oo] : {std::tuple<std::int64_t, int, int>{1, 0, 0},
                           {7, 0, 0},       // less than one access of V
                           {1003, 0, 0},    // no multiple of the vector width: a scalar tail
                           {4099, 1, 1},    // misaligned: the scalar variant
                           {4099, 1, 0},    // input misaligned only: the same
                           {4099, 0, 1},    // output misaligned only: the same
                           {3 * H7, 0, 0},  // three hidden rows
                           {V2, 0, 0},      // one Llama 2 vocabulary row
                           {V3 + 5, 0, 0},  // one Llama 3 vocabulary row and a tail
                           {0, 0, 0}}) {    // nothing: no launch
    cast_case<bf16, float>(n, io, oo, seed++);
    cast_case<float, bf16>(n, io, oo, seed++);
    cast_case<fp16, float>(n, io, oo, seed++);
    cast_case<float, fp16>(n, io, oo, seed++);
  }
}

TEST_CASE("emulated cuda residual_add gives the host's bits, in place too",
          "[kernels][emulated][elementwise]") {
  std::uint64_t seed = 100;
  for (auto [n, io, oo] : {std::tuple<std::int64_t, int, int>{1, 0, 0},
                           {7, 0, 0},
                           {777, 0, 0},
                           {4099, 1, 1},    // misaligned: the scalar variant
                           {4099, 1, 0},    // inputs misaligned only: the same
                           {4099, 0, 1},    // output misaligned only: the same
                           {3 * H7, 0, 0},  // 7B / 8B hidden rows
                           {F7 + 3, 0, 0},
                           {0, 0, 0}}) {
    residual_add_case<float>(n, io, oo, seed++);
    residual_add_case<bf16>(n, io, oo, seed++);
    residual_add_case<fp16>(n, io, oo, seed++);
  }
  cuda_emulator em;
  float* none = nullptr;
  CHECK_THROWS_AS(kc::residual_add_launch(emulator_launcher{&em}, none, none, none, -1),
                  tessera::config_error);
}

TEST_CASE("emulated cuda count_nonfinite flags inf and NaN and never clears",
          "[kernels][emulated][elementwise]") {
  std::uint64_t seed = 200;
  // 5 and 3 blocks of 256 x V plus a tail of 3; below one access; one
  // element; an FFN row of 8B (14336, a multiple of both widths: no tail).
  for (std::int64_t n : {std::int64_t(256 * 4 * 5 + 3), std::int64_t(256 * 8 * 3 + 3),
                         std::int64_t(7), std::int64_t(1), F8}) {
    SECTION("float n=" + std::to_string(n)) {
      count_nonfinite_cases<float>(n, seed);
    }
    SECTION("bf16 n=" + std::to_string(n)) {
      count_nonfinite_cases<bf16>(n, seed + 1);
    }
    SECTION("fp16 n=" + std::to_string(n)) {
      count_nonfinite_cases<fp16>(n, seed + 2);
    }
    seed += 3;
  }
  SECTION("n = 0 launches nothing and leaves the flag; bad arguments throw") {
    cuda_emulator em;
    std::vector<std::int32_t> flag{0};
    em.output(flag);
    strings launched;
    kc::count_nonfinite_launch(emulator_launcher{&em, std::int64_t(1) << 24, &launched},
                               flag.data(), static_cast<const float*>(nullptr), 0);
    kc::count_nonfinite_launch(emulator_launcher{&em, std::int64_t(1) << 24, &launched},
                               static_cast<std::int32_t*>(nullptr),
                               static_cast<const bf16*>(nullptr), 0);
    CHECK(launched.empty());
    CHECK(flag[0] == 0);
    CHECK_THROWS_AS(kc::count_nonfinite_launch(emulator_launcher{&em}, flag.data(),
                                               static_cast<const float*>(nullptr), -1),
                    tessera::config_error);
    const std::vector<float> g(4, 1.f);
    CHECK_THROWS_AS(kc::count_nonfinite_launch(emulator_launcher{&em},
                                               static_cast<std::int32_t*>(nullptr), g.data(), 4),
                    tessera::config_error);
  }
}

}  // namespace test_kernels_emulated_elementwise
