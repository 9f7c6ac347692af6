// kernels::weight_init (include/tessera/kernels/weight_init.hpp) and its
// Thrust algorithm (include/tessera/kernels/cuda/weight_init.cuh), the one
// the GPU runs, here on Thrust's OpenMP and serial backends
// (thrust::omp::par, thrust::cpp::par), against nn::init_llama_weights_range:
// the host's initialisation, an independent computation (a sequential rng
// drawn in each tensor's row-major order, where weight_init computes each
// element from its index alone).
//
// Everything is compared bit for bit (memcmp) on NaN-poisoned outputs, for
// float, double and bf16 parameters: the tiny and small presets whole, with
// tensor-parallel shards (row, column and replicated key/value heads, a
// padded vocabulary), and windows of the llama2_7b layout (around a ZeRO
// shard boundary, the final norm and the LM head, and tp=8 ranks'
// row-parallel wv and w_gate and column-parallel wo), at 1 and 2 OpenMP threads. Also:
// core/random.hpp's normal_at against rng::normal, and the table's preconditions.
//
// The Thrust cases need Thrust's headers (the CUDA toolkit's CCCL;
// tests/CMakeLists.txt adds them when found): without them only the host
// loop is compared, and the test says so.
#include <catch2/catch.hpp>

#include <omp.h>

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <tessera/core/random.hpp>
#include <tessera/kernels/weight_init.hpp>
#include <tessera/nn/llama_layout.hpp>

#if __has_include(<thrust/version.h>)
#include <thrust/system/cpp/execution_policy.h>
#include <thrust/system/omp/execution_policy.h>

#include <tessera/kernels/cuda/weight_init.cuh>
#define TESSERA_TEST_HAS_THRUST 1
#else
#define TESSERA_TEST_HAS_THRUST 0
#endif

#include "kernel_testing.hpp"

namespace test_kernels_weight_init {

using namespace tessera;
using tessera::testing::poison;

namespace {

// The ways kernels::weight_init's values are computed: the host overload's
// OpenMP loop, and the Thrust algorithm on two of Thrust's host backends.
enum class path { host_loop, thrust_omp, thrust_cpp };

std::vector<path> paths() {
  if (TESSERA_TEST_HAS_THRUST) return {path::host_loop, path::thrust_omp, path::thrust_cpp};
  return {path::host_loop};
}

const char* name(path p) {
  switch (p) {
    case path::host_loop:
      return "host loop";
    case path::thrust_omp:
      return "thrust::omp::par";
    case path::thrust_cpp:
      return "thrust::cpp::par";
  }
  return "?";
}

template <class Param>
std::vector<Param> drawn(path p, std::span<const kernels::weight_init_tensor> ts, std::int64_t lo,
                         std::int64_t hi) {
  std::vector<Param> out(static_cast<std::size_t>(hi - lo));
  poison(out);
  switch (p) {
    case path::host_loop:
      kernels::weight_init(kernels::host_context{}, ts, lo, hi, out.data());
      break;
    case path::thrust_omp:
#if TESSERA_TEST_HAS_THRUST
      kernels::cuda::weight_init_launch(thrust::omp::par, ts, lo, hi, out.data());
#endif
      break;
    case path::thrust_cpp:
#if TESSERA_TEST_HAS_THRUST
      kernels::cuda::weight_init_launch(thrust::cpp::par, ts, lo, hi, out.data());
#endif
      break;
  }
  return out;
}

// Elements [lo, hi) of `layout` by every path, each equal to
// init_llama_weights_range's bit for bit, at 1 and 2 OpenMP threads.
template <class Param>
void check_range(const nn::llama_config& c, const nn::param_layout& layout, std::uint64_t seed,
                 std::int64_t lo, std::int64_t hi) {
  std::vector<Param> want(static_cast<std::size_t>(hi - lo));
  poison(want);
  nn::init_llama_weights_range(c, layout, seed, lo, hi, want.data());
  const auto ts = nn::llama_weight_init_tensors(c, layout, seed);
  const int threads = omp_get_max_threads();
  for (const path p : paths())
    for (const int nt : {1, 2}) {
      INFO(c.name << " [" << lo << ", " << hi << ") of " << layout.total() << ", "
                  << dtype_name<Param>() << ", " << name(p) << ", " << nt << " threads");
      omp_set_num_threads(nt);
      const std::vector<Param> got = drawn<Param>(p, ts, lo, hi);
      REQUIRE(got.size() == want.size());
      CHECK(
          (want.empty() || std::memcmp(got.data(), want.data(), want.size() * sizeof(Param)) == 0));
    }
  omp_set_num_threads(threads);
}

template <class Param>
void check_whole(const nn::llama_config& c, nn::tp_rank t, std::uint64_t seed) {
  const nn::param_layout layout = nn::make_llama_layout(c, t);
  INFO("tp " << t.rank << " of " << t.size);
  check_range<Param>(c, layout, seed, 0, layout.total());
  // Ranges that start and end inside tensors and in the alignment padding.
  const std::int64_t n = layout.total();
  check_range<Param>(c, layout, seed, n / 3 + 1, 2 * n / 3 + 5);
  check_range<Param>(c, layout, seed, n - 7, n);
  check_range<Param>(c, layout, seed, 5, 5);
}

// tiny with a vocabulary of 30: tp=4 pads it to 32 (the last rank's two
// padding rows of the embedding and the LM head are 0).
nn::llama_config tiny_v30() {
  nn::llama_config c = nn::llama_config::tiny();
  c.name = "tiny (V=30)";
  c.vocab = 30;
  return c;
}

}  // namespace

TEST_CASE("normal_at is rng::normal's k-th value, bit for bit", "[kernels][init]") {
  for (const std::uint64_t seed : {0ull, 1ull, 42ull, 0x8000000000000005ull}) {
    rng r(seed);
    const std::uint64_t start = rng_start(seed);
    CHECK(r.state == start);
    int differ = 0;
    for (std::uint64_t k = 0; k < 20000; ++k) {
      const double a = r.normal(), b = normal_at(start, k);
      differ += std::memcmp(&a, &b, sizeof a) != 0;
    }
    INFO("seed " << seed);
    CHECK(differ == 0);
  }
}

TEMPLATE_TEST_CASE("weight_init equals init_llama_weights_range: tiny and small, with tp shards",
                   "[kernels][init]", float, double, bf16) {
  if (!TESSERA_TEST_HAS_THRUST) WARN("Thrust's headers not found: the host loop only is compared");
  const auto tiny = nn::llama_config::tiny();
  check_whole<TestType>(tiny, {}, 7);
  check_whole<TestType>(nn::llama_config::small(), {}, 1234);
  for (int r = 0; r < 2; ++r) check_whole<TestType>(tiny, {2, r}, 7);  // rows and columns
  for (int r = 0; r < 4; ++r) check_whole<TestType>(tiny, {4, r}, 7);  // tp > nkv: kv replicated
  for (int r = 0; r < 4; ++r) check_whole<TestType>(tiny_v30(), {4, r}, 9);  // vocabulary padding
  for (int r = 0; r < 4; ++r) check_whole<TestType>(nn::llama_config::small(), {4, r}, 3);
}

TEMPLATE_TEST_CASE("weight_init equals init_llama_weights_range on windows of llama2_7b",
                   "[kernels][init]", float, double, bf16) {
  const auto c = nn::llama_config::llama2_7b();
  {
    // A ZeRO shard boundary (dp = 64, shards of ceil(total / 64) elements):
    // 2^18 elements either side of shard 17's first element.
    const nn::param_layout layout = nn::make_llama_layout(c);
    const std::int64_t shard = (layout.total() + 63) / 64, b = 17 * shard;
    check_range<TestType>(c, layout, 5, b - (1 << 18), b + (1 << 18));
    // The final norm and the start of the LM head.
    const std::int64_t f = layout.at("final_norm").offset;
    check_range<TestType>(c, layout, 5, f, layout.at("lm_head").offset + 5000);
  }
  // tp = 8 (the reference draws each tensor from its first element up to
  // the last one the window needs, so the windows sit near those):
  {
    // rank 0: the end of its row shard of wv (rows [0, 512)) and the first
    // rows of its column shard of wo.
    const nn::param_layout layout = nn::make_llama_layout(c, {8, 0});
    const std::int64_t o = layout.at("blocks.2.attn.wo").offset;
    check_range<TestType>(c, layout, 11, o - 1000, o + 3 * 512 + 17);
  }
  {
    // rank 5: the first rows of its column shard of wo (4096 x 512 of
    // 4096 x 4096, columns [2560, 3072) of each row).
    const nn::param_layout layout = nn::make_llama_layout(c, {8, 5});
    const std::int64_t o = layout.at("blocks.1.attn.wo").offset;
    check_range<TestType>(c, layout, 11, o, o + 4 * 512 + 17);
  }
  {
    // rank 1: the whole mlp_norm and the start of its row shard of w_gate
    // (rows [1376, 2752) of 11008).
    const nn::param_layout layout = nn::make_llama_layout(c, {8, 1});
    const std::int64_t o = layout.at("blocks.1.mlp_norm").offset;
    check_range<TestType>(c, layout, 11, o, layout.at("blocks.1.mlp.w_gate").offset + 5000);
  }
}

TEST_CASE("weight_init rejects a bad range or tensor table", "[kernels][init]") {
  const auto c = nn::llama_config::tiny();
  const nn::param_layout layout = nn::make_llama_layout(c);
  auto ts = nn::llama_weight_init_tensors(c, layout, 1);
  std::vector<float> out(static_cast<std::size_t>(layout.total()));
  const kernels::host_context h{};
  CHECK_THROWS_AS(kernels::weight_init(h, std::span(ts), 5, 4, out.data()), config_error);
  CHECK_THROWS_AS(kernels::weight_init(h, std::span(ts), -1, 4, out.data()), config_error);
  auto unsorted = ts;
  std::swap(unsorted[1], unsorted[2]);
  CHECK_THROWS_AS(kernels::weight_init(h, std::span(unsorted), 0, 16, out.data()), config_error);
  auto bad = ts;
  bad[1].cols = 0;
  CHECK_THROWS_AS(kernels::weight_init(h, std::span(bad), 0, 16, out.data()), config_error);
}

}  // namespace test_kernels_weight_init
