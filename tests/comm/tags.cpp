// Tests of include/tessera/comm/tags.hpp: the components' tag ranges are
// disjoint and hold their tags, and the pipeline's per-stage tags are the
// executor's 2 v and 2 v + 1 up to pipeline_max_virtual_stages.
#include <catch2/catch.hpp>

#include <vector>

#include "tessera/comm/tags.hpp"

namespace test_comm_tags {

using namespace tessera::comm;

TEST_CASE("comm tags: disjoint ranges, each component's tags in its own", "[comm][tags]") {
  const std::vector<tag_range> ranges = {pipeline_tags, cp_tags, mpi_internal_tags};
  for (std::size_t i = 0; i < ranges.size(); ++i)
    for (std::size_t j = 0; j < ranges.size(); ++j) {
      INFO("ranges " << i << " and " << j);
      CHECK(ranges[i].overlaps(ranges[j]) == (i == j));
    }
  for (const int t : {cp_tag_kv, cp_tag_dkv, cp_tag_a2a}) {
    CHECK(cp_tags.contains(t));
    CHECK(!pipeline_tags.contains(t));
    CHECK(!mpi_internal_tags.contains(t));
  }
  for (const int t : {mpi_notice_tag, mpi_rendezvous_tag}) {
    CHECK(mpi_internal_tags.contains(t));
    CHECK(!cp_tags.contains(t));
  }
  // The values on the wire are the ones the components always used.
  CHECK(cp_tag_kv == 7301);
  CHECK(cp_tag_dkv == 7302);
  CHECK(cp_tag_a2a == 7303);
  CHECK(mpi_notice_tag == 7411);
  CHECK(mpi_rendezvous_tag == 7412);
}

TEST_CASE("comm tags: the pipeline's 2 v and 2 v + 1 fill its range", "[comm][tags]") {
  CHECK(pipeline_activation_tag(0) == 0);
  CHECK(pipeline_gradient_tag(0) == 1);
  CHECK(pipeline_activation_tag(5) == 10);
  CHECK(pipeline_gradient_tag(5) == 11);
  CHECK(pipeline_max_virtual_stages == 3650);
  const int last = pipeline_max_virtual_stages - 1;
  CHECK(pipeline_tags.contains(pipeline_activation_tag(last)));
  CHECK(pipeline_tags.contains(pipeline_gradient_tag(last)));
  CHECK(pipeline_gradient_tag(last) == pipeline_tags.end - 1);
  CHECK(!pipeline_tags.contains(pipeline_activation_tag(last + 1)));
  CHECK(tag_range{3, 5}.size() == 2);
  CHECK(!tag_range{3, 5}.overlaps(tag_range{5, 9}));  // half-open
  CHECK(tag_range{3, 6}.overlaps(tag_range{5, 9}));
}

}  // namespace test_comm_tags
