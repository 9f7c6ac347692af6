// Tests include/tessera/plan/host_memory.hpp: the memory this process can
// use is read (Linux), and a plan larger than it is refused naming the
// need, the settings, the limit and the fix, while one that fits (or an
// unknown limit) passes.
#include <catch2/catch.hpp>

#include "tessera/plan/host_memory.hpp"

namespace test_plan_host_memory {

using namespace tessera;
using Catch::Matchers::Contains;

TEST_CASE("a plan larger than the machine is refused, naming both", "[plan][memory]") {
  CHECK(plan::available_host_memory() > (std::uint64_t{64} << 20));  // /proc/meminfo on Linux
  const std::uint64_t gib = std::uint64_t{1} << 30;
  REQUIRE_NOTHROW(plan::check_host_fit(3.0 * gib, 4 * gib, "the state", "x", "y"));
  REQUIRE_NOTHROW(plan::check_host_fit(3.0 * gib, 0, "the state", "x", "y"));  // unknown: skipped
  REQUIRE_THROWS_AS(plan::check_host_fit(5.0 * gib, 4 * gib, "the state", "x", "y"), config_error);
  REQUIRE_THROWS_WITH(plan::check_host_fit(5.0 * gib, 4 * gib, "the model state of this run",
                                           "1 parameter", "shard it"),
                      Contains("the model state of this run needs 5 GiB (1 parameter) but the "
                               "machine has 4 GiB available (MemAvailable + SwapFree): shard it"));
}

}  // namespace test_plan_host_memory
