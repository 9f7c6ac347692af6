#pragma once
/// \file kernels/cuda/linkage.hpp
/// How the CUDA kernels reach a program: compiled from the headers in the
/// user's own translation unit, as CUTLASS, CUB and Thrust are used, or
/// linked from the precompiled library tessera::cuda_kernels. Included by
/// the declaring headers (kernels/cuda/kernels.hpp, attention.hpp,
/// cross_entropy.hpp); a program does not include it itself.
///
///   translation unit                         kernel definitions        link
///   nvcc, default (header-only)              all of them, from the     tessera::cuda
///                                            .cuh files; only what it
///                                            uses is instantiated
///   nvcc -DTESSERA_CUDA_PRECOMPILED_KERNELS  none (extern template)    tessera::cuda_kernels
///   g++ or clang++ (a host compiler)         none (extern template)    tessera::cuda_kernels
///   cuda/kernels*.cu (the library itself)    its families, strong      -
///
/// Header-only: `#include <tessera/cuda.hpp>` in a .cu compiled by nvcc
/// brings every kernel's definition; the kernels a program instantiates
/// (a trainer<bf16_mixed, cuda> instantiates all of them) are compiled in
/// that translation unit, for the architectures it is compiled for, and
/// the program links the CUDA runtime and cuBLASLt only (CMake:
/// tessera::cuda). The non-template entry points (flash attention, the
/// fused cross-entropy) are `inline` there, so several such translation
/// units in one program link.
///
/// Precompiled: linking tessera::cuda_kernels in CMake defines
/// TESSERA_CUDA_PRECOMPILED_KERNELS for the whole target (an INTERFACE
/// definition), so an nvcc translation unit beside g++ ones compiles no
/// kernel and every translation unit of the program calls the library's
/// one copy. Without CMake, pass -DTESSERA_CUDA_PRECOMPILED_KERNELS to nvcc
/// and link libtessera_cuda_kernels.a. Keep to one mode per program: a
/// header-only translation unit and the library in one link give two
/// definitions of the non-template entry points (inline and not), which
/// the linker resolves to the library's, but the language does not allow.
///
/// Under a host compiler nothing here changes what it sees: it cannot
/// compile kernels, so it always links tessera::cuda_kernels.

// The mode is chosen by whether the macro is defined at all (as CMake and
// `-DTESSERA_CUDA_PRECOMPILED_KERNELS` define it, to 1); any value that is
// not a nonzero number (0, empty, ON, TRUE) is refused rather than read as
// either mode.
#if defined(TESSERA_CUDA_PRECOMPILED_KERNELS) && (TESSERA_CUDA_PRECOMPILED_KERNELS + 0) == 0
#error \
    "TESSERA_CUDA_PRECOMPILED_KERNELS is defined to something other than a nonzero number: define it (to 1) to link tessera::cuda_kernels, or leave it undefined to compile the kernels from the headers (kernels/cuda/linkage.hpp)"
#endif

#if defined(TESSERA_CUDA_KERNELS_INSTANTIATING)
// cuda/kernels*.cu: each defines its families' entry points once (strong
// symbols) and instantiates the templates kernels.hpp lists; so each
// includes the .cuh files of its own families only.
#define TESSERA_CUDA_HEADER_ONLY_KERNELS 0
#define TESSERA_CUDA_ENTRY
#elif defined(__CUDACC__) && !defined(TESSERA_CUDA_PRECOMPILED_KERNELS)
/// 1 when this translation unit compiles the kernels it uses from the
/// headers (nvcc without TESSERA_CUDA_PRECOMPILED_KERNELS), else 0.
#define TESSERA_CUDA_HEADER_ONLY_KERNELS 1
/// The linkage of the non-template entry points: `inline` when header-only,
/// external (defined once, in tessera::cuda_kernels) otherwise.
#define TESSERA_CUDA_ENTRY inline
#else
#define TESSERA_CUDA_HEADER_ONLY_KERNELS 0
#define TESSERA_CUDA_ENTRY
#endif

/// 1 where the .cuh files define the non-template entry points: the
/// header-only translation units and the library's own.
#if TESSERA_CUDA_HEADER_ONLY_KERNELS || defined(TESSERA_CUDA_KERNELS_INSTANTIATING)
#define TESSERA_CUDA_DEFINES_ENTRIES 1
#else
#define TESSERA_CUDA_DEFINES_ENTRIES 0
#endif
