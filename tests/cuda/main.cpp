// Catch2 main of the GPU tests. Without a usable CUDA device it prints why
// and exits with 77, which ctest reports as "Skipped" (SKIP_RETURN_CODE), so
// a machine without a GPU never counts these tests as passed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <cstdio>

int main(int argc, char** argv) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    std::printf(
        "SKIPPED: no CUDA device (cudaGetDeviceCount: %s, %d devices); the [cuda] tests "
        "did not run\n",
        e == cudaSuccess ? "cudaSuccess" : cudaGetErrorName(e), n);
    return 77;
  }
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, 0) == cudaSuccess)
    std::printf("device 0: %s, sm_%d%d, %d SMs, %.1f GiB\n", p.name, p.major, p.minor,
                p.multiProcessorCount, static_cast<double>(p.totalGlobalMem) / (1u << 30));
  return Catch::Session().run(argc, argv);
}
