// The embedding's CUDA kernels (include/tessera/kernels/cuda/embedding.cuh),
// their own bodies run by the block emulator (tests/support/cuda_emulator.hpp)
// through the launch functions the GPU path calls, against the host kernels
// (include/tessera/kernels/embedding.hpp) on fresh random inputs with
// poisoned outputs: small sizes, V no multiple of the 64 rows a backward
// block owns, H no multiple of its 1024 columns or of the vector width, N
// over several 1024-token tiles, a misaligned pointer (the scalar forward),
// and the Llama 2 7B table (V 32000, H 4096) for a few tokens.
//
// Everything is bit for bit (memcmp): the forward and the local ids are
// copies and integer arithmetic; the backward adds each dout row into dwte
// in increasing token position, the host's order, so every dwte element is
// the same sequence of float additions. Tokens outside [0, V) (which the
// host kernels refuse) are ignored by the CUDA kernels: the forward writes
// zeros, the backward adds nothing, as the host does for ignore_index; the
// host reference is run with those tokens replaced by ignore_index.
#include <catch2/catch.hpp>

#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <tessera/kernels/cuda/embedding.cuh>
#include <tessera/kernels/embedding.hpp>

#include "../support/cuda_emulator.hpp"
#include "kernel_testing.hpp"

namespace test_kernels_emulated_embedding {

namespace kc = tessera::kernels::cuda;
namespace hk = tessera::kernels;
using tessera::bf16;
using tessera::fp16;
using namespace tessera::testing;

namespace {

// Llama 2 7B: hidden size and vocabulary; Llama 3 8B's vocabulary.
constexpr std::int64_t H7 = 4096, V7 = 32000, V8 = 128256;
constexpr std::int32_t ignore_index = -100;
/// Tables above this many elements get random values only in the rows the
/// tokens name (the others are zeros the kernels never read or write), so
/// the 32000 x 4096 case does not draw 131M numbers.
constexpr std::int64_t dense_limit = std::int64_t(1) << 22;

/// N token ids in [0, V): a quarter on two hot rows (the last row, in the
/// last, partial block of 64 rows, and row min(7, V - 1)), the rest uniform;
/// hot rows at the first tile boundary (positions 1023 and 1024). With
/// `out_of_range`, ids the host refuses at a few positions: ignore_index,
/// -1, V, V + 63 (inside the last block's nominal 64 rows when V is no
/// multiple of 64), and the int32 extremes.
std::vector<std::int32_t> draw_tokens(std::int64_t N, std::int64_t V, bool out_of_range,
                                      std::mt19937_64& rng) {
  std::uniform_int_distribution<std::int64_t> u(0, V - 1);
  const auto hot1 = static_cast<std::int32_t>(V - 1);
  const auto hot2 = static_cast<std::int32_t>(std::min<std::int64_t>(7, V - 1));
  std::vector<std::int32_t> t(static_cast<std::size_t>(N));
  for (auto& x : t) {
    const auto r = rng() % 8;
    x = r == 0 ? hot1 : r == 1 ? hot2 : static_cast<std::int32_t>(u(rng));
  }
  if (N > 1024) t[1023] = t[1024] = hot1;
  if (out_of_range) {
    const std::int32_t bad[] = {ignore_index,
                                -1,
                                static_cast<std::int32_t>(V),
                                static_cast<std::int32_t>(V + 63),
                                std::numeric_limits<std::int32_t>::max(),
                                std::numeric_limits<std::int32_t>::min()};
    for (std::size_t i = 0; i < std::size(bad); ++i)
      if (3 + 5 * static_cast<std::int64_t>(i) < N) t[3 + 5 * i] = bad[i];
  }
  return t;
}

/// The ids the host kernels take for `tokens`: those outside [0, V) become
/// ignore_index (a zero row, no gradient), which is what the CUDA kernels do
/// with them.
std::vector<std::int32_t> host_tokens(std::vector<std::int32_t> t, std::int64_t V) {
  for (auto& x : t)
    if (x < 0 || x >= V) x = ignore_index;
  return t;
}

/// A (V, H) table of T after `offset` leading elements: uniform random in
/// [-1, 1), or, above dense_limit, random in the rows `tokens` name and zero
/// elsewhere.
template <class T>
std::vector<T> draw_table(std::int64_t V, std::int64_t H, int offset,
                          const std::vector<std::int32_t>& tokens, std::mt19937_64& rng) {
  const auto n = static_cast<std::size_t>(V * H + offset);
  if (V * H <= dense_limit) return random_vector<T>(n, rng);
  std::vector<T> w(n, tessera::to<T>(0.0));
  std::uniform_real_distribution<double> d(-1, 1);
  for (std::int32_t t : tokens)
    if (t >= 0 && t < V)
      for (std::int64_t h = 0; h < H; ++h)
        w[static_cast<std::size_t>(offset + t * H + h)] = tessera::to<T>(d(rng));
  return w;
}

template <class T>
void forward_case(std::int64_t N, std::int64_t V, std::int64_t H, int offset, std::uint64_t seed) {
  INFO("N=" << N << " V=" << V << " H=" << H << " offset=" << offset);
  std::mt19937_64 rng(seed);
  const auto tokens = draw_tokens(N, V, true, rng);
  const auto wte = draw_table<T>(V, H, offset, tokens, rng);
  std::vector<T> out_host(static_cast<std::size_t>(N * H));
  const auto ht = host_tokens(tokens, V);
  hk::embedding_forward(ctx, out_host.data(), ht.data(), wte.data() + offset, N, V, H,
                        ignore_index);

  cuda_emulator em(seed);
  auto out = poisoned<T>(static_cast<std::size_t>(N * H + offset));
  em.input(tokens);
  em.input(wte);
  em.output(out);
  std::vector<std::string> launched;
  kc::embedding_forward_launch(emulator_launcher{&em, std::int64_t(1) << 24, &launched},
                               out.data() + offset, tokens.data(), wte.data() + offset, N, V, H);
  CHECK(launched == (N == 0 || H == 0 ? std::vector<std::string>{}
                                      : std::vector<std::string>{"embedding_forward"}));
  out.erase(out.begin(), out.begin() + offset);
  CHECK(first_nan(out) == -1);
  CHECK(same_bits(out, out_host));
}

template <class G>
void backward_case(std::int64_t N, std::int64_t V, std::int64_t H, std::uint64_t seed) {
  INFO("N=" << N << " V=" << V << " H=" << H);
  std::mt19937_64 rng(seed);
  const auto tokens = draw_tokens(N, V, true, rng);
  const auto dout = random_vector<G>(static_cast<std::size_t>(N * H), rng);
  std::vector<float> dw = draw_table<float>(V, H, 0, tokens, rng);  // dwte accumulates onto this
  std::vector<float> dw_host = dw;
  const auto ht = host_tokens(tokens, V);
  hk::embedding_backward(ctx, dw_host.data(), dout.data(), ht.data(), N, V, H, ignore_index);

  cuda_emulator em(seed);
  em.input(tokens);
  em.input(dout);
  em.output(dw);
  std::vector<std::string> launched;
  const emulator_launcher launch{&em, std::int64_t(1) << 24, &launched};
  kc::embedding_backward_launch(launch, dw.data(), dout.data(), tokens.data(), N, V, H);
  const bool runs = N > 0 && H > 0;
  CHECK(launched ==
        (runs ? std::vector<std::string>{"embedding_backward"} : std::vector<std::string>{}));
  CHECK(same_bits(dw, dw_host));  // the same additions in the same order

  // dwte accumulates: a second backward adds the same rows again, as the host's
  // (not for the 7B table: 2000 blocks a launch, seconds under the emulator).
  if (V * H > dense_limit) return;
  hk::embedding_backward(ctx, dw_host.data(), dout.data(), ht.data(), N, V, H, ignore_index);
  kc::embedding_backward_launch(launch, dw.data(), dout.data(), tokens.data(), N, V, H);
  CHECK(same_bits(dw, dw_host));
}

/// embedding_local_ids for the slice [v_begin, v_begin + Vl) of a vocabulary
/// of V; `alias` writes over the ids (out == ids).
void local_ids_case(std::int64_t N, std::int64_t V, std::int64_t v_begin, std::int64_t Vl,
                    std::int32_t ignore, bool alias, std::uint64_t seed) {
  INFO("N=" << N << " V=" << V << " slice [" << v_begin << ", " << v_begin + Vl
            << ") ignore=" << ignore << " alias=" << alias);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::int64_t> u(0, V - 1);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(N));
  for (auto& x : ids) {
    const auto r = rng() % 8;  // the slice's first and last rows, padding, uniform
    x = static_cast<std::int32_t>(r == 0   ? v_begin
                                  : r == 1 ? v_begin + Vl - 1
                                  : r == 2 ? ignore
                                           : u(rng));
  }
  std::vector<std::int32_t> out_host(ids.size());
  hk::embedding_local_ids(ctx, out_host.data(), ids.data(), N, V, v_begin, Vl, ignore);

  cuda_emulator em(seed);
  std::vector<std::string> launched;
  const emulator_launcher launch{&em, std::int64_t(1) << 24, &launched};
  std::vector<std::int32_t> out;
  if (alias) {
    out = ids;
    em.output(out);
    kc::embedding_local_ids_launch(launch, out.data(), out.data(), N, v_begin, Vl, ignore);
  } else {
    out.assign(ids.size(), 0x5a5a5a5a);  // poison: no id or ignore index
    em.input(ids);
    em.output(out);
    kc::embedding_local_ids_launch(launch, out.data(), ids.data(), N, v_begin, Vl, ignore);
  }
  CHECK(launched ==
        (N == 0 ? std::vector<std::string>{} : std::vector<std::string>{"embedding_local_ids"}));
  CHECK(same_bits(out, out_host));
}

}  // namespace

TEST_CASE("emulated cuda embedding_forward equals the host kernel",
          "[kernels][emulated][embedding]") {
  std::uint64_t seed = 1;
  for (auto [N, V, H, offset] :
       {std::tuple<std::int64_t, std::int64_t, std::int64_t, int>{1, 1, 1, 0},
        {3, 5, 7, 0},         // fewer columns than threads
        {40, 300, 1001, 0},   // no multiple of the vector width
        {30, 70, 1024, 1},    // misaligned: the scalar variant
        {1100, 300, 264, 0},  // many rows; H no multiple of the block
        {6, V7, H7, 0},       // Llama 2 7B, a few tokens
        {0, 5, 8, 0},         // no tokens: no launch
        {3, 5, 0, 0}}) {      // no columns: no launch
    forward_case<float>(N, V, H, offset, seed++);
    forward_case<bf16>(N, V, H, offset, seed++);
    forward_case<fp16>(N, V, H, offset, seed++);
  }
}

TEST_CASE("emulated cuda embedding_backward equals the host kernel bit for bit",
          "[kernels][emulated][embedding]") {
  std::uint64_t seed = 100;
  for (auto [N, V, H] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{1, 1, 1},
                         {3, 5, 7},
                         {2500, 300, 1100},  // 3 token tiles, 5 row blocks (the last 44 rows),
                                             // 2 column blocks (the last 76 columns)
                         {1024, 64, 1024},   // exactly one tile, row block, column block
                         {1025, 65, 1025},   // one past each
                         {6, V7, H7},        // Llama 2 7B, a few tokens
                         {0, 5, 8},          // no tokens: no launch
                         {3, 5, 0}}) {       // no columns: no launch
    backward_case<float>(N, V, H, seed++);
    backward_case<bf16>(N, V, H, seed++);
    // fp16 dout takes bf16's path (2-byte loads, widened exactly); the 7B
    // shape (most of this test's time) stays bf16-only.
    if (V != V7) backward_case<fp16>(N, V, H, seed++);
  }
}

TEST_CASE("emulated cuda embedding_local_ids equals the host kernel",
          "[kernels][emulated][embedding]") {
  std::uint64_t seed = 200;
  local_ids_case(1, 10, 0, 10, ignore_index, false, seed++);           // one rank holds all
  local_ids_case(1000, V7, 8000, 8000, ignore_index, false, seed++);   // tp 4, rank 1; 4 blocks
  local_ids_case(300, V8, 96192, 32064, ignore_index, false, seed++);  // Llama 3, the last rank
  local_ids_case(777, V7, 16000, 8000, -1, false, seed++);             // another ignore index
  local_ids_case(777, V7, 0, 8000, ignore_index, true, seed++);        // in place
  local_ids_case(0, V7, 0, 8000, ignore_index, false, seed++);         // no ids: no launch

  cuda_emulator em;
  std::vector<std::string> launched;
  const emulator_launcher launch{&em, std::int64_t(1) << 24, &launched};
  std::vector<std::int32_t> ids(4, 1), out(4);
  CHECK_THROWS_AS(kc::embedding_local_ids_launch(launch, out.data(), ids.data(), -1, 0, 8, -100),
                  tessera::config_error);
  CHECK_THROWS_AS(kc::embedding_local_ids_launch(launch, out.data(), ids.data(), 4, 0, 0, -100),
                  tessera::config_error);
  CHECK_THROWS_AS(kc::embedding_local_ids_launch(launch, out.data(), ids.data(), 4, -1, 8, -100),
                  tessera::config_error);
  CHECK(launched.empty());
}

TEST_CASE("emulated cuda embedding: bad sizes throw before any launch",
          "[kernels][emulated][embedding]") {
  cuda_emulator em;
  std::vector<std::string> launched;
  const emulator_launcher launch{&em, std::int64_t(1) << 24, &launched};
  std::vector<std::int32_t> tok(2, 0);
  std::vector<float> wte(8), out(8);
  CHECK_THROWS_AS(kc::embedding_forward_launch(launch, out.data(), tok.data(), wte.data(), 2, 0, 4),
                  tessera::config_error);
  CHECK_THROWS_AS(
      kc::embedding_forward_launch(launch, out.data(), tok.data(), wte.data(), -1, 2, 4),
      tessera::config_error);
  CHECK_THROWS_AS(
      kc::embedding_backward_launch(launch, out.data(), wte.data(), tok.data(), 2, 0, 4),
      tessera::config_error);
  CHECK_THROWS_AS(
      kc::embedding_backward_launch(launch, out.data(), wte.data(), tok.data(), 2, 2, -1),
      tessera::config_error);
  CHECK(launched.empty());
}

}  // namespace test_kernels_emulated_embedding
