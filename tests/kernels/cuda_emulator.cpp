// The block emulator itself (tests/support/cuda_emulator.hpp), on small
// bodies written for the purpose: it must catch what a GPU would fault on or
// silently get wrong, or the emulated kernel tests prove nothing. Each case
// is a deliberately broken body and the failure the emulator must report,
// plus the primitives' results against plain loops: the block reduction in
// CUB's order, the block scan, __syncthreads_or.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <tessera/kernels/cuda/block.hpp>
#include <tessera/kernels/cuda/launch.hpp>

#include "../support/cuda_emulator.hpp"

namespace test_kernels_cuda_emulator {

namespace kc = tessera::kernels::cuda;
using kc::block_index;
using tessera::testing::cuda_emulator;
using tessera::testing::emulator_launcher;

namespace {

kc::launch_config one_block(int threads, std::size_t smem = 0) {
  kc::launch_config c;
  c.block = threads;
  c.smem = smem;
  return c;
}

// Thread t writes its value to shared memory and reads thread t+1's, with or
// without the barrier between.
template <bool Barrier>
struct neighbour_body {
  static constexpr int threads = 256;
  static constexpr std::size_t smem_bound = 1024;
  static constexpr const char* name = "neighbour";
  template <class Ops>
  struct shared_storage {
    float v[256];
  };
  template <class Ops>
  static void run(const block_index& b, shared_storage<Ops>& sm, float* out, const float* in) {
    sm.v[b.tid] = Ops::ld(in + b.tid);
    if constexpr (Barrier) Ops::sync();
    Ops::st(out + b.tid, sm.v[(b.tid + 1) % threads]);
  }
};

// Every thread returns the block sum (wrong: CUB defines it in thread 0 only)
// or thread 0 writes it.
template <bool OnlyThread0>
struct sum_body {
  static constexpr int threads = 256;
  static constexpr std::size_t smem_bound = 64;
  static constexpr const char* name = "sum";
  template <class Ops>
  struct shared_storage {
    typename Ops::template block_reduce<float, threads>::storage reduce;
  };
  template <class Ops>
  static void run(const block_index& b, shared_storage<Ops>& sm, float* out, const float* in) {
    const float s = Ops::template block_reduce<float, threads>::sum(sm.reduce, Ops::ld(in + b.tid));
    if (!OnlyThread0 || b.tid == 0) Ops::st(out + b.tid, s);
  }
};

// Threads below `half` skip the barrier: a deadlock on a GPU (or undefined).
struct divergent_barrier_body {
  static constexpr int threads = 64;
  static constexpr std::size_t smem_bound = 0;
  static constexpr const char* name = "divergent_barrier";
  template <class Ops>
  using shared_storage = kc::no_shared;
  template <class Ops>
  static void run(const block_index& b, kc::no_shared&, int half) {
    if (b.tid >= half) Ops::sync();
  }
};

struct scan_body {
  static constexpr int threads = 128;
  static constexpr std::size_t smem_bound = 2048;
  static constexpr const char* name = "scan";
  template <class Ops>
  struct shared_storage {
    typename Ops::template block_scan<threads, 4>::storage scan;
  };
  template <class Ops>
  static void run(const block_index& b, shared_storage<Ops>& sm, int* out, int* total,
                  const int* in) {
    int x[4], y[4], t = 0;
    for (int k = 0; k < 4; ++k) x[k] = Ops::ld(in + 4 * b.tid + k);
    Ops::template block_scan<threads, 4>::exclusive_sum(sm.scan, x, y, t);
    for (int k = 0; k < 4; ++k) Ops::st(out + 4 * b.tid + k, y[k]);
    Ops::st(total + b.tid, t);
  }
};

struct any_body {
  static constexpr int threads = 96;  // three warps
  static constexpr std::size_t smem_bound = 0;
  static constexpr const char* name = "any";
  template <class Ops>
  using shared_storage = kc::no_shared;
  template <class Ops>
  static void run(const block_index& b, kc::no_shared&, std::int32_t* out, const int* in) {
    // Two rounds in a row: each thread must read its own round's result.
    const bool first = Ops::sync_or(Ops::ld(in + b.tid) != 0);
    const bool second = Ops::sync_or(b.tid == 95 && !first);
    Ops::st(out + b.tid, std::int32_t(first) | (std::int32_t(second) << 1));
  }
};

}  // namespace

TEST_CASE("cuda emulator: a missing barrier shows as a wrong read, the barrier fixes it",
          "[kernels][emulator]") {
  std::vector<float> in(256), out(256);
  for (int i = 0; i < 256; ++i) in[static_cast<std::size_t>(i)] = static_cast<float>(i);
  auto run = [&](auto body, std::uint64_t seed) {
    cuda_emulator em(seed);
    em.input(in);
    em.output(out);
    std::fill(out.begin(), out.end(), -1.f);
    emulator_launcher{&em}.run<decltype(body)>(one_block(256, 1024), out.data(),
                                               static_cast<const float*>(in.data()));
    int wrong = 0;
    for (int i = 0; i < 256; ++i)
      wrong += out[static_cast<std::size_t>(i)] != static_cast<float>((i + 1) % 256);
    return wrong;
  };
  CHECK(run(neighbour_body<true>{}, 1) == 0);
  // Without it, the random fiber order makes many threads read a slot not
  // yet written (NaN, the poisoned shared memory), in every schedule tried.
  for (std::uint64_t seed : {1, 2, 3}) CHECK(run(neighbour_body<false>{}, seed) > 50);
}

TEST_CASE("cuda emulator: the block sum adds in CUB's order and only thread 0 has it",
          "[kernels][emulator]") {
  std::vector<float> in(256), out(256);
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> d(-1e3f, 1e3f);
  for (auto& x : in) x = d(rng);
  cuda_emulator em;
  em.input(in);
  em.output(out);
  emulator_launcher{&em}.run<sum_body<false>>(one_block(256, 64), out.data(),
                                              static_cast<const float*>(in.data()));
  // CUB's BLOCK_REDUCE_WARP_REDUCTIONS: a shuffle-down tree per warp (lane l
  // adds lane l + 2^k), then the warps' sums in order.
  float total = 0;
  for (int w = 0; w < 8; ++w) {
    float l[32];
    for (int i = 0; i < 32; ++i) l[i] = in[static_cast<std::size_t>(32 * w + i)];
    for (int off = 1; off < 32; off *= 2)
      for (int i = 0; i + off < 32; ++i) l[i] = l[i] + l[i + off];
    total = w == 0 ? l[0] : total + l[0];
  }
  CHECK(out[0] == total);
  // Not the sequential sum's bits, for these inputs (the order matters).
  float seq = 0;
  for (float x : in) seq += x;
  CHECK(seq != total);
  // Every other thread got NaN: a kernel that used the sum elsewhere fails.
  for (std::size_t i = 1; i < 256; ++i) CHECK(std::isnan(out[i]));
}

TEST_CASE("cuda emulator: a barrier not every thread reaches is a deadlock",
          "[kernels][emulator]") {
  cuda_emulator em;
  CHECK_THROWS_WITH(
      emulator_launcher{&em}.run<divergent_barrier_body>(one_block(64), 32),
      Catch::Contains("divergent_barrier block (0, 0)") && Catch::Contains("deadlock"));
  CHECK_NOTHROW(emulator_launcher{&em}.run<divergent_barrier_body>(one_block(64), 0));
}

TEST_CASE("cuda emulator: block scan and syncthreads_or equal plain loops", "[kernels][emulator]") {
  std::vector<int> in(512), out(512), total(128);
  std::mt19937_64 rng(9);
  for (auto& x : in) x = static_cast<int>(rng() % 3);
  cuda_emulator em;
  em.input(in);
  em.output(out);
  em.output(total);
  emulator_launcher{&em}.run<scan_body>(one_block(128, 2048), out.data(), total.data(),
                                        static_cast<const int*>(in.data()));
  int run = 0;
  for (std::size_t i = 0; i < 512; ++i) {
    CHECK(out[i] == run);
    run += in[i];
  }
  for (int t : total) CHECK(t == run);

  std::vector<int> flags(96, 0);
  std::vector<std::int32_t> got(96);
  em.input(flags);
  em.output(got);
  for (int hot : {-1, 0, 40, 95}) {
    std::fill(flags.begin(), flags.end(), 0);
    if (hot >= 0) flags[static_cast<std::size_t>(hot)] = 1;
    emulator_launcher{&em}.run<any_body>(one_block(96), got.data(),
                                         static_cast<const int*>(flags.data()));
    for (std::int32_t g : got) CHECK(g == (hot >= 0 ? 1 : 2));
  }
}

TEST_CASE("cuda emulator: launches inconsistent with the body or the hardware are refused",
          "[kernels][emulator]") {
  cuda_emulator em;
  std::vector<float> in(256), out(256);
  em.input(in);
  em.output(out);
  const float* cin = in.data();
  CHECK_THROWS_WITH(emulator_launcher{&em}.run<sum_body<true>>(one_block(128, 64), out.data(), cin),
                    Catch::Contains("built for 256"));
  CHECK_THROWS_WITH(emulator_launcher{&em}.run<sum_body<true>>(one_block(256, 0), out.data(), cin),
                    Catch::Contains("smem"));
  auto big = one_block(256, 64);
  big.grid_y = kc::launch_limits::max_grid_y + 1;
  CHECK_THROWS_WITH(emulator_launcher{&em}.run<sum_body<true>>(big, out.data(), cin),
                    Catch::Contains("outside the limits"));
  // A store past the output, and a read of an unregistered buffer.
  std::vector<float> other(256);
  CHECK_THROWS_WITH(
      emulator_launcher{&em}.run<sum_body<false>>(one_block(256, 64), out.data() + 1, cin),
      Catch::Contains("outside every buffer"));
  CHECK_THROWS_WITH(emulator_launcher{&em}.run<sum_body<true>>(
                        one_block(256, 64), out.data(), static_cast<const float*>(other.data())),
                    Catch::Contains("outside every buffer"));
}

}  // namespace test_kernels_cuda_emulator
