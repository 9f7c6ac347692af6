// SwiGLU's CUDA kernels (include/tessera/kernels/cuda/swiglu.cuh), their own
// bodies run by the block emulator (tests/support/cuda_emulator.hpp) through
// the launch functions the GPU path calls, against the host kernels
// (include/tessera/kernels/swiglu.hpp) on fresh random inputs with
// NaN-poisoned outputs: sizes below one block, no multiple of the block (256)
// or the vector width, a misaligned pointer (the scalar variant), the FFN
// rows of Llama 2 7B (11008) and Llama 3 8B (14336), gates far enough from 0
// that exp overflows, in place (out = gate, out = up; dgate = dout,
// dup = dout), and n = 0. Every buffer is registered as exactly the elements
// the call may touch.
//
// Bit for bit (memcmp), forward and backward, float, bf16 and fp16 (with
// float32 or the storage type's activation gradients): the body and
// the host loop call the same functions (kernels/detail/swiglu.hpp) on the
// same float32 values, and under the emulator both are compiled by the host
// compiler, so the same exp (kernels::detail::exp) and the same roundings.
// (On a GPU exp is CUDA's expf: tests/cuda/kernels.cpp holds that path to
// f32_tol and bf16_tol against float64.)
#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <tessera/kernels/cuda/swiglu.cuh>
#include <tessera/kernels/swiglu.hpp>

#include "../support/cuda_emulator.hpp"
#include "kernel_testing.hpp"

namespace test_kernels_emulated_swiglu {

namespace kc = tessera::kernels::cuda;
namespace hk = tessera::kernels;
using tessera::bf16;
using tessera::fp16;
using namespace tessera::testing;

namespace {

// FFN sizes: Llama 2 7B (11008) and Llama 3 8B (14336).
constexpr std::int64_t F7 = 11008, F8 = 14336;

using strings = std::vector<std::string>;

/// Gates in [-6, 6] (silu's curved part) with a few far out, where exp(-g)
/// overflows to inf or underflows to 0: +-100, +-89, -104.
template <class T>
std::vector<T> gates(std::size_t n, std::mt19937_64& rng) {
  auto g = random_vector<T>(n, rng, -6, 6);
  const float far[] = {100.f, -100.f, 89.f, -89.f, -104.f};
  for (std::size_t k = 0; k < 5 && 3 * k + 2 < n; ++k) g[3 * k + 2] = tessera::to<T>(far[k]);
  return g;
}

/// in_offset, out_offset: elements before the inputs and the outputs (odd:
/// misaligned, the scalar variant); in place only when they are equal.
template <class T>
void forward_case(std::int64_t n, int in_offset, int out_offset, std::uint64_t seed) {
  INFO("n=" << n << " in_offset=" << in_offset << " out_offset=" << out_offset);
  std::mt19937_64 rng(seed);
  const int io = in_offset, oo = out_offset;
  const auto g = gates<T>(static_cast<std::size_t>(n + io), rng);
  const auto u = random_vector<T>(g.size(), rng, -2, 2);
  std::vector<T> want(static_cast<std::size_t>(n));
  hk::swiglu_forward(ctx, want.data(), g.data() + io, u.data() + io, n);

  cuda_emulator em(seed);
  auto out = poisoned<T>(static_cast<std::size_t>(n + oo));
  em.buffer(g.data() + io, n, false);
  em.buffer(u.data() + io, n, false);
  em.buffer(out.data() + oo, n, true);
  strings launched;
  const emulator_launcher launch{&em, std::int64_t(1) << 24, &launched};
  kc::swiglu_forward_launch(launch, out.data() + oo, g.data() + io, u.data() + io, n);
  CHECK(same_bits(out.data() + oo, want.data(), n));
  CHECK(launched == (n == 0 ? strings{} : strings{"swiglu_forward"}));
  if (io != oo) return;

  // In place: out = gate, then out = up.
  auto g2 = g, u2 = u;
  em.clear_regions();
  em.buffer(g2.data() + io, n, true);
  em.buffer(u.data() + io, n, false);
  kc::swiglu_forward_launch(launch, g2.data() + io, g2.data() + io, u.data() + io, n);
  CHECK(same_bits(g2.data() + io, want.data(), n));
  em.clear_regions();
  em.buffer(g.data() + io, n, false);
  em.buffer(u2.data() + io, n, true);
  kc::swiglu_forward_launch(launch, u2.data() + io, g.data() + io, u2.data() + io, n);
  CHECK(same_bits(u2.data() + io, want.data(), n));
}

template <class T, class G>
void backward_case(std::int64_t n, int in_offset, int out_offset, std::uint64_t seed) {
  INFO("n=" << n << " in_offset=" << in_offset << " out_offset=" << out_offset);
  std::mt19937_64 rng(seed);
  const int io = in_offset, oo = out_offset;
  const auto g = gates<T>(static_cast<std::size_t>(n + io), rng);
  const auto u = random_vector<T>(g.size(), rng, -2, 2);
  const auto dy = random_vector<G>(g.size(), rng, -1, 1);
  std::vector<G> dg_want(static_cast<std::size_t>(n)), du_want(dg_want.size());
  hk::swiglu_backward(ctx, dg_want.data(), du_want.data(), dy.data() + io, g.data() + io,
                      u.data() + io, n);

  cuda_emulator em(seed);
  auto dg = poisoned<G>(static_cast<std::size_t>(n + oo)), du = poisoned<G>(dg.size());
  em.buffer(g.data() + io, n, false);
  em.buffer(u.data() + io, n, false);
  em.buffer(dy.data() + io, n, false);
  em.buffer(dg.data() + oo, n, true);
  em.buffer(du.data() + oo, n, true);
  strings launched;
  const emulator_launcher launch{&em, std::int64_t(1) << 24, &launched};
  kc::swiglu_backward_launch(launch, dg.data() + oo, du.data() + oo, dy.data() + io, g.data() + io,
                             u.data() + io, n);
  CHECK(same_bits(dg.data() + oo, dg_want.data(), n));
  CHECK(same_bits(du.data() + oo, du_want.data(), n));
  CHECK(launched == (n == 0 ? strings{} : strings{"swiglu_backward"}));
  if (io != oo) return;

  // In place: dgate = dout, then dup = dout.
  auto dy2 = dy;
  em.clear_regions();
  em.buffer(g.data() + io, n, false);
  em.buffer(u.data() + io, n, false);
  em.buffer(dy2.data() + io, n, true);
  em.buffer(du.data() + io, n, true);
  kc::swiglu_backward_launch(launch, dy2.data() + io, du.data() + io, dy2.data() + io,
                             g.data() + io, u.data() + io, n);
  CHECK(same_bits(dy2.data() + io, dg_want.data(), n));
  auto dy3 = dy;
  em.clear_regions();
  em.buffer(g.data() + io, n, false);
  em.buffer(u.data() + io, n, false);
  em.buffer(dy3.data() + io, n, true);
  em.buffer(dg.data() + io, n, true);
  kc::swiglu_backward_launch(launch, dg.data() + io, dy3.data() + io, dy3.data() + io,
                             g.data() + io, u.data() + io, n);
  CHECK(same_bits(dy3.data() + io, du_want.data(), n));
}

}  // namespace

TEST_CASE("emulated cuda swiglu_forward gives the host's bits", "[kernels][emulated][swiglu]") {
  std::uint64_t seed = 1;
  for (auto [n, io, oo] : {std::tuple<std::int64_t, int, int>{1, 0, 0},
                           {7, 0, 0},       // less than one access of V
                           {1003, 0, 0},    // no multiple of the vector width: a scalar tail
                           {4099, 1, 1},    // misaligned: the scalar variant
                           {4099, 1, 0},    // inputs misaligned only: the same
                           {4099, 0, 1},    // output misaligned only: the same
                           {3 * F7, 0, 0},  // three FFN rows of 7B
                           {2 * F8, 0, 0},  // two of 8B
                           {0, 0, 0}}) {    // nothing: no launch
    forward_case<float>(n, io, oo, seed++);
    forward_case<bf16>(n, io, oo, seed++);
    forward_case<fp16>(n, io, oo, seed++);
  }
  cuda_emulator em;
  float* none = nullptr;
  CHECK_THROWS_AS(kc::swiglu_forward_launch(emulator_launcher{&em}, none, none, none, -1),
                  tessera::config_error);
}

TEST_CASE("emulated cuda swiglu_backward gives the host's bits", "[kernels][emulated][swiglu]") {
  std::uint64_t seed = 100;
  for (auto [n, io, oo] : {std::tuple<std::int64_t, int, int>{1, 0, 0},
                           {7, 0, 0},
                           {1003, 0, 0},
                           {4099, 1, 1},
                           {4099, 1, 0},
                           {4099, 0, 1},
                           {3 * F7, 0, 0},
                           {2 * F8 + 5, 0, 0},
                           {0, 0, 0}}) {
    backward_case<float, float>(n, io, oo, seed++);
    backward_case<bf16, float>(n, io, oo, seed++);
    backward_case<bf16, bf16>(n, io, oo, seed++);
    backward_case<fp16, float>(n, io, oo, seed++);
    backward_case<fp16, fp16>(n, io, oo, seed++);
  }
  cuda_emulator em;
  bf16* none = nullptr;
  CHECK_THROWS_AS(kc::swiglu_backward_launch(
                      emulator_launcher{&em}, none, none, static_cast<const bf16*>(none),
                      static_cast<const bf16*>(none), static_cast<const bf16*>(none), -1),
                  tessera::config_error);
}

}  // namespace test_kernels_emulated_swiglu
