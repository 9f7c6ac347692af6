// Tests include/tessera/parallel/buckets.hpp and sharding.hpp: buckets in
// reverse layout order within the cap, padding to equal chunks for any numel
// (including zero-element segments and numel not divisible by dp), shards
// that cover every element exactly once, shard-local optimizer ranges, and
// the policies' concept.
#include <catch2/catch.hpp>

#include <vector>

#include <tessera/comm/local.hpp>
#include <tessera/nn/llama.hpp>
#include <tessera/nn/param_layout.hpp>
#include <tessera/parallel/buckets.hpp>
#include <tessera/parallel/sharding.hpp>

namespace test_parallel_buckets {

using namespace tessera;
using parallel::bucket_plan;
using parallel::segment_range;

static_assert(parallel::check_sharding_strategy<parallel::zero<0>>());
static_assert(parallel::check_sharding_strategy<parallel::zero<3>>());
static_assert(parallel::zero<1>::shards_optimizer_state && !parallel::zero<1>::shards_gradients);
static_assert(parallel::zero<2>::shards_gradients && !parallel::zero<2>::shards_parameters);
static_assert(std::is_same_v<parallel::reduce_type_t<precision::bf16_mixed>, float>);
static_assert(std::is_same_v<parallel::reduce_type_t<precision::fp32>, float>);
static_assert(std::is_same_v<parallel::reduce_type_t<precision::fp64>, double>);
struct fp32_double_reduce : precision::fp32 {
  using reduce_type = double;
};
static_assert(std::is_same_v<parallel::reduce_type_t<fp32_double_reduce>, double>);
struct not_a_strategy {
  static constexpr int stage = 2;
  static constexpr const char* name = "x";
  static constexpr bool shards_optimizer_state = false;  // gradients without optimizer state
  static constexpr bool shards_gradients = true;
  static constexpr bool shards_parameters = false;
};
static_assert(!parallel::sharding_strategy<not_a_strategy>);

namespace {
// Segments -1..4 of sizes 7, 0, 100, 33, 0, 5 (two empty ones).
std::vector<segment_range> odd_segments() {
  const std::int64_t sizes[] = {7, 0, 100, 33, 0, 5};
  std::vector<segment_range> v;
  std::int64_t at = 0;
  for (int i = 0; i < 6; ++i) {
    v.push_back({i - 1, at, at + sizes[i]});
    at += sizes[i];
  }
  return v;
}
}  // namespace

TEST_CASE("buckets form in reverse layout order within the cap", "[parallel][buckets]") {
  const auto segs = odd_segments();
  bucket_plan p(segs, 1, 0, 40, false);
  // From the head: {4:5, 3:0, 2:33} = 38 <= 40; {1:100}; {0:0, -1:7} = 7.
  REQUIRE(p.size() == 3);
  CHECK(p.buckets()[0].first_segment == 2);
  CHECK(p.buckets()[0].last_segment == 4);
  CHECK(p.buckets()[0].begin == 107);
  CHECK(p.buckets()[0].end == 145);
  CHECK(p.buckets()[1].first_segment == 1);
  CHECK(p.buckets()[1].numel() == 100);  // larger than the cap: a bucket by itself
  CHECK(p.buckets()[2].first_segment == -1);
  CHECK(p.buckets()[2].last_segment == 0);
  CHECK(p.bucket_of_segment(3) == 0);
  CHECK(p.bucket_of_segment(-1) == 2);
  bucket_plan one(segs, 1, 0, 1 << 20, true);
  CHECK(one.size() == segs.size());
  CHECK(one.buckets()[1].numel() == 0);  // an empty segment is an empty bucket
}

TEST_CASE("shards pad to equal chunks and cover every element exactly once",
          "[parallel][buckets]") {
  const auto segs = odd_segments();
  for (int dp = 1; dp <= 5; ++dp) {
    for (bool per_segment : {false, true}) {
      INFO("dp " << dp << " per_segment " << per_segment);
      std::vector<int> covered(145, 0);
      std::int64_t staging = 0;
      for (int r = 0; r < dp; ++r) {
        bucket_plan p(segs, dp, r, 40, per_segment);
        std::int64_t shard = 0;
        for (std::size_t k = 0; k < p.size(); ++k) {
          const auto& b = p.buckets()[k];
          CHECK(b.padded == b.chunk * dp);
          CHECK(b.padded >= b.numel());
          CHECK(b.chunk % parallel::chunk_align == 0);
          CHECK(b.padded - b.numel() < dp * parallel::chunk_align + dp);  // padding stays small
          CHECK(b.shard_offset == shard);
          shard += b.chunk;
          const auto [lo, hi] = p.owned(k);
          CHECK(lo >= b.begin);
          CHECK(hi <= b.end);
          for (std::int64_t i = lo; i < hi; ++i) ++covered[static_cast<std::size_t>(i)];
        }
        CHECK(p.shard_size() == shard);
        if (r == 0) staging = p.staging_size();
        CHECK(p.staging_size() == staging);
        CHECK(p.staging_size() == p.shard_size() * dp);
      }
      for (int c : covered) REQUIRE(c == 1);
    }
  }
}

TEST_CASE("shard ranges map the layout's decay flags into shard-local offsets",
          "[parallel][buckets]") {
  const auto segs = odd_segments();
  const std::vector<nn::param_range> flat = {
      {0, 7, true}, {7, 107, false}, {107, 140, true}, {140, 145, false}};
  for (int dp = 1; dp <= 4; ++dp)
    for (int r = 0; r < dp; ++r) {
      bucket_plan p(segs, dp, r, 40, false);
      std::int64_t n = 0;
      for (const auto& lr : p.shard_ranges(flat)) {
        CHECK(lr.begin >= 0);
        CHECK(lr.end <= p.shard_size());
        n += lr.size();
      }
      std::int64_t owned = 0;
      for (std::size_t k = 0; k < p.size(); ++k) owned += p.owned(k).second - p.owned(k).first;
      CHECK(n == owned);  // padding is in no range
    }
}

TEST_CASE("bucket_plan rejects bad values naming them", "[parallel][buckets][errors]") {
  const auto segs = odd_segments();
  CHECK_THROWS_WITH(bucket_plan(segs, 0, 0, 10, false), Catch::Contains("dp=0"));
  CHECK_THROWS_WITH(bucket_plan(segs, 2, 2, 10, false),
                    Catch::Contains("rank 2 is not in [0, dp=2)"));
  CHECK_THROWS_WITH(bucket_plan(segs, 2, 0, 0, false), Catch::Contains("capacity of 0"));
  auto gap = segs;
  gap[2].begin += 1;
  CHECK_THROWS_WITH(bucket_plan(gap, 2, 0, 10, false), Catch::Contains("does not follow"));
}

TEST_CASE("a zero-element bucket reduce-scatters and gathers as zero chunks",
          "[parallel][buckets]") {
  // Catch2's assertions are not thread-safe (TSan): each rank records its
  // chunk and the main thread checks them.
  std::vector<std::int64_t> chunk(3, -1);
  REQUIRE_NOTHROW(comm::local_world::run(3, [&chunk](comm::local_communicator& c) {
    bucket_plan p(odd_segments(), c.size(), c.rank(), 1, true);
    const auto& b = p.buckets()[1];  // segment 3, 0 elements
    chunk[static_cast<std::size_t>(c.rank())] = b.chunk;
    std::vector<float> send(1), recv(1);
    c.reduce_scatter(send.data(), recv.data(), 0, comm::reduce_op::sum);
    c.all_gather(recv.data(), send.data(), 0);
  }));
  CHECK(chunk == std::vector<std::int64_t>(3, 0));
}

TEST_CASE("llama segments give one bucket per block under zero<3>", "[parallel][buckets]") {
  nn::llama<precision::fp32> m(nn::llama_config::tiny());
  std::vector<segment_range> segs;
  for (int s = m.first_segment(); s <= m.last_segment(); ++s)
    segs.push_back({s, m.segment_begin(s), m.segment_end(s)});
  bucket_plan z3(segs, 3, 1, 1, true);
  CHECK(z3.size() == 4);
  bucket_plan dflt(segs, 3, 1, parallel::default_bucket_bytes / 4, false);
  CHECK(dflt.size() == 1);
  CHECK(dflt.buckets()[0].begin == 0);
  CHECK(dflt.buckets()[0].end == m.layout().total());
}

}  // namespace test_parallel_buckets
