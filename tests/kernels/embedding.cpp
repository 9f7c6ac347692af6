// Tests of include/tessera/kernels/embedding.hpp: exact lookup, token range
// errors raised before writing, scatter-add against float64 finite
// differences, and a backward that is bit-for-bit independent of the thread
// count.

#include "tessera/kernels/embedding.hpp"

#include <omp.h>
#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <vector>

#include "kernel_testing.hpp"

namespace test_kernels_embedding {

using namespace tessera;
using namespace tessera::kernels;
using namespace tessera::testing;

namespace {
std::vector<std::int32_t> random_tokens(std::size_t n, std::int64_t V, std::mt19937_64& rng) {
  std::uniform_int_distribution<std::int32_t> d(0, static_cast<std::int32_t>(V - 1));
  std::vector<std::int32_t> t(n);
  for (auto& x : t) x = d(rng);
  return t;
}

template <class T>
void check_forward() {
  std::mt19937_64 rng(11);
  const std::int64_t N = 37, V = 19, H = 23;
  auto tokens = random_tokens(N, V, rng);
  tokens[0] = 0;
  tokens[1] = static_cast<std::int32_t>(V - 1);
  auto wte = random_vector<T>(V * H, rng);
  std::vector<T> out(N * H);
  poison(out);
  embedding_forward(ctx, out.data(), tokens.data(), wte.data(), N, V, H);
  CHECK(first_nan(out) == -1);
  // A copy: bit-exact.
  for (std::int64_t n = 0; n < N; ++n)
    REQUIRE(std::memcmp(&out[n * H], &wte[tokens[n] * H], H * sizeof(T)) == 0);
}
}  // namespace

TEST_CASE("embedding_forward copies the token rows exactly", "[kernels][embedding]") {
  check_forward<float>();
  check_forward<double>();
  check_forward<bf16>();
}

TEST_CASE("embedding rejects out-of-range tokens before writing", "[kernels][embedding]") {
  const std::int64_t N = 4, V = 10, H = 3;
  std::vector<float> wte(V * H, 1.0f), out(N * H), dwte(V * H, 0.0f), dout(N * H, 1.0f);
  for (std::int32_t bad : {10, -1, 1 << 30}) {
    std::vector<std::int32_t> tokens = {1, 2, bad, 3};
    poison(out);
    CHECK_THROWS_AS(embedding_forward(ctx, out.data(), tokens.data(), wte.data(), N, V, H),
                    config_error);
    CHECK_THROWS_WITH(embedding_forward(ctx, out.data(), tokens.data(), wte.data(), N, V, H),
                      Catch::Contains("token id " + std::to_string(bad)) &&
                          Catch::Contains("position 2") && Catch::Contains("V=10"));
    for (float v : out) CHECK(std::isnan(v));  // nothing written
    CHECK_THROWS_AS(embedding_backward(ctx, dwte.data(), dout.data(), tokens.data(), N, V, H),
                    config_error);
    for (float v : dwte) CHECK(v == 0.0f);
  }
}

TEST_CASE("embedding_backward matches float64 finite differences and accumulates",
          "[kernels][embedding]") {
  std::mt19937_64 rng(3);
  const std::int64_t N = 17, V = 6, H = 5;  // N > V: repeated tokens
  auto tokens = random_tokens(N, V, rng);
  auto wte = random_vector<double>(V * H, rng);
  auto w_out = random_vector<double>(N * H, rng);
  std::vector<double> out(N * H);
  auto loss = [&] {
    embedding_forward(ctx, out.data(), tokens.data(), wte.data(), N, V, H);
    return weighted_sum(out, w_out);
  };
  auto dwte0 = random_vector<double>(V * H, rng);
  auto dwte = dwte0;
  embedding_backward(ctx, dwte.data(), w_out.data(), tokens.data(), N, V, H);
  std::vector<double> grad(V * H);
  for (std::size_t i = 0; i < grad.size(); ++i) grad[i] = dwte[i] - dwte0[i];
  CHECK(fd_max_error(wte, loss, grad) < 1e-6);
}

TEST_CASE("embedding_backward is independent of the thread count", "[kernels][embedding]") {
  std::mt19937_64 rng(5);
  const std::int64_t N = 300, V = 7, H = 200;  // several column blocks, many repeats
  auto tokens = random_tokens(N, V, rng);
  auto dout = random_vector<float>(N * H, rng);
  auto init = random_vector<float>(V * H, rng);
  std::vector<std::vector<float>> results;
  const int saved = omp_get_max_threads();
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    auto dwte = init;
    embedding_backward(ctx, dwte.data(), dout.data(), tokens.data(), N, V, H);
    results.push_back(dwte);
  }
  omp_set_num_threads(saved);
  CHECK(std::memcmp(results[0].data(), results[1].data(), V * H * sizeof(float)) == 0);
  CHECK(std::memcmp(results[0].data(), results[2].data(), V * H * sizeof(float)) == 0);
  // And it is the sequential sum in order of n.
  auto seq = init;
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t h = 0; h < H; ++h) seq[tokens[n] * H + h] += dout[n * H + h];
  CHECK(std::memcmp(results[0].data(), seq.data(), V * H * sizeof(float)) == 0);
}

}  // namespace test_kernels_embedding
