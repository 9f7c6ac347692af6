// Tests include/tessera/comm/launch.hpp: a process's rank, world size and
// node-local ranks as Open MPI's, PMI's and PMIx's variables give them, and
// the defaults without a launcher.
#include <catch2/catch.hpp>

#include <cstdlib>

#include "tessera/comm/launch.hpp"

namespace test_comm_launch {

using namespace tessera;

TEST_CASE("the launcher's environment gives the rank, the size and the node's ranks",
          "[comm][launch]") {
  const char* vars[] = {"OMPI_COMM_WORLD_RANK",
                        "OMPI_COMM_WORLD_SIZE",
                        "OMPI_COMM_WORLD_LOCAL_SIZE",
                        "OMPI_COMM_WORLD_LOCAL_RANK",
                        "PMI_RANK",
                        "PMI_SIZE",
                        "PMIX_RANK"};
  for (const char* v : vars) ::unsetenv(v);
  CHECK(!comm::launched_by_mpi());
  comm::launch_world w = comm::launched_world();
  CHECK(w.rank == 0);
  CHECK(w.size == 1);
  CHECK(w.local_size == 1);
  CHECK(w.local_rank == -1);
  ::setenv("PMI_RANK", "3", 1);
  ::setenv("PMI_SIZE", "8", 1);
  CHECK(comm::launched_by_mpi());
  w = comm::launched_world();
  CHECK(w.rank == 3);
  CHECK(w.size == 8);
  ::setenv("OMPI_COMM_WORLD_RANK", "5", 1);  // Open MPI's first
  ::setenv("OMPI_COMM_WORLD_SIZE", "6", 1);
  ::setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
  ::setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
  w = comm::launched_world();
  CHECK(w.rank == 5);
  CHECK(w.size == 6);
  CHECK(w.local_size == 2);
  CHECK(w.local_rank == 1);
  for (const char* v : vars) ::unsetenv(v);
}

}  // namespace test_comm_launch
