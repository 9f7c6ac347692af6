// Tests include/tessera/parallel/layout.hpp on thread ranks, (dp, cp, tp,
// pp) = (2, 1, 2, 2), (2, 2, 2, 2) and (1, 3, 2, 1): the world rank is
// comm::device_mesh's, a reduction over a set of axes equals the sum (or
// maximum) over exactly the ranks that share the other coordinates, and
// gather_rows gives every rank the same list in group order, ranks holding
// different numbers of rows.
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

// One mesh's checks on every rank; `groups` builds the layout from
// comm::make_groups' five groups, else from (dp, layers, pp) (cp 1).
void check_mesh(const comm::device_mesh& mesh, bool groups) {
  std::mutex mu;
  std::vector<std::string> failures;
  auto fail = [&](std::string m) {
    std::lock_guard lock(mu);
    failures.push_back(std::move(m));
  };
  const int n = mesh.size();
  comm::local_world::run(n, [&](comm::local_communicator& world) {
    auto g = comm::make_groups(world, mesh);
    using layout_t = parallel::layout<comm::local_communicator, tp_layers>;
    const layout_t l =
        groups ? layout_t{g, tp_layers{&g.tp}} : layout_t{g.dp, tp_layers{&g.tp}, g.pp};
    const kernels::host_context ctx;
    const int r = world.rank();
    if (l.world_rank() != r || l.world_size() != n) fail("world rank " + std::to_string(r));
    const comm::mesh_coord me = mesh.coord(r);
    if (l.cp() != mesh.cp() || l.cp_rank() != me.cp) fail("cp rank " + std::to_string(r));
    if (l.dp_cp_group()->size() != mesh.dp() * mesh.cp() ||
        l.dp_cp_group()->rank() != mesh.dp_cp_index(r))
      fail("dp x cp group on rank " + std::to_string(r));
    // Each rank holds r + 1; the sum over a set of axes is over the ranks
    // equal to this one in the other coordinates.
    auto expected = [&](unsigned bits, bool max) {
      double e = 0;
      for (int q = 0; q < n; ++q) {
        const comm::mesh_coord c = mesh.coord(q);
        if ((!(bits & 1) && c.dp != me.dp) || (!(bits & 2) && c.tp != me.tp) ||
            (!(bits & 4) && c.pp != me.pp) || (!(bits & 8) && c.cp != me.cp))
          continue;
        e = max ? std::max(e, q + 1.0) : e + (q + 1.0);
      }
      return e;
    };
    for (unsigned bits = 1; bits < 16; ++bits) {
      parallel::axes over;
      over.bits = static_cast<std::uint8_t>(bits);  // axis::dp 1, tp 2, pp 4, cp 8
      for (bool max : {false, true}) {
        double v[2] = {r + 1.0, 2 * (r + 1.0)};
        l.reduce(ctx, std::span<double>(v, 2), over,
                 max ? comm::reduce_op::max : comm::reduce_op::sum);
        if (v[0] != expected(bits, max) || v[1] != 2 * expected(bits, max))
          fail("reduce over " + std::to_string(bits) + (max ? " max" : " sum") + " on rank " +
               std::to_string(r));
      }
      const int want_ranks = ((bits & 1) ? mesh.dp() : 1) * ((bits & 2) ? mesh.tp() : 1) *
                             ((bits & 4) ? mesh.pp() : 1) * ((bits & 8) ? mesh.cp() : 1);
      if (l.ranks(over) != want_ranks) fail("ranks");
    }
    // Rank r holds r % 3 rows of two values {r, i}; every rank gets all of
    // them, dp fastest, then cp, then tp, then pp.
    std::vector<double> rows;
    for (int i = 0; i < r % 3; ++i)
      rows.insert(rows.end(), {static_cast<double>(r), static_cast<double>(i)});
    const std::vector<double> all = l.gather_rows(ctx, rows, 2, parallel::axes::all());
    std::vector<double> want;
    for (int pp = 0; pp < mesh.pp(); ++pp)
      for (int tp = 0; tp < mesh.tp(); ++tp)
        for (int cp = 0; cp < mesh.cp(); ++cp)
          for (int dp = 0; dp < mesh.dp(); ++dp) {
            comm::mesh_coord c;
            c.dp = dp;
            c.cp = cp;
            c.tp = tp;
            c.pp = pp;
            const int q = mesh.rank_of(c);
            for (int i = 0; i < q % 3; ++i)
              want.insert(want.end(), {static_cast<double>(q), static_cast<double>(i)});
          }
    if (all != want) fail("gather_rows on rank " + std::to_string(r));
  });
  for (const auto& f : failures) FAIL_CHECK(f);
  CHECK(failures.empty());
}

TEST_CASE("layout: world ranks, reductions over named axes, gathered rows", "[parallel][layout]") {
  SECTION("(dp, tp, pp) = (2, 2, 2) from three groups") {
    check_mesh(comm::device_mesh(2, 2, 2), false);
  }
  SECTION("(dp, cp, tp, pp) = (2, 2, 2, 2) from make_groups") {
    check_mesh(comm::device_mesh(comm::mesh_degrees{.dp = 2, .cp = 2, .tp = 2, .pp = 2}), true);
  }
  SECTION("(dp, cp, tp, pp) = (1, 3, 2, 1) from make_groups") {
    check_mesh(comm::device_mesh(comm::mesh_degrees{.cp = 3, .tp = 2}), true);
  }
}

TEST_CASE("layout: one rank has no groups and reduces nothing", "[parallel][layout]") {
  const parallel::layout<comm::local_communicator> one;
  CHECK(one.dp() == 1);
  CHECK(one.tp() == 1);
  CHECK(one.pp() == 1);
  CHECK(one.cp() == 1);
  CHECK(one.world_rank() == 0);
  CHECK(one.dp_group() == nullptr);
  CHECK(one.dp_cp_group() == nullptr);
  double v = 3.5;
  one.reduce(kernels::host_context{}, std::span<double>(&v, 1), parallel::axes::all());
  CHECK(v == 3.5);
}

}  // namespace test_parallel_layout
