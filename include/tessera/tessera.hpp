#pragma once
/// \file tessera.hpp
/// The umbrella header: every public tessera header for the host backend.
/// CUDA-only headers (tessera/core/cuda.hpp, kernels/cuda/*.cuh) are included
/// separately under nvcc.

#include "tessera/core/backend.hpp"
#include "tessera/core/config.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/memory.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/core/tensor.hpp"
