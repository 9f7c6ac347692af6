// Tests include/tessera/parallel/layout.hpp on 8 thread ranks, (dp, tp, pp)
// = (2, 2, 2): the world rank is comm::device_mesh's, a reduction over a set
// of axes equals the sum (or maximum) over exactly the ranks that share the
// other coordinates, and gather_rows gives every rank the same list in
// group order, ranks holding different numbers of rows.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <mutex>
#include <vector>

#include "tessera/comm/device_mesh.hpp"
#include "tessera/comm/local.hpp"
#include "tessera/kernels/context.hpp"
#include "tessera/nn/tensor_parallel.hpp"
#include "tessera/parallel/layout.hpp"

namespace test_parallel_layout {

using namespace tessera;
using parallel::axis;
using tp_layers = nn::tensor_parallel_layers<comm::local_communicator>;

TEST_CASE("layout: world ranks, reductions over named axes, gathered rows", "[parallel][layout]") {
  const comm::device_mesh mesh(2, 2, 2);
  std::mutex mu;
  std::vector<std::string> failures;
  auto fail = [&](std::string m) {
    std::lock_guard lock(mu);
    failures.push_back(std::move(m));
  };
  comm::local_world::run(8, [&](comm::local_communicator& world) {
    auto g = comm::make_groups(world, mesh);
    const parallel::layout<comm::local_communicator, tp_layers> l{g.dp, tp_layers{&g.tp}, g.pp};
    const kernels::host_context ctx;
    const int r = world.rank();
    if (l.world_rank() != r || l.world_size() != 8) fail("world rank " + std::to_string(r));
    const comm::mesh_coord me = mesh.coord(r);
    // Each rank holds r + 1; the sum over a set of axes is over the ranks
    // equal to this one in the other coordinates.
    auto expected = [&](bool dp, bool tp, bool pp, bool max) {
      double e = 0;
      for (int q = 0; q < 8; ++q) {
        const comm::mesh_coord c = mesh.coord(q);
        if ((!dp && c.dp != me.dp) || (!tp && c.tp != me.tp) || (!pp && c.pp != me.pp)) continue;
        e = max ? std::max(e, q + 1.0) : e + (q + 1.0);
      }
      return e;
    };
    for (int bits = 1; bits < 8; ++bits) {
      const bool dp = bits & 1, tp = bits & 2, pp = bits & 4;
      parallel::axes over;
      if (dp) over.bits |= static_cast<std::uint8_t>(axis::dp);
      if (tp) over.bits |= static_cast<std::uint8_t>(axis::tp);
      if (pp) over.bits |= static_cast<std::uint8_t>(axis::pp);
      for (bool max : {false, true}) {
        double v[2] = {r + 1.0, 2 * (r + 1.0)};
        l.reduce(ctx, std::span<double>(v, 2), over,
                 max ? comm::reduce_op::max : comm::reduce_op::sum);
        if (v[0] != expected(dp, tp, pp, max) || v[1] != 2 * expected(dp, tp, pp, max))
          fail("reduce over " + std::to_string(bits) + (max ? " max" : " sum") + " on rank " +
               std::to_string(r));
      }
      if (l.ranks(over) != (dp ? 2 : 1) * (tp ? 2 : 1) * (pp ? 2 : 1)) fail("ranks");
    }
    // Rank r holds r % 3 rows of two values {r, i}; every rank gets all of
    // them, dp fastest, then tp, then pp: (dp, tp, pp) order of the ranks.
    std::vector<double> rows;
    for (int i = 0; i < r % 3; ++i)
      rows.insert(rows.end(), {static_cast<double>(r), static_cast<double>(i)});
    const std::vector<double> all = l.gather_rows(ctx, rows, 2, parallel::axes::all());
    std::vector<double> want;
    for (int pp = 0; pp < 2; ++pp)
      for (int tp = 0; tp < 2; ++tp)
        for (int dp = 0; dp < 2; ++dp) {
          const int q = mesh.rank_of({dp, tp, pp});
          for (int i = 0; i < q % 3; ++i)
            want.insert(want.end(), {static_cast<double>(q), static_cast<double>(i)});
        }
    if (all != want) fail("gather_rows on rank " + std::to_string(r));
  });
  for (const auto& f : failures) FAIL_CHECK(f);
  CHECK(failures.empty());
}

TEST_CASE("layout: one rank has no groups and reduces nothing", "[parallel][layout]") {
  const parallel::layout<comm::local_communicator> one;
  CHECK(one.dp() == 1);
  CHECK(one.tp() == 1);
  CHECK(one.pp() == 1);
  CHECK(one.world_rank() == 0);
  CHECK(one.dp_group() == nullptr);
  double v = 3.5;
  one.reduce(kernels::host_context{}, std::span<double>(&v, 1), parallel::axes::all());
  CHECK(v == 3.5);
}

}  // namespace test_parallel_layout
