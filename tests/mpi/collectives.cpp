// Tests include/tessera/comm/mpi.hpp: the shared multi-rank bodies
// (tests/comm/collective_suite.hpp) on mpi_communicator. Run by ctest as
//   mpirun -np {1,2,3,4} test_mpi --filenames-as-tags "[#collectives]"
//          --order rand --rng-seed 20261129
// Every test case gets a fresh communicator (a dup of MPI_COMM_WORLD) with a
// 20 s timeout, so a failing rank makes the others fail instead of hanging.
#include <catch2/catch.hpp>

#include <tessera/comm/any_communicator.hpp>
#include <tessera/comm/local.hpp>
#include <tessera/comm/mpi.hpp>

#include "collective_suite.hpp"

namespace test_mpi_collectives {

using tessera::comm::mpi_communicator;

static_assert(tessera::comm::communicator<mpi_communicator>);

static mpi_communicator world() {
  tessera::comm::comm_options o;
  o.timeout = std::chrono::seconds(20);
  return mpi_communicator(MPI_COMM_WORLD, o);
}

// MPI's summation order is not the local ring's: compare within tolerance.
TEST_CASE("mpi all_reduce matches the serial reference", "[mpi]") {
  auto c = world();
  REQUIRE_NOTHROW(comm_suite::all_reduce_matches_reference(c, false));
}
TEST_CASE("mpi reduce_scatter matches the reference, in place too", "[mpi]") {
  auto c = world();
  REQUIRE_NOTHROW(comm_suite::reduce_scatter_matches_reference(c, false));
}
TEST_CASE("mpi all_gather matches the reference, in place too", "[mpi]") {
  auto c = world();
  REQUIRE_NOTHROW(comm_suite::all_gather_matches_reference(c));
}
TEST_CASE("mpi broadcast from every root", "[mpi]") {
  auto c = world();
  REQUIRE_NOTHROW(comm_suite::broadcast_matches_reference(c));
}
TEST_CASE("mpi send/recv around the ring", "[mpi]") {
  auto c = world();
  REQUIRE_NOTHROW(comm_suite::send_recv_ring(c));
}
TEST_CASE("mpi asynchronous forms", "[mpi]") {
  auto c = world();
  REQUIRE_NOTHROW(comm_suite::async_forms(c, false));
}
TEST_CASE("mpi: a rank that skips a collective makes the others time out", "[mpi]") {
  auto c = world();
  REQUIRE_NOTHROW(comm_suite::skipped_collective_times_out(c, false));
}
TEST_CASE("mpi debug hash names the first divergent collective", "[mpi]") {
  auto c = world();
  REQUIRE_NOTHROW(comm_suite::debug_hash_names_divergence(c));
}
TEST_CASE("mpi device_mesh groups as sub-communicators", "[mpi]") {
  auto c = world();
  if (c.size() == 4) {
    REQUIRE_NOTHROW(comm_suite::mesh_groups_reduce(c, 2, 2, 1));
    REQUIRE_NOTHROW(comm_suite::mesh_groups_reduce(c, 1, 2, 2));
    REQUIRE_NOTHROW(comm_suite::mesh_groups_reduce(c, 2, 1, 1, 2));  // (dp, cp) = (2, 2)
    REQUIRE_NOTHROW(comm_suite::mesh_groups_reduce(c, 1, 2, 1, 2));  // (cp, tp) = (2, 2)
  } else {
    REQUIRE_NOTHROW(comm_suite::mesh_groups_reduce(c, c.size(), 1, 1));
    REQUIRE_NOTHROW(comm_suite::mesh_groups_reduce(c, 1, 1, c.size()));
    REQUIRE_NOTHROW(comm_suite::mesh_groups_reduce(c, 1, 1, 1, c.size()));
  }
}

// train_llama's host world: an any_communicator holding this process's
// mpi_communicator gives its results (the suites) and its groups.
TEST_CASE("mpi any_communicator holding mpi_communicator", "[mpi]") {
  using any = tessera::comm::any_communicator<tessera::comm::local_communicator, mpi_communicator>;
  auto c = world();
  any a(c.split(0, c.rank()));
  REQUIRE(a.holds<mpi_communicator>());
  REQUIRE_NOTHROW(comm_suite::all_reduce_matches_reference(a, false));
  REQUIRE_NOTHROW(comm_suite::reduce_scatter_matches_reference(a, false));
  REQUIRE_NOTHROW(comm_suite::all_gather_matches_reference(a));
  REQUIRE_NOTHROW(comm_suite::send_recv_ring(a));
  REQUIRE_NOTHROW(comm_suite::async_forms(a, false));
  if (a.size() == 4) REQUIRE_NOTHROW(comm_suite::mesh_groups_reduce(a, 2, 1, 1, 2));
}

}  // namespace test_mpi_collectives
