// Tests include/tessera/kernels/peak.hpp: the fixed peak MFU is taken against.
#include <catch2/catch.hpp>

#include "tessera/kernels/peak.hpp"

namespace test_kernels_peak {

using namespace tessera;

TEST_CASE("the host's theoretical peak is threads x clock x FLOPs per cycle", "[kernels][peak]") {
  const auto [fpc, unit] = kernels::host_flops_per_cycle();
  const auto [ghz, source] = kernels::host_clock_ghz();
  CHECK(fpc >= 2);
  CHECK(!unit.empty());
  if (ghz <= 0) return;  // no clock on this machine: the peak must then be given
  for (int threads : {1, 2, 3}) {
    const auto p = kernels::host_theoretical_peak(threads);
    CHECK(p.flops == Approx(threads * ghz * 1e9 * fpc).epsilon(1e-12));
    CHECK_THAT(p.how, Catch::Contains(std::to_string(threads) + " thread"));
    CHECK_THAT(p.how, Catch::Contains(source));
  }
  CHECK_THROWS_AS(kernels::host_theoretical_peak(0), config_error);
}

TEST_CASE("host_peak: a given peak wins; a measured sgemm rate above the theoretical one becomes it",
          "[kernels][peak]") {
  const auto given = kernels::host_peak(2, 50e9, 1e12);
  CHECK(given.flops == 1e12);
  CHECK(given.blas_flops == 50e9);
  CHECK_THAT(given.how, Catch::Contains("--peak-tflops"));
  const auto theo = kernels::host_theoretical_peak(1);
  if (theo.flops > 0) {
    const auto above = kernels::host_peak(1, 2 * theo.flops);
    CHECK(above.flops == 2 * theo.flops);
    CHECK_THAT(above.how, Catch::Contains("measured sgemm rate"));
    const auto below = kernels::host_peak(1, 0.5 * theo.flops);
    CHECK(below.flops == theo.flops);
    CHECK_THAT(kernels::describe_peak(below), Catch::Contains("(50.0% of peak)"));
  }
  CHECK_THROWS_AS(kernels::host_peak(1, 0, -1.0), config_error);
  CHECK_THROWS_AS(kernels::host_peak(1, 0, std::nan("")), config_error);
}

}  // namespace test_kernels_peak
