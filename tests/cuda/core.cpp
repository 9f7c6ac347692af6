// The CUDA backend on a real device (include/tessera/core/cuda.hpp): the
// backend concept's copies, streams and events, the caching allocator with
// cudaMalloc below it, the pinned resource, and error messages that name
// the call. Skipped without a device (main.cpp).
#include <sstream>

#include "cuda_testing.hpp"

using tessera::cuda;
using namespace tessera::testing;

TEST_CASE("cuda backend: tensors are counted by the caching allocator and copy round trip",
          "[cuda][core]") {
  auto& mr = cuda::resource(cuda::current_device());
  const auto before = mr.stats().allocated;
  std::mt19937_64 rng(301);
  const auto h = random_vector<float>(1000, rng);
  {
    auto d = to_device(h);
    CHECK(mr.stats().allocated == before + 4000);
    CHECK(to_host(d) == h);
  }
  CHECK(mr.stats().allocated == before);
  CHECK(mr.name() == "cuda:" + std::to_string(cuda::current_device()));
}

TEST_CASE("cuda streams and events order work and time it", "[cuda][core]") {
  cuda::stream a, b;
  cuda::event start, stop, ready(false);
  tessera::cuda_caching_resource mr(cuda::current_device());
  const std::size_t n = 64 << 20;
  void* src = mr.allocate_on(n, a.get());
  void* dst = mr.allocate_on(n, b.get());
  start.record(a);
  TESSERA_CUDA_CHECK(cudaMemsetAsync(src, 1, n, a));
  ready.record(a);
  b.wait(ready);  // b's copy sees a's memset
  cuda::copy_async(dst, src, n, b);
  stop.record(b);
  stop.synchronize();
  CHECK(stop.query());
  CHECK(stop.elapsed_ms_since(start) > 0);
  unsigned char last = 0;
  cuda::copy_to_host(&last, static_cast<char*>(dst) + n - 1, 1);
  CHECK(last == 1);
  mr.deallocate(src, n);
  mr.deallocate(dst, n);
}

TEST_CASE("cuda caching resource: stream-ordered reuse, record_stream, empty_cache, JSON log",
          "[cuda][core]") {
  tessera::caching_allocator_config cfg;
  cfg.log_events = true;
  tessera::cuda_caching_resource mr(cuda::current_device(), cfg);
  cuda::stream a, b;
  void* p = mr.allocate_on(1000, a.get());
  TESSERA_CUDA_CHECK(cudaMemsetAsync(p, 0, 1000, a));
  mr.deallocate(p, 1000);
  CHECK(mr.allocate_on(1000, a.get()) == p);  // same stream: reused, no sync
  mr.record_stream(p, b.get());
  mr.deallocate(p, 1000);
  b.synchronize();
  a.synchronize();
  // After b's work is done, the event completes and the block is reusable.
  CHECK(mr.allocate_on(1000, a.get()) == p);
  mr.deallocate(p, 1000);
  CHECK(mr.stats().reserved == 2u << 20);
  mr.empty_cache();
  CHECK(mr.stats().reserved == 0);
  std::ostringstream os;
  mr.write_json(os);
  CHECK(os.str().find("\"segment_free\"") != std::string::npos);
}

TEST_CASE("cuda caching resource: an impossible request reports the figures", "[cuda][core]") {
  tessera::cuda_caching_resource mr(cuda::current_device());
  CHECK_THROWS_WITH(mr.allocate_on(std::size_t(1) << 50, cudaStream_t{}),
                    Catch::Contains("out of memory allocating 1125899906842624 bytes"));
  CHECK(mr.detailed_stats().oom_retries == 1);
}

TEST_CASE("cuda pinned resource counts page-locked memory", "[cuda][core]") {
  tessera::pinned_memory_resource mr;
  void* p = mr.allocate(1 << 20);
  CHECK(mr.stats().allocated == 1u << 20);
  cudaPointerAttributes attr{};
  TESSERA_CUDA_CHECK(cudaPointerGetAttributes(&attr, p));
  CHECK(attr.type == cudaMemoryTypeHost);
  mr.deallocate(p, 1 << 20);
  CHECK(mr.stats().allocated == 0);
}

TEST_CASE("cuda errors name the call, the code and its string", "[cuda][core]") {
  int n = 0;
  TESSERA_CUDA_CHECK(cudaGetDeviceCount(&n));
  try {
    TESSERA_CUDA_CHECK(cudaSetDevice(n + 7));
    FAIL("expected cuda_error");
  } catch (const tessera::cuda_error& e) {
    const std::string m = e.what();
    CHECK(m.find("cudaSetDevice(n + 7) failed: cudaErrorInvalidDevice") != std::string::npos);
    CHECK(e.code() == static_cast<int>(cudaErrorInvalidDevice));
  }
  // The error was cleared: later calls are not blamed for it.
  CHECK(cudaGetLastError() == cudaSuccess);
}
