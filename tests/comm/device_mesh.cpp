// Tests include/tessera/comm/device_mesh.hpp: Megatron order against
// hand-computed tables, and mismatched meshes named in the error.
#include <catch2/catch.hpp>

#include <tessera/comm/device_mesh.hpp>

namespace test_comm_device_mesh {

using tessera::comm::device_mesh;
using tessera::comm::mesh_coord;
using tessera::comm::mesh_degrees;
using V = std::vector<int>;

TEST_CASE("device_mesh (dp,tp,pp)=(2,2,2): Megatron order, tp fastest then dp then pp", "[comm]") {
  const device_mesh m(mesh_degrees{.dp = 2, .tp = 2, .pp = 2}, 8);
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
  const device_mesh m(mesh_degrees{.dp = 2, .tp = 4, .pp = 2}, 16);
  CHECK(m.coord(13) == mesh_coord{1, 1, 1});  // 13 = 1*8 + 1*4 + 1
  CHECK(m.tp_group(13) == V{12, 13, 14, 15});
  CHECK(m.dp_group(13) == V{9, 13});
  CHECK(m.pp_group(13) == V{5, 13});
  const device_mesh d(mesh_degrees{.dp = 4}, 4);  // pure data parallel
  CHECK(d.dp_group(2) == V{0, 1, 2, 3});
  CHECK(d.tp_group(2) == V{2});
  const device_mesh p(mesh_degrees{.pp = 3}, 3);  // pure pipeline
  CHECK(p.pp_group(1) == V{0, 1, 2});
}

TEST_CASE("device_mesh that does not match the world names the numbers", "[comm]") {
  try {
    device_mesh(mesh_degrees{.dp = 2, .tp = 2, .pp = 2}, 6);
    FAIL("no throw");
  } catch (const tessera::config_error& e) {
    CHECK(std::string(e.what()) ==
          "device_mesh: dp=2 x tp=2 x pp=2 = 8 ranks, but the world has 6; choose degrees whose "
          "product is 6");
  }
  CHECK_THROWS_AS(device_mesh(0, 2, 2), tessera::config_error);
  CHECK_THROWS_AS(device_mesh(2, 2, 1).coord(4), tessera::config_error);
  CHECK_THROWS_AS(device_mesh(mesh_degrees{.cp = 0}), tessera::config_error);
  try {
    device_mesh(mesh_degrees{.dp = 2, .cp = 2, .tp = 2}, 4);
    FAIL("no throw");
  } catch (const tessera::config_error& e) {
    CHECK(std::string(e.what()) ==
          "device_mesh: dp=2 x cp=2 x tp=2 x pp=1 = 8 ranks, but the world has 4; choose degrees "
          "whose product is 4");
  }
  try {
    device_mesh(mesh_degrees{.dp = 65536, .cp = 65536});
    FAIL("no throw");
  } catch (const tessera::config_error& e) {
    CHECK(std::string(e.what()) ==
          "device_mesh: dp=65536 x cp=65536 x tp=1 x pp=1 = 4294967296 ranks, more than 2^31 - 1");
  }
}

// Megatron-Core's order, (tp, cp, dp, pp) fastest first, computed
// independently: the rank's digits in the mixed radix (tp, cp, dp, pp).
TEST_CASE("device_mesh with cp: Megatron-Core order over every (dp, cp, tp, pp) up to 3",
          "[comm]") {
  for (int dp = 1; dp <= 3; ++dp)
    for (int cp = 1; cp <= 3; ++cp)
      for (int tp = 1; tp <= 3; ++tp)
        for (int pp = 1; pp <= 3; ++pp) {
          const device_mesh m(mesh_degrees{.dp = dp, .cp = cp, .tp = tp, .pp = pp});
          REQUIRE(m.size() == dp * cp * tp * pp);
          for (int r = 0; r < m.size(); ++r) {
            int x = r;
            mesh_coord want;
            want.tp = x % tp;
            x /= tp;
            want.cp = x % cp;
            x /= cp;
            want.dp = x % dp;
            want.pp = x / dp;
            REQUIRE(m.coord(r) == want);
            REQUIRE(m.rank_of(want) == r);
            // every group holds its rank once, and its members differ from
            // it in that axis alone
            for (const auto& [g, index] :
                 {std::pair{m.tp_group(r), want.tp}, std::pair{m.cp_group(r), want.cp},
                  std::pair{m.dp_group(r), want.dp}, std::pair{m.pp_group(r), want.pp},
                  std::pair{m.dp_cp_group(r), want.dp * cp + want.cp}})
              REQUIRE(g[static_cast<std::size_t>(index)] == r);
            for (int o : m.cp_group(r)) {
              const auto c = m.coord(o);
              REQUIRE((c.dp == want.dp && c.tp == want.tp && c.pp == want.pp));
            }
            for (int o : m.dp_cp_group(r)) {
              const auto c = m.coord(o);
              REQUIRE((c.tp == want.tp && c.pp == want.pp));
            }
            REQUIRE(m.dp_cp_group(r).size() == static_cast<std::size_t>(dp * cp));
            REQUIRE(m.dp_cp_index(r) == want.dp * cp + want.cp);
          }
          // cp 1 maps every rank exactly as the (dp, tp, pp) mesh did:
          // pp * dp * tp + dp * tp + tp
          if (cp == 1)
            for (int r = 0; r < m.size(); ++r) {
              const auto c = m.coord(r);
              REQUIRE(r == (c.pp * dp + c.dp) * tp + c.tp);
            }
        }
}

TEST_CASE("device_mesh (dp,cp,tp,pp)=(2,2,2,2): groups by hand", "[comm]") {
  const device_mesh m(mesh_degrees{.dp = 2, .cp = 2, .tp = 2, .pp = 2}, 16);
  // rank 13 = ((1 * 2 + 1) * 2 + 0) * 2 + 1: pp 1, dp 1, cp 0, tp 1
  mesh_coord c13;
  c13.dp = 1;
  c13.cp = 0;
  c13.tp = 1;
  c13.pp = 1;
  CHECK(m.coord(13) == c13);
  CHECK(m.tp_group(13) == V{12, 13});
  CHECK(m.cp_group(13) == V{13, 15});
  CHECK(m.dp_group(13) == V{9, 13});
  CHECK(m.pp_group(13) == V{5, 13});
  CHECK(m.dp_cp_group(13) == V{9, 11, 13, 15});
  CHECK(m.cp_color(13) == 13);
  CHECK(m.dp_cp_index(13) == 2);
  CHECK(m.dp_cp_color(13) == 9);
}

}  // namespace test_comm_device_mesh
