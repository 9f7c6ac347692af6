#pragma once
/// \file tessera/cuda.hpp
/// The umbrella header of the CUDA backend: tessera/tessera.hpp plus the
/// CUDA execution context and the kernel entry points over it, so that
/// `nn::llama<P, cuda>`, `train::trainer<P, cuda, ...>` and the data
/// loader instantiate for the GPU. Plain C++ (g++ with the CUDA runtime
/// headers); link tessera::cuda_kernels (and tessera::nccl for
/// comm/nccl.hpp, which is included separately: it needs MPI).

#include "tessera/core/cuda.hpp"
#include "tessera/data/cuda_loader.hpp"
#include "tessera/kernels/cuda/context.hpp"
#include "tessera/kernels/cuda/ops.hpp"
#include "tessera/kernels/cuda/peak.hpp"
#include "tessera/tessera.hpp"
