// Tests of include/tessera/core/cp_shard.hpp: the head-tail token positions
// of a context-parallel rank (chunks r and 2 cp - 1 - r of 2 cp), every
// position held by exactly one rank and found again by owner() and
// local_index(), sequence lengths 2 cp does not divide refused with the
// numbers, and the accessors' index preconditions (TESSERA_EXPECTS, on in
// the tests) refused with the index and the bound.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "tessera/core/cp_shard.hpp"

namespace test_core_cp_shard {

using namespace tessera;

TEST_CASE("cp_shard: head-tail chunks, positions, owners", "[core][cp_shard]") {
  for (const int cp : {1, 2, 3, 4}) {
    const std::int64_t T = 8 * cp;  // chunks of 4
    std::vector<int> seen(static_cast<std::size_t>(T), 0);
    for (int r = 0; r < cp; ++r) {
      const cp_shard s = cp_shard::of(T, cp, r);
      INFO("cp=" << cp << " rank " << r);
      CHECK(s.chunk() == 4);
      CHECK(s.tokens() == 8);
      CHECK(s.index(0) == r);
      CHECK(s.index(1) == 2 * cp - 1 - r);
      CHECK(s.start(0) == 4 * r);
      CHECK(s.start(1) == 4 * (2 * cp - 1 - r));
      CHECK(s.length(1) == 4);
      for (std::int64_t t = 0; t < s.tokens(); ++t) {
        const std::int64_t p = s.position(t);
        ++seen[static_cast<std::size_t>(p)];
        CHECK(s.owner(p) == r);
        CHECK(s.local_index(p) == t);
        CHECK(s.of_rank(0).owner(p) == r);  // any rank's shard answers for the group
      }
      // The two chunks: increasing positions, the first before the second.
      CHECK(s.position(3) + 1 == s.position(0) + 4);
      CHECK(s.position(4) == s.start(1));
    }
    for (const int n : seen) CHECK(n == 1);  // every position on exactly one rank
  }
  // cp 1: the whole sequence in order.
  const cp_shard one = cp_shard::of(6, 1, 0);
  for (std::int64_t t = 0; t < 6; ++t) CHECK(one.position(t) == t);
}

TEST_CASE("cp_shard refuses what it cannot split, with the numbers", "[core][cp_shard]") {
  using Catch::Matchers::Contains;
  CHECK_THROWS_AS(cp_shard::of(30, 4, 0), config_error);
  CHECK_THROWS_WITH(cp_shard::of(30, 4, 0),
                    Contains("T=30") && Contains("2*cp=8") && Contains("cp=4"));
  CHECK_THROWS_WITH(cp_shard::of(0, 2, 0), Contains("T=0"));
  CHECK_THROWS_WITH(cp_shard::of(32, 4, 4), Contains("rank 4") && Contains("cp=4"));
  CHECK_THROWS_WITH(cp_shard::of(32, 4, -1), Contains("rank -1"));
  CHECK_THROWS_WITH(cp_shard::of(32, 0, 0), Contains("cp=0"));
  CHECK_NOTHROW(cp_shard::of(32, 4, 3));
}

TEST_CASE("cp_shard's accessors check their indices (contracts)", "[core][cp_shard]") {
  using Catch::Matchers::Contains;
  const cp_shard s = cp_shard::of(24, 3, 1);  // chunks of 4, local tokens 8
  // In range: the edges of each precondition.
  CHECK(s.index(1) == 4);
  CHECK(s.start(0) == 4);
  CHECK(s.length(1) == 4);
  CHECK(s.position(0) == 4);
  CHECK(s.position(7) == 19);
  CHECK(s.owner(0) == 0);
  CHECK(s.owner(23) == 0);
  CHECK(s.local_index(23) == 7);
  CHECK(s.of_rank(2).rank == 2);
  // Out of range: tessera::error naming the value and the bound.
  CHECK_THROWS_AS(s.index(2), error);
  CHECK_THROWS_WITH(s.index(2), Contains("j=2"));
  CHECK_THROWS_WITH(s.index(-1), Contains("j=-1"));
  CHECK_THROWS_WITH(s.start(2), Contains("j=2"));
  CHECK_THROWS_WITH(s.length(3), Contains("j=3"));
  CHECK_THROWS_WITH(s.position(8), Contains("t=8") && Contains("tokens()=8"));
  CHECK_THROWS_WITH(s.position(-1), Contains("t=-1"));
  CHECK_THROWS_WITH(s.owner(24), Contains("p=24") && Contains("T=24"));
  CHECK_THROWS_WITH(s.owner(-1), Contains("p=-1"));
  CHECK_THROWS_WITH(s.local_index(24), Contains("p=24") && Contains("T=24"));
  CHECK_THROWS_WITH(s.of_rank(3), Contains("rank 3") && Contains("cp=3"));
  CHECK_THROWS_WITH(s.of_rank(-1), Contains("rank -1"));
  // take: this rank's tokens of a row, into a buffer apart from it.
  std::vector<int> row(32), out(8, -1);
  for (std::size_t i = 0; i < row.size(); ++i) row[i] = static_cast<int>(i);
  s.take(row.data(), out.data());
  CHECK(out == std::vector<int>{4, 5, 6, 7, 16, 17, 18, 19});
  CHECK_THROWS_WITH(s.take(row.data(), static_cast<int*>(nullptr)), Contains("null"));
  CHECK_THROWS_WITH(s.take(static_cast<const int*>(nullptr), out.data()), Contains("null"));
  CHECK_THROWS_WITH(s.take(row.data(), row.data() + 20), Contains("overlaps"));
  CHECK_THROWS_WITH(s.take(row.data() + 4, row.data()), Contains("overlaps"));
  CHECK_NOTHROW(s.take(row.data(), row.data() + 24));  // right after the row's T values
  CHECK(std::vector<int>(row.begin() + 24, row.end()) == out);
}

}  // namespace test_core_cp_shard
