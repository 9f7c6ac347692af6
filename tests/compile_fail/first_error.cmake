# Builds one compile-failure target and checks that the compiler's first
# error line contains the expected text (the test's "// FIRST_ERROR:" line).
#   cmake -DBUILD_DIR=<dir> -DTARGET=<target> -DEXPECT=<text> -P first_error.cmake
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target ${TARGET}
  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(rc EQUAL 0)
  message(FATAL_ERROR "${TARGET} compiled, but must not")
endif()
string(REGEX MATCH "[^\n]*error:[^\n]*" first "${out}\n${err}")
if(first STREQUAL "")
  message(FATAL_ERROR "${TARGET}: no 'error:' line in the build output:\n${out}\n${err}")
endif()
string(FIND "${first}" "${EXPECT}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "${TARGET}: the first error line does not name '${EXPECT}':\n${first}")
endif()
message(STATUS "first error line: ${first}")
