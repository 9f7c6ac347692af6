// Tests of include/tessera/parallel/executor.hpp's checks that need no
// model: a pipeline whose K V virtual stages would need message tags past
// comm::pipeline_tags (comm/tags.hpp) is refused with the numbers. (The
// executor's runs are tested through the trainer: tests/train/pipeline.cpp.)
#include <catch2/catch.hpp>

#include <string>

#include "tessera/comm/tags.hpp"
#include "tessera/parallel/executor.hpp"

namespace test_parallel_executor {

using namespace tessera;
using parallel::check_pipeline_tags;

TEST_CASE("executor: virtual stages whose tags leave the pipeline's range are refused",
          "[parallel][executor]") {
  using Catch::Matchers::Contains;
  CHECK_NOTHROW(check_pipeline_tags(1, 1));
  CHECK_NOTHROW(check_pipeline_tags(4, 2));
  CHECK_NOTHROW(
      check_pipeline_tags(2, comm::pipeline_max_virtual_stages / 2));  // 3650: the last fits
  CHECK_NOTHROW(check_pipeline_tags(1, 100000));                       // one stage sends nothing
  // 2 x 1826 = 3652 virtual stages: tags up to 7303, into context parallelism's.
  CHECK_THROWS_AS(check_pipeline_tags(2, 1826), config_error);
  CHECK_THROWS_WITH(check_pipeline_tags(2, 1826),
                    Contains("K=2") && Contains("V=1826") && Contains("3652 virtual stages") &&
                        Contains("7303") && Contains("[0, 7300)") && Contains("at most 3650"));
  CHECK_THROWS_WITH(check_pipeline_tags(3651, 1), Contains("K=3651") && Contains("7301"));
  CHECK_THROWS_WITH(check_pipeline_tags(0, 1), Contains("K=0"));
  CHECK_THROWS_WITH(check_pipeline_tags(2, 0), Contains("V=0"));
}

}  // namespace test_parallel_executor
