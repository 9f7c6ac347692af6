#include <catch2/catch.hpp>
#include <tessera/tessera.hpp>

namespace test_core_smoke {

TEST_CASE("tensor allocation is counted by the host resource", "[core]") {
  tessera::host_memory_resource mr;
  {
    tessera::tensor<float> t(tessera::shape{3, 5}, mr);
    CHECK(mr.stats().allocated == 60);
  }
  CHECK(mr.stats().allocated == 0);
  CHECK(mr.stats().peak_allocated == 60);
}

}  // namespace test_core_smoke
