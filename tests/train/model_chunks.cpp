// Tests include/tessera/train/model_chunks.hpp: one rank holds the whole
// model in one chunk; on 2 pipeline stages with 2 virtual stages each (4
// threads' worth of chunks on 2 ranks), chunk c of stage k is virtual stage
// c K + k of the partition every rank computes once (the same on every
// rank, parallel::partition_stages), the head is on the last stage only,
// and the chunks' flat buffers tile the whole model's.
#include <catch2/catch.hpp>

#include <mutex>
#include <string>
#include <vector>

#include "pp_suite.hpp"
#include "tessera/comm/local.hpp"
#include "tessera/train/model_chunks.hpp"

namespace test_train_model_chunks {

using namespace tessera;

TEST_CASE("model_chunks: one rank holds the whole model", "[train][chunks]") {
  const kernels::host_context ctx;
  comm::self_communicator<kernels::host_context> self(ctx);
  const parallel::layout<comm::self_communicator<kernels::host_context>> one;
  auto cfg = pp_suite::config(pp_suite::layout{}, 2);
  train::model_chunks<precision::fp64, host, optim::adamw, parallel::zero<0>,
                      comm::self_communicator<kernels::host_context>, nn::dense_layers>
      chunks(pp_suite::model(), cfg, one, self, ctx, {}, nullptr);
  REQUIRE(chunks.size() == 1);
  CHECK(chunks.stages().size() == 1);
  CHECK(chunks.holds_head());
  CHECK(chunks.flat_elements() == nn::make_llama_layout(pp_suite::model()).total());
  CHECK(chunks.virtual_stage(0) == 0);
  CHECK(chunks.last_virtual_stage() == 0);
}

TEST_CASE("model_chunks: virtual stages of an interleaved pipeline, the partition computed once",
          "[train][chunks][pipeline]") {
  pp_suite::layout l;
  l.pp = 2;
  l.schedule = parallel::schedule_kind::interleaved;
  l.virtual_stages = 2;
  l.micro_batches = 4;
  const auto cfg = pp_suite::config(l, 2);
  const auto whole = parallel::partition_stages(pp_suite::model(), cfg.seq, 4, {});
  std::mutex mu;
  std::vector<std::string> failures;
  std::int64_t flat = 0;
  comm::local_world::run(2, [&](comm::local_communicator& world) {
    auto g = comm::make_groups(world, comm::device_mesh(1, 1, 2));
    const parallel::layout mesh{g.dp, nn::dense_layers{}, g.pp};
    const kernels::host_context ctx;
    train::model_chunks<precision::fp64, host, optim::adamw, parallel::zero<0>,
                        comm::local_communicator, nn::dense_layers>
        chunks(pp_suite::model(), cfg, mesh, g.dp, ctx, {}, nullptr);
    const int k = world.rank();
    std::lock_guard lock(mu);
    auto check = [&](bool ok, const std::string& what) {
      if (!ok) failures.push_back("stage " + std::to_string(k) + ": " + what);
    };
    check(chunks.size() == 2, "two chunks");
    check(chunks.stages().size() == whole.size(), "the whole partition");
    for (std::size_t v = 0; v < whole.size(); ++v)
      check(chunks.stages()[v].first_block == whole[v].first_block &&
                chunks.stages()[v].last_block == whole[v].last_block,
            "the partition of virtual stage " + std::to_string(v));
    for (int c = 0; c < 2; ++c) {
      const int v = chunks.virtual_stage(c);
      check(v == c * 2 + k, "chunk " + std::to_string(c) + " is virtual stage c K + k");
      check(chunks.rank_of_stage(v) == k, "the rank of its virtual stage");
      check(chunks.model(c).options().stage.first_block ==
                whole[static_cast<std::size_t>(v)].first_block,
            "chunk " + std::to_string(c) + "'s blocks");
      flat += chunks.model(c).flat_size();
    }
    check(chunks.holds_head() == (k == 1), "the head on the last stage only");
    check(chunks.last_virtual_stage() == 3, "K V - 1");
  });
  for (const auto& f : failures) FAIL_CHECK(f);
  CHECK(failures.empty());
  CHECK(flat == nn::make_llama_layout(pp_suite::model()).total());
}

}  // namespace test_train_model_chunks
