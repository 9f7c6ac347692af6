# Finds tessera's host dependencies. Used by the build and by the installed
# package config, so a consumer's find_package(tessera) finds them too.
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(MPI QUIET COMPONENTS CXX)
find_package(nlohmann_json 3 REQUIRED)

# The CBLAS: OpenBLAS (Debian's libopenblas-dev). We link libopenblas itself,
# not the reference libblas alternative, and include <cblas.h>.
if(NOT TARGET tessera_blas_found)
  find_library(TESSERA_OPENBLAS_LIBRARY NAMES openblas
    PATHS /usr/lib/x86_64-linux-gnu/openblas-pthread /usr/lib/x86_64-linux-gnu)
  find_path(TESSERA_CBLAS_INCLUDE_DIR NAMES cblas.h
    PATHS /usr/include/x86_64-linux-gnu/openblas-pthread /usr/include/x86_64-linux-gnu /usr/include/openblas)
  if(NOT TESSERA_OPENBLAS_LIBRARY OR NOT TESSERA_CBLAS_INCLUDE_DIR)
    message(FATAL_ERROR "tessera: OpenBLAS not found (library '${TESSERA_OPENBLAS_LIBRARY}', "
      "cblas.h '${TESSERA_CBLAS_INCLUDE_DIR}'). On Debian: apt-get install libopenblas-dev")
  endif()
endif()

macro(tessera_add_blas_target)
  if(NOT TARGET tessera_blas)
    add_library(tessera_blas INTERFACE)
    target_link_libraries(tessera_blas INTERFACE ${TESSERA_OPENBLAS_LIBRARY})
    target_include_directories(tessera_blas SYSTEM INTERFACE ${TESSERA_CBLAS_INCLUDE_DIR})
  endif()
endmacro()
