// kernels::weight_init on the GPU (kernels/cuda/weight_init.cuh: Thrust on
// the context's stream) against the host overload, whose values are
// nn::init_llama_weights_range's bit for bit (tests/kernels/weight_init.cpp).
// The device's log and cos are not glibc's, so a value may differ; the
// contract (kernels/weight_init.hpp) is: every element written, equal bits
// except rarely one unit in the last place of the parameter type. Checked on
// device buffers poisoned with NaN (every byte 0xFF):
// - the small preset whole and the tiny preset's tp=4 shards (replicated
//   key/value heads, vocabulary padding), float32 and bf16, every element;
// - the whole llama2_7b model in bf16 drawn on the device (13.4 GB, no host
//   copy; the time is printed): no NaN left anywhere (count_nonfinite over
//   the buffer), and the first and last 2^16 elements of every tensor
//   against the host;
// - the CUDA model's init_weights equals kernels::weight_init's.
// Differences allowed: one unit in the last place, in at most 1 element in
// 10^5 (the expected rate is below 10^-8 for float32 and about 10^-13 for
// bf16: the bound leaves room, the one-unit rule does not). Skipped without
// a device (main.cpp).
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <vector>

#include <tessera/cuda.hpp>
#include <tessera/kernels/cuda/kernels.hpp>
#include <tessera/kernels/weight_init.hpp>

#include "cuda_testing.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

// Position of x's bit pattern on the number line (sign-magnitude to
// two's-complement order), so adjacent representable values differ by 1.
template <class T>
std::int64_t ordinal(T x) {
  if constexpr (is_half_v<T>) {  // bf16 and fp16: sign bit 15
    const std::int64_t b = x.bits;
    return (b & 0x8000) ? -(b & 0x7fff) : b;
  } else {
    std::uint32_t u;
    std::memcpy(&u, &x, sizeof u);
    const std::int64_t b = u;
    return (u & 0x80000000u) ? -(b & 0x7fffffff) : b;
  }
}

struct mismatch {
  std::int64_t elements = 0;  ///< elements whose bits differ
  std::int64_t worst = 0;     ///< the largest distance, in units in the last place
};
template <class T>
void compare(const std::vector<T>& got, const std::vector<T>& want, mismatch& m) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(T)) == 0) continue;
    ++m.elements;
    const std::int64_t d = std::abs(ordinal(got[i]) - ordinal(want[i]));
    m.worst = std::max(m.worst, d == 0 ? std::int64_t{1} << 40 : d);  // d = 0: -0 against +0
  }
}
void check(const mismatch& m, std::int64_t n) {
  INFO(m.elements << " of " << n << " elements differ, by at most " << m.worst << " ulp");
  CHECK(m.worst <= 1);
  CHECK(m.elements * 100000 <= n);
}

// Elements [lo, hi) of `layout` on the device and on the host.
template <class T>
void device_against_host(const kernels::cuda_context& ctx, const nn::llama_config& c,
                         const nn::param_layout& layout, std::uint64_t seed) {
  const auto ts = nn::llama_weight_init_tensors(c, layout, seed);
  const std::span<const kernels::weight_init_tensor> s(ts);
  const std::int64_t n = layout.total();
  tensor<T, cuda> d = poisoned_device<T>(static_cast<std::size_t>(n));
  kernels::weight_init(ctx, s, 0, n, d.data());
  ctx.synchronize();
  std::vector<T> want(static_cast<std::size_t>(n));
  kernels::weight_init(kernels::host_context{}, s, 0, n, want.data());
  mismatch m;
  compare(to_host(d), want, m);
  check(m, n);
}

}  // namespace

TEMPLATE_TEST_CASE("weight_init on the GPU: small and tiny tp=4 shards against the host",
                   "[cuda][init]", float, bf16, fp16) {
  kernels::cuda_context ctx;
  device_against_host<TestType>(ctx, nn::llama_config::small(),
                                nn::make_llama_layout(nn::llama_config::small()), 17);
  nn::llama_config tiny = nn::llama_config::tiny();
  tiny.vocab = 30;  // tp=4 pads it to 32
  for (int r = 0; r < 4; ++r) {
    INFO("tp rank " << r);
    device_against_host<TestType>(ctx, tiny, nn::make_llama_layout(tiny, {4, r}), 5);
  }
}

TEST_CASE("weight_init on the GPU: the whole llama2_7b in bf16, in place", "[cuda][init][7b]") {
  kernels::cuda_context ctx;
  const auto c = nn::llama_config::llama2_7b();
  const nn::param_layout layout = nn::make_llama_layout(c);
  const std::int64_t n = layout.total();
  tensor<bf16, cuda> d = poisoned_device<bf16>(static_cast<std::size_t>(n));
  const auto ts = nn::llama_weight_init_tensors(c, layout, 2024);
  const std::span<const kernels::weight_init_tensor> s(ts);
  const auto t0 = std::chrono::steady_clock::now();
  kernels::weight_init(ctx, s, 0, n, d.data());
  ctx.synchronize();
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "weight_init: llama2_7b (%lld bf16 elements, %zu tensors) drawn on the device in "
      "%.1f ms\n",
      static_cast<long long>(n), ts.size(), sec * 1e3);

  // Every element written: the poison (NaN) is gone everywhere.
  tensor<std::int32_t, cuda> flag = to_device(std::vector<std::int32_t>{0});
  kernels::cuda::count_nonfinite<bf16>(flag.data(), d.data(), n, ctx.stream());
  ctx.synchronize();
  CHECK(to_host(flag)[0] == 0);

  // The first and last 2^16 elements of each tensor (and the padding before it).
  mismatch m;
  std::int64_t compared = 0;
  for (const auto& e : layout.entries()) {
    const std::int64_t w = std::min<std::int64_t>(e.numel, 1 << 16);
    for (const std::int64_t lo : {e.offset, e.offset + e.numel - w}) {
      std::vector<bf16> want(static_cast<std::size_t>(w)), got(want.size());
      kernels::weight_init(kernels::host_context{}, s, lo, lo + w, want.data());
      cuda::copy_to_host(got.data(), d.data() + lo, got.size() * sizeof(bf16));
      compare(got, want, m);
      compared += w;
    }
  }
  check(m, compared);
}

TEST_CASE("llama<bf16_mixed, cuda>::init_weights draws kernels::weight_init's values",
          "[cuda][init][llama]") {
  kernels::cuda_context ctx;
  const auto c = nn::llama_config::small();
  nn::llama<precision::bf16_mixed, cuda> m(c, {}, ctx);
  m.init_weights(99);
  std::vector<bf16> got(static_cast<std::size_t>(m.flat_size()));
  ctx.synchronize();
  cuda::copy_to_host(got.data(), m.params(), got.size() * sizeof(bf16));
  const auto ts = nn::llama_weight_init_tensors(c, nn::make_llama_layout(c), 99);
  tensor<bf16, cuda> d = poisoned_device<bf16>(got.size());
  kernels::weight_init(ctx, std::span<const kernels::weight_init_tensor>(ts), 0, m.flat_size(),
                       d.data());
  ctx.synchronize();
  CHECK(std::memcmp(to_host(d).data(), got.data(), got.size() * sizeof(bf16)) == 0);
}
