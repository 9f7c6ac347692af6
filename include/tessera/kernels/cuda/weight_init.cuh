#pragma once
/// \file kernels/cuda/weight_init.cuh
/// kernels::weight_init on a GPU (declared and documented in
/// kernels/cuda/kernels.hpp and kernels/weight_init.hpp): one Thrust
/// algorithm, written once over a Thrust execution policy. The device
/// instantiation runs it on a stream (thrust::cuda::par_nosync); the host
/// tests run the very same calls on Thrust's OpenMP and serial backends
/// (thrust::omp::par, thrust::cpp::par; tests/kernels/weight_init.cpp), as
/// Thrust runs its own "device" tests on the CPU.
///
/// Per tensor: one thrust::tabulate over its segment (the alignment padding
/// before it and its elements), each element computed from its flat index
/// by detail::weight_init_value: no element depends on another, so any
/// backend, block size or thread count writes the same values (up to the
/// device's log and cos, kernels/weight_init.hpp). A 7B model (291 tensors)
/// is 292 launches, queued without a host synchronisation.

#include <thrust/system_error.h>
#include <thrust/tabulate.h>

#include <cstdint>
#include <span>

#include "tessera/core/config.hpp"
#include "tessera/kernels/detail/weight_init.hpp"

#if defined(__CUDACC__)
#include <thrust/system/cuda/execution_policy.h>

#include "tessera/core/cuda.hpp"
#include "tessera/kernels/cuda/kernels.hpp"
#endif

namespace tessera::kernels::cuda {

namespace detail {

/// Element k of a segment that starts at flat element `first`.
template <class Param>
struct weight_init_op {
  weight_init_tensor t;
  std::int64_t first;
  TESSERA_HOST_DEVICE Param operator()(std::int64_t k) const {
    return kernels::detail::weight_init_value<Param>(t, first + k);
  }
};

}  // namespace detail

/// weight_init over the Thrust execution policy `exec` (thrust::cuda::par
/// and par_nosync on a stream, thrust::omp::par, thrust::cpp::par): flat
/// elements [lo, hi) of the buffer into out[0, hi - lo), which must be
/// memory `exec` can write. `tensors` is host memory, sorted and disjoint.
/// Throws config_error as detail::for_each_weight_init_segment, and
/// whatever `exec`'s backend throws (thrust::system_error).
template <class ExecutionPolicy, class Param>
void weight_init_launch(const ExecutionPolicy& exec, std::span<const weight_init_tensor> tensors,
                        std::int64_t lo, std::int64_t hi, Param* out) {
  kernels::detail::for_each_weight_init_segment(
      tensors, lo, hi, [&](const weight_init_tensor& t, std::int64_t b, std::int64_t e) {
        thrust::tabulate(exec, out + (b - lo), out + (e - lo), detail::weight_init_op<Param>{t, b});
      });
}

#if defined(__CUDACC__)

template <class Param>
void weight_init(Param* d_out, const weight_init_tensor* h_tensors, std::int64_t num_tensors,
                 std::int64_t lo, std::int64_t hi, cudaStream_t stream) {
  TESSERA_THROW_IF(num_tensors < 0 || (num_tensors > 0 && h_tensors == nullptr), config_error,
                   "weight_init (cuda): ", num_tensors, " tensors at ",
                   static_cast<const void*>(h_tensors));
  TESSERA_THROW_IF(hi > lo && d_out == nullptr, config_error, "weight_init (cuda): d_out is null");
  try {
    weight_init_launch(
        thrust::cuda::par_nosync.on(stream),
        std::span<const weight_init_tensor>(h_tensors, static_cast<std::size_t>(num_tensors)), lo,
        hi, d_out);
  } catch (const thrust::system_error& e) {
    throw cuda_error(
        ::tessera::detail::str("weight_init (cuda): thrust::tabulate failed: ", e.what()),
        e.code().value());
  }
}

#endif  // __CUDACC__

}  // namespace tessera::kernels::cuda
