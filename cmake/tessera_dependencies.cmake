# Finds tessera's host dependencies. Used by the build and by the installed
# package config, so a consumer's find_package(tessera) finds them too.
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(MPI QUIET COMPONENTS CXX)
find_package(nlohmann_json 3 REQUIRED)
# SHA-256 of token files (data::fingerprint): OpenSSL's libcrypto (Debian: libssl-dev).
find_package(OpenSSL REQUIRED COMPONENTS Crypto)

# The CBLAS, through CMake's FindBLAS: BLA_VENDOR chooses it (default
# OpenBLAS; e.g. -DBLA_VENDOR=Intel10_64lp for MKL, FLAME for BLIS), and
# TESSERA_CBLAS_INCLUDE_DIR the folder of its cblas.h. For OpenBLAS the
# OpenMP build comes first (Debian's libopenblas-openmp-dev): tessera's
# kernels run on OpenMP, and the pthreads build keeps a second thread pool
# whose idle threads spin in sched_yield while OpenMP regions run (and
# OpenMP's spin while BLAS runs): measured on 2 cores, a `small` training
# step took 2.5x longer with it. The library is linked by full path with an
# RPATH to its folder, so Debian's libopenblas.so.0 alternative, which may
# point at the pthreads build, is not what loads.
if(NOT DEFINED BLA_VENDOR)
  set(BLA_VENDOR OpenBLAS)
endif()
set(_tessera_openmp_blas_dirs /usr/lib/x86_64-linux-gnu/openblas-openmp
  /usr/lib/aarch64-linux-gnu/openblas-openmp)
if(TESSERA_OPENBLAS_LIBRARY)
  # A library named outright (benchmarks/device_check.sh's bundle) is used as is.
  set(BLAS_LIBRARIES ${TESSERA_OPENBLAS_LIBRARY})
  set(BLAS_FOUND TRUE)
else()
  if(BLA_VENDOR STREQUAL "OpenBLAS")
    list(PREPEND CMAKE_LIBRARY_PATH ${_tessera_openmp_blas_dirs})  # searched before the system's
  endif()
  find_package(BLAS)
endif()
if(NOT BLAS_FOUND OR NOT BLAS_LIBRARIES)
  message(FATAL_ERROR "tessera: no BLAS of vendor '${BLA_VENDOR}' was found (FindBLAS). "
    "On Debian: apt-get install libopenblas-openmp-dev; or choose another with -DBLA_VENDOR=...")
endif()
list(GET BLAS_LIBRARIES 0 _tessera_blas_first)
get_filename_component(_tessera_blas_libdir "${_tessera_blas_first}" DIRECTORY)
find_path(TESSERA_CBLAS_INCLUDE_DIR NAMES cblas.h
  HINTS /usr/include/x86_64-linux-gnu/openblas-openmp /usr/include/aarch64-linux-gnu/openblas-openmp
        ${_tessera_blas_libdir}/../include ${_tessera_blas_libdir}/../../include)
if(NOT TESSERA_CBLAS_INCLUDE_DIR)
  message(FATAL_ERROR "tessera: cblas.h of the BLAS '${BLAS_LIBRARIES}' was not found; set "
    "TESSERA_CBLAS_INCLUDE_DIR to its folder")
endif()

# oneDNN (Debian's libdnnl-dev), optional: bf16 x bf16 GEMMs on its native
# bf16 matmul where the CPU has AVX-512 BF16 or AMX, and the small float
# GEMMs with an untransposed A on its sgemm, where it was measured faster
# than OpenBLAS (kernels/detail/onednn_gemm.hpp); without it every host
# GEMM runs on CBLAS (bf16 converted to float first).
option(TESSERA_WITH_ONEDNN "Run host bf16 GEMMs and small float GEMMs on oneDNN when it is found" ON)
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
    target_link_libraries(tessera_blas INTERFACE ${BLAS_LIBRARIES}
      "-Wl,-rpath,${_tessera_blas_libdir}")
    target_include_directories(tessera_blas SYSTEM INTERFACE ${TESSERA_CBLAS_INCLUDE_DIR})
    if(TESSERA_WITH_ONEDNN AND TARGET DNNL::dnnl)
      target_link_libraries(tessera_blas INTERFACE DNNL::dnnl)
      target_compile_definitions(tessera_blas INTERFACE TESSERA_HAS_ONEDNN=1)
    endif()
  endif()
endmacro()
