#pragma once
/// \file tessera/cuda.hpp
/// The umbrella header of the CUDA backend: tessera/tessera.hpp plus the
/// CUDA execution context and the kernel entry points over it, so that
/// `nn::llama<P, cuda>`, `train::trainer<P, cuda, ...>` and the data
/// loader instantiate for the GPU.
/// - Compiled by nvcc (a .cu file): header-only, as CUTLASS, CUB and Thrust.
///   The kernels come with it and those the file instantiates are compiled
///   there; link tessera::cuda (CUDA runtime, cuBLASLt).
/// - Compiled by g++ (with the CUDA runtime headers), or by nvcc with
///   TESSERA_CUDA_PRECOMPILED_KERNELS: declarations only; link the
///   precompiled tessera::cuda_kernels (which defines that macro).
/// kernels/cuda/linkage.hpp has the rules. tessera::nccl is for
/// comm/nccl.hpp, which is included separately (it needs MPI).

#include "tessera/core/cuda.hpp"
#include "tessera/data/cuda_loader.hpp"
#include "tessera/kernels/cuda/context.hpp"
#include "tessera/kernels/cuda/ops.hpp"
#include "tessera/kernels/cuda/peak.hpp"
#include "tessera/tessera.hpp"
