# Finds tessera's host dependencies. Used by the build and by the installed
# package config, so a consumer's find_package(tessera) finds them too.
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(MPI QUIET COMPONENTS CXX)
find_package(nlohmann_json 3 REQUIRED)

# The CBLAS: OpenBLAS, the OpenMP build (Debian's libopenblas-openmp-dev).
# tessera's kernels run on OpenMP; the pthreads build of OpenBLAS keeps a
# second thread pool whose idle threads spin in sched_yield while OpenMP
# regions run (and OpenMP's spin while BLAS runs): measured on 2 cores, a
# `small` training step took 2.5x longer with it. The OpenMP build shares
# libgomp's pool. We link its libopenblas by full path (the build gets an
# RPATH to its folder, so Debian's libopenblas.so.0 alternative, which may
# point at the pthreads build, is not what loads).
if(NOT TESSERA_OPENBLAS_LIBRARY)
  find_library(TESSERA_OPENBLAS_LIBRARY NAMES openblas
    PATHS /usr/lib/x86_64-linux-gnu/openblas-openmp /usr/lib/aarch64-linux-gnu/openblas-openmp
    NO_DEFAULT_PATH)
  find_path(TESSERA_CBLAS_INCLUDE_DIR NAMES cblas.h
    PATHS /usr/include/x86_64-linux-gnu/openblas-openmp /usr/include/aarch64-linux-gnu/openblas-openmp
    NO_DEFAULT_PATH)
endif()
if(NOT TESSERA_OPENBLAS_LIBRARY OR NOT TESSERA_CBLAS_INCLUDE_DIR)
  message(FATAL_ERROR "tessera: the OpenMP build of OpenBLAS was not found (library "
    "'${TESSERA_OPENBLAS_LIBRARY}', cblas.h '${TESSERA_CBLAS_INCLUDE_DIR}'). "
    "On Debian: apt-get install libopenblas-openmp-dev")
endif()

# oneDNN (Debian's libdnnl-dev), optional: bf16 x bf16 GEMMs on its native
# bf16 matmul where the CPU has AVX-512 BF16 or AMX (kernels/detail/
# onednn_gemm.hpp); without it they convert to float and run sgemm.
option(TESSERA_WITH_ONEDNN "Run host bf16 GEMMs on oneDNN when it is found" ON)
# Debian's build has an OpenCL GPU runtime, so its package config requires
# OpenCL (ocl-icd-opencl-dev, a recommended package that scripts/deps.sh
# installs); without it the config would stop the configure, so oneDNN is
# skipped instead, with a message.
if(TESSERA_WITH_ONEDNN)
  find_package(OpenCL QUIET)
  if(OpenCL_FOUND)
    find_package(dnnl CONFIG QUIET)
  else()
    message(STATUS "tessera: OpenCL not found, which Debian's oneDNN config requires; "
      "host bf16 GEMMs convert and run sgemm (apt-get install ocl-icd-opencl-dev)")
  endif()
endif()

macro(tessera_add_blas_target)
  if(NOT TARGET tessera_blas)
    add_library(tessera_blas INTERFACE)
    get_filename_component(_tessera_blas_dir ${TESSERA_OPENBLAS_LIBRARY} DIRECTORY)
    target_link_libraries(tessera_blas INTERFACE ${TESSERA_OPENBLAS_LIBRARY}
      "-Wl,-rpath,${_tessera_blas_dir}")
    target_include_directories(tessera_blas SYSTEM INTERFACE ${TESSERA_CBLAS_INCLUDE_DIR})
    if(TESSERA_WITH_ONEDNN AND TARGET DNNL::dnnl)
      target_link_libraries(tessera_blas INTERFACE DNNL::dnnl)
      target_compile_definitions(tessera_blas INTERFACE TESSERA_HAS_ONEDNN=1)
    endif()
  endif()
endmacro()
