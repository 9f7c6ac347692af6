#pragma once
/// \file config.hpp
/// Compiler and platform macros shared by every tessera header.
///
/// TESSERA_HOST_DEVICE marks the small arithmetic functions that both the host
/// loops and the CUDA kernels call (DESIGN.md, principle 1). Under nvcc it
/// expands to `__host__ __device__`; under a host compiler to nothing.

#if defined(__CUDACC__)
#define TESSERA_HOST_DEVICE __host__ __device__
#define TESSERA_DEVICE __device__
#define TESSERA_CUDA_COMPILER 1
#else
#define TESSERA_HOST_DEVICE
#define TESSERA_DEVICE
#define TESSERA_CUDA_COMPILER 0
#endif

#define TESSERA_FORCE_INLINE inline __attribute__((always_inline))

/// TESSERA_SIMD asks the host compiler to vectorise the loop that follows
/// (OpenMP simd: it also promises that the loop's pointers do not alias
/// across iterations; at -O2 GCC's cheap cost model would leave the kernels'
/// tile loops scalar, measured 5x slower on the attention forward). Only on
/// loops without a reduction, so the result does not depend on the vector
/// width. TESSERA_SIMD_MAX(var) is the same for a loop whose only reduction
/// is a maximum into `var`, exact in any order for non-NaN values (a NaN
/// input gives NaN downstream either way). Both are empty in device code
/// and without OpenMP.
#if defined(_OPENMP) && !defined(__CUDA_ARCH__)
#define TESSERA_SIMD _Pragma("omp simd")
#define TESSERA_SIMD_PRAGMA_(x) _Pragma(#x)
#define TESSERA_SIMD_MAX(var) TESSERA_SIMD_PRAGMA_(omp simd reduction(max : var))
#else
#define TESSERA_SIMD
#define TESSERA_SIMD_MAX(var)
#endif

#if defined(__CUDA_ARCH__)
#define TESSERA_DEVICE_CODE 1
#else
#define TESSERA_DEVICE_CODE 0
#endif

/// Contracts (STYLE.md, "Errors", 3): on unless NDEBUG is defined or
/// TESSERA_ENABLE_CONTRACTS is forced to 1. Tests build with contracts on.
#if !defined(TESSERA_ENABLE_CONTRACTS)
#if defined(NDEBUG)
#define TESSERA_ENABLE_CONTRACTS 0
#else
#define TESSERA_ENABLE_CONTRACTS 1
#endif
#endif

#define TESSERA_VERSION_MAJOR 0
#define TESSERA_VERSION_MINOR 1
#define TESSERA_VERSION_PATCH 0
