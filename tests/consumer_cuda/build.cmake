# The steps of the target tessera_cuda_consumer (cuda/CMakeLists.txt):
#   cmake -DBUILD_DIR=<tessera build> -DCONSUMER=<folder> -DGENERATOR=<generator> -P build.cmake
# 1. installs BUILD_DIR into CONSUMER/prefix (its output only on failure);
# 2. configures this folder's project in CONSUMER/build with the initial
#    cache CONSUMER/initial_cache.cmake (the prefix, compilers, architecture);
# 3. builds consumer_cuda (nvcc compiles main.cu: every kernel from the
#    headers) and prints the seconds it took;
# 4. fails if the link line names the precompiled kernel library.
foreach(_v BUILD_DIR CONSUMER GENERATOR)
  if(NOT ${_v})
    message(FATAL_ERROR "tests/consumer_cuda/build.cmake: -D${_v}=... is required")
  endif()
endforeach()

execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${CONSUMER}/prefix
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "tessera_cuda_consumer: cmake --install ${BUILD_DIR} failed (${rc}):\n${out}")
endif()

execute_process(COMMAND ${CMAKE_COMMAND} -C ${CONSUMER}/initial_cache.cmake
  -S ${CMAKE_CURRENT_LIST_DIR} -B ${CONSUMER}/build -G ${GENERATOR}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "tessera_cuda_consumer: configuring ${CMAKE_CURRENT_LIST_DIR} against "
    "${CONSUMER}/prefix failed (${rc}):\n${out}")
endif()

# A nested make of its own (-j1; main.cu is one translation unit): not the
# parent make's jobserver, which it could not reach from here anyway.
set(ENV{MAKEFLAGS} "--no-print-directory")
string(TIMESTAMP t0 "%s")
execute_process(COMMAND ${CMAKE_COMMAND} --build ${CONSUMER}/build RESULT_VARIABLE rc)
string(TIMESTAMP t1 "%s")
math(EXPR seconds "${t1} - ${t0}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "tessera_cuda_consumer: building consumer_cuda failed (${rc}) after "
    "${seconds} s")
endif()

# The link line (Makefiles: link.txt; Ninja: build.ninja) must not name
# libtessera_cuda_kernels: the kernels came from the headers.
set(link_files ${CONSUMER}/build/CMakeFiles/consumer_cuda.dir/link.txt ${CONSUMER}/build/build.ninja)
foreach(f ${link_files})
  if(EXISTS ${f})
    file(READ ${f} text)
    if(text MATCHES "tessera_cuda_kernels")
      message(FATAL_ERROR "tessera_cuda_consumer: ${f} links tessera_cuda_kernels; the "
        "header-only consumer must not")
    endif()
  endif()
endforeach()
message(STATUS "tessera_cuda_consumer: ${CONSUMER}/build/consumer_cuda built header-only in "
  "${seconds} s (0 if it was up to date)")
