// Replays the golden trajectory tiny_mpi2_zero1 (tests/train/golden_suite.hpp)
// on two MPI processes under zero<1>, bit for bit. Run by ctest as
//   mpirun -np 2 test_mpi_golden
// With TESSERA_GOLDEN_WRITE=1, rank 0 records it instead
// (tests/train/golden_trajectories.txt.mpi).
#include <catch2/catch.hpp>

#include <tessera/comm/mpi.hpp>

#include "golden_runs.hpp"

using namespace tessera;

TEST_CASE("golden: tiny on 2 MPI ranks under zero<1>, 20 steps", "[golden][mpi]") {
  comm::comm_options o;
  o.timeout = std::chrono::seconds(120);
  comm::mpi_communicator c(MPI_COMM_WORLD, o);
  REQUIRE(c.size() == 2);
  const golden::trajectory t = golden::tiny_dp_run<parallel::zero<1>>(c, 4, "mpi2");
  if (golden::recording()) {
    if (c.rank() == 0) golden::record("mpi", "tiny_mpi2_zero1", t);
    return;
  }
  const std::string diff = golden::compare("tiny_mpi2_zero1", t);
  INFO("rank " << c.rank() << ": " << diff);
  CHECK(diff.empty());
}
