// Catch2 main for tests run under mpirun: initialises MPI (mpi_environment),
// runs the same test cases in the same order on every rank, and exits with
// the worst status of any rank.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <tessera/comm/mpi.hpp>

int main(int argc, char** argv) {
  tessera::comm::mpi_environment env(&argc, &argv);
  const int rc = Catch::Session().run(argc, argv);
  int worst = rc;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return worst;
}
