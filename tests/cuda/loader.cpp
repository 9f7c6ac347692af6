// The pinned, double-buffered device loader (include/tessera/data/device_loader.hpp)
// on a real device: the device buffers hold exactly the sampler's windows,
// split into inputs and targets, over several steps and micro-batches; with
// a compute stream kept busy (a host function that sleeps before each
// batch is read) the copy of batch k+1 runs during the compute of batch k,
// after the compute of k-1, and the batches stay intact; bad ids throw on
// the host before anything is copied. The protocol itself is tested on the
// host with simulated streams (tests/data/device_loader_bookkeeping.cpp).
// Skipped without a device (main.cpp).
#include <unistd.h>

#include <chrono>
#include <deque>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <tessera/core/nvtx.hpp>
#include <tessera/data/cuda_loader.hpp>

#include "cuda_testing.hpp"

using tessera::cuda;
using namespace tessera::data;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {

/// A temporary token file of n pseudo-random ids below `vocab`.
struct temp_tokens {
  fs::path path;
  token_file file;
  temp_tokens(std::size_t n, std::uint32_t vocab) {
    static int counter = 0;
    path = fs::temp_directory_path() / ("tessera_cuda_loader_" + std::to_string(::getpid()) + "_" +
                                        std::to_string(counter++) + ".tok");
    std::vector<std::uint32_t> t(n);
    for (std::size_t i = 0; i < n; ++i) t[i] = static_cast<std::uint32_t>(splitmix64(i) % vocab);
    write_token_file(path, t, vocab);
    file = token_file::open(path);
  }
  ~temp_tokens() { fs::remove(path); }
};

/// The (B, T) inputs and targets the sampler gives for (step, micro_batch).
void expected(const batch_sampler& s, std::uint64_t step, std::uint64_t mb,
              std::vector<std::int32_t>& in, std::vector<std::int32_t>& tg) {
  std::vector<std::int32_t> w(static_cast<std::size_t>(s.B * (s.T + 1)));
  s.fill(step, mb, w.data());
  in.resize(static_cast<std::size_t>(s.B * s.T));
  tg.resize(in.size());
  for (std::int64_t b = 0; b < s.B; ++b)
    for (std::int64_t t = 0; t < s.T; ++t) {
      in[static_cast<std::size_t>(b * s.T + t)] = w[static_cast<std::size_t>(b * (s.T + 1) + t)];
      tg[static_cast<std::size_t>(b * s.T + t)] =
          w[static_cast<std::size_t>(b * (s.T + 1) + t + 1)];
    }
}

void CUDART_CB sleep_host_func(void* ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(*static_cast<int*>(ms)));
}

/// Pinned host memory for device -> host snapshots (freed by the destructor).
struct pinned_ints {
  std::int32_t* p = nullptr;
  std::size_t n = 0;
  explicit pinned_ints(std::size_t n_) : n(n_) {
    TESSERA_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&p), n * 4, cudaHostAllocDefault));
  }
  ~pinned_ints() { (void)cudaFreeHost(p); }
  pinned_ints(const pinned_ints&) = delete;
  pinned_ints& operator=(const pinned_ints&) = delete;
};

}  // namespace

static_assert(tessera::nvtx_range::enabled, "tessera::cuda defines TESSERA_WITH_NVTX");

TEST_CASE("device loader: the device buffers hold the sampler's tokens, step after step",
          "[cuda][loader]") {
  temp_tokens data(200000, 32000);
  const batch_sampler sampler(data.file, data.file.split().train, 4, 256, 77);
  cuda::stream compute;
  auto& mr = cuda::resource(cuda::current_device());
  const auto device_before = mr.stats().allocated;
  const auto pinned_before = cuda::pinned_resource().stats().allocated;
  const std::int64_t N = 4 * 256;
  // Rank 1 of 2 with A = 3 micro-batches: global micro-batches 3, 4, 5.
  const int batches = 3 * 3;
  std::deque<pinned_ints> snap;  // (not movable: a deque never moves them)
  for (int k = 0; k < batches; ++k) snap.emplace_back(static_cast<std::size_t>(2 * N));
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ids;
  {
    device_loader ld(cuda_loader_system(compute.get()), sampler, 32000, 3, 3);
    CHECK(mr.stats().allocated == device_before + ld.device_bytes());
    CHECK(cuda::pinned_resource().stats().allocated == pinned_before + ld.pinned_bytes());
    ld.prefetch(5, 3);
    for (int k = 0; k < batches; ++k) {
      const device_batch d = ld.next();
      CHECK(tessera::nvtx_range::depth() == 0);
      REQUIRE(d.N == N);
      CHECK(d.scored == N);
      ids.emplace_back(d.step, d.micro_batch);
      // What a kernel on the compute stream reads.
      TESSERA_CUDA_CHECK(
          cudaMemcpyAsync(snap[k].p, d.d_inputs, N * 4, cudaMemcpyDeviceToHost, compute.get()));
      TESSERA_CUDA_CHECK(cudaMemcpyAsync(snap[k].p + N, d.d_targets, N * 4, cudaMemcpyDeviceToHost,
                                         compute.get()));
    }
    compute.synchronize();
  }
  CHECK(mr.stats().allocated == device_before);
  CHECK(cuda::pinned_resource().stats().allocated == pinned_before);
  std::vector<std::int32_t> in, tg;
  for (int k = 0; k < batches; ++k) {
    CHECK(ids[k].first == static_cast<std::uint64_t>(5 + k / 3));
    CHECK(ids[k].second == static_cast<std::uint64_t>(3 + k % 3));
    expected(sampler, ids[k].first, ids[k].second, in, tg);
    CHECK(std::vector<std::int32_t>(snap[k].p, snap[k].p + N) == in);
    CHECK(std::vector<std::int32_t>(snap[k].p + N, snap[k].p + 2 * N) == tg);
  }
}

TEST_CASE("device loader: with a busy compute stream the copies overlap and batches stay intact",
          "[cuda][loader]") {
  // 8 MiB per micro-batch (inputs and targets of 16 x 65536 tokens).
  const std::int64_t B = 16, T = 65536, N = B * T;
  temp_tokens data(std::size_t(4) << 20, 32000);
  const batch_sampler sampler(data.file, data.file.split().train, B, T, 5);
  cuda::stream compute;
  const int batches = 6;
  static int sleep_ms = 40;      // "compute" of each batch, before it reads the batch
  std::deque<pinned_ints> snap;  // (not movable: a deque never moves them)
  for (int k = 0; k < batches; ++k) snap.emplace_back(static_cast<std::size_t>(2 * N));
  std::vector<cuda::event> copy_done, compute_end;
  for (int k = 0; k <= batches; ++k) {
    copy_done.emplace_back(true);
    compute_end.emplace_back(true);
  }
  cuda::event start(true);
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ids;
  {
    device_loader ld(cuda_loader_system(compute.get()), sampler, 32000);
    const cudaStream_t copy = ld.system().copy_stream();
    start.record(compute);
    TESSERA_CUDA_CHECK(cudaStreamWaitEvent(copy, start.get(), 0));
    ld.prefetch(0, 0);
    copy_done[0].record(copy);
    for (int k = 0; k < batches; ++k) {
      const device_batch d = ld.next();  // queues the copy of k+1
      copy_done[static_cast<std::size_t>(k) + 1].record(copy);
      ids.emplace_back(d.step, d.micro_batch);
      // A long kernel, then the reads: a copy into this batch's buffer that
      // did not wait for the release would land before the reads.
      TESSERA_CUDA_CHECK(cudaLaunchHostFunc(compute, sleep_host_func, &sleep_ms));
      TESSERA_CUDA_CHECK(cudaMemcpyAsync(snap[static_cast<std::size_t>(k)].p, d.d_inputs, N * 4,
                                         cudaMemcpyDeviceToHost, compute.get()));
      TESSERA_CUDA_CHECK(cudaMemcpyAsync(snap[static_cast<std::size_t>(k)].p + N, d.d_targets,
                                         N * 4, cudaMemcpyDeviceToHost, compute.get()));
      compute_end[static_cast<std::size_t>(k)].record(compute);
    }
    compute.synchronize();
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(copy));
  }
  std::vector<std::int32_t> in, tg;
  for (int k = 0; k < batches; ++k) {
    expected(sampler, ids[static_cast<std::size_t>(k)].first,
             ids[static_cast<std::size_t>(k)].second, in, tg);
    const auto& s = snap[static_cast<std::size_t>(k)];
    CHECK(std::vector<std::int32_t>(s.p, s.p + N) == in);
    CHECK(std::vector<std::int32_t>(s.p + N, s.p + 2 * N) == tg);
  }
  // Timeline (ms from start): the copy of k+1 ends after the compute of k-1
  // (it reuses that buffer) and before the compute of k ends (overlap).
  for (int k = 0; k + 1 < batches; ++k) {
    const float copy_next = copy_done[static_cast<std::size_t>(k) + 1].elapsed_ms_since(start);
    const float end_k = compute_end[static_cast<std::size_t>(k)].elapsed_ms_since(start);
    INFO("batch " << k << ": copy of k+1 done at " << copy_next << " ms, compute of k ends at "
                  << end_k << " ms");
    CHECK(copy_next < end_k);
    if (k >= 1) {
      const float end_prev = compute_end[static_cast<std::size_t>(k) - 1].elapsed_ms_since(start);
      CHECK(copy_next >= end_prev);
    }
  }
}

TEST_CASE("device loader: bad token ids throw on the host before any copy", "[cuda][loader]") {
  temp_tokens data(50000, 1000);
  const batch_sampler sampler(data.file, data.file.split().train, 2, 64, 9);
  cuda::stream compute;
  device_loader ld(cuda_loader_system(compute.get()), sampler, 500);  // model V < file V
  CHECK_THROWS_AS(ld.prefetch(0, 0), tessera::config_error);
  CHECK_THROWS_WITH(ld.prefetch(0, 0),
                    Contains("is not a valid id for the vocabulary size V=500") &&
                        Contains("step 0, micro-batch 0"));
  CHECK(ld.copies() == 0);
  CHECK_FALSE(ld.has_prefetched());
  CHECK(tessera::nvtx_range::depth() == 0);  // the throw popped the prefetch's range
  // The same data with the right vocabulary loads.
  device_loader ok(cuda_loader_system(compute.get()), sampler, 1000);
  ok.prefetch(0, 0);
  const device_batch d = ok.next(false);
  std::vector<std::int32_t> got(static_cast<std::size_t>(d.N)), in, tg;
  TESSERA_CUDA_CHECK(cudaMemcpyAsync(got.data(), d.d_targets, got.size() * 4,
                                     cudaMemcpyDeviceToHost, compute.get()));
  compute.synchronize();
  expected(sampler, 0, 0, in, tg);
  CHECK(got == tg);
}
