// Tests include/tessera/comm/device_mesh.hpp: Megatron order against
// hand-computed tables, and mismatched meshes named in the error.
#include <catch2/catch.hpp>

#include <tessera/comm/device_mesh.hpp>

namespace test_comm_device_mesh {

using tessera::comm::device_mesh;
using tessera::comm::mesh_coord;
using V = std::vector<int>;

TEST_CASE("device_mesh (dp,tp,pp)=(2,2,2): Megatron order, tp fastest then dp then pp", "[comm]") {
  const device_mesh m(2, 2, 2, 8);
  // rank: (dp, tp, pp), by hand from rank = pp*4 + dp*2 + tp
  const mesh_coord want[8] = {{0, 0, 0}, {0, 1, 0}, {1, 0, 0}, {1, 1, 0},
                              {0, 0, 1}, {0, 1, 1}, {1, 0, 1}, {1, 1, 1}};
  for (int r = 0; r < 8; ++r) {
    CHECK(m.coord(r) == want[r]);
    CHECK(m.rank_of(want[r]) == r);
  }
  CHECK(m.tp_group(0) == V{0, 1});
  CHECK(m.tp_group(5) == V{4, 5});
  CHECK(m.dp_group(1) == V{1, 3});
  CHECK(m.dp_group(6) == V{4, 6});
  CHECK(m.pp_group(2) == V{2, 6});
  CHECK(m.pp_group(7) == V{3, 7});
  CHECK(m.tp_color(5) == 4);
  CHECK(m.dp_color(3) == 1);
  CHECK(m.pp_color(6) == 2);
}

TEST_CASE("device_mesh (dp,tp,pp)=(2,4,2) and degenerate meshes", "[comm]") {
  const device_mesh m(2, 4, 2, 16);
  CHECK(m.coord(13) == mesh_coord{1, 1, 1});  // 13 = 1*8 + 1*4 + 1
  CHECK(m.tp_group(13) == V{12, 13, 14, 15});
  CHECK(m.dp_group(13) == V{9, 13});
  CHECK(m.pp_group(13) == V{5, 13});
  const device_mesh d(4, 1, 1, 4);  // pure data parallel
  CHECK(d.dp_group(2) == V{0, 1, 2, 3});
  CHECK(d.tp_group(2) == V{2});
  const device_mesh p(1, 1, 3, 3);  // pure pipeline
  CHECK(p.pp_group(1) == V{0, 1, 2});
}

TEST_CASE("device_mesh that does not match the world names the numbers", "[comm]") {
  try {
    device_mesh(2, 2, 2, 6);
    FAIL("no throw");
  } catch (const tessera::config_error& e) {
    CHECK(std::string(e.what()) ==
          "device_mesh: dp=2 x tp=2 x pp=2 = 8 ranks, but the world has 6; choose degrees whose "
          "product is 6");
  }
  CHECK_THROWS_AS(device_mesh(0, 2, 2), tessera::config_error);
  CHECK_THROWS_AS(device_mesh(2, 2, 1).coord(4), tessera::config_error);
}

}  // namespace test_comm_device_mesh
