#pragma once
// Helpers of the GPU tests (tests/cuda/*.cpp): device tensors filled from
// host vectors, NaN poisoning (every byte 0xFF is a NaN in float and bf16),
// and the named tolerances.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include <tessera/core/cuda.hpp>
#include <tessera/core/tensor.hpp>

#include "../kernels/kernel_testing.hpp"

namespace tessera::testing {

/// A device tensor holding `h` (allocated from the caching allocator).
template <class T>
tensor<T, cuda> to_device(const std::vector<T>& h) {
  tensor<T, cuda> d(shape{static_cast<std::int64_t>(h.size())});
  cuda::copy_from_host(d.data(), h.data(), h.size() * sizeof(T));
  return d;
}
/// A device tensor of n elements, every byte 0xFF (NaN for float and bf16).
template <class T>
tensor<T, cuda> poisoned_device(std::size_t n) {
  tensor<T, cuda> d(shape{static_cast<std::int64_t>(n)});
  TESSERA_CUDA_CHECK(cudaMemset(d.data(), 0xFF, n * sizeof(T)));
  // cudaMemset is asynchronous and on the legacy stream, which kernels on a
  // non-blocking stream do not wait for.
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  return d;
}
/// True on a GPU with FP8 tensor cores (sm_89 and later), where cuBLASLt has
/// FP8 matmuls and precision::fp8_mixed trains.
inline bool has_fp8_tensor_cores() {
  return cuda::compute_capability(cuda::current_device()) >= 89;
}
/// Copies a device tensor back.
template <class T>
std::vector<T> to_host(const tensor<T, cuda>& d) {
  std::vector<T> h(static_cast<std::size_t>(d.numel()));
  cuda::copy_to_host(h.data(), d.data(), h.size() * sizeof(T));
  return h;
}

}  // namespace tessera::testing
