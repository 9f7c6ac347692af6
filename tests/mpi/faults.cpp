// Tests the trainer's failure paths over mpi_communicator: the bodies of
// tests/train/fault_suite.hpp (tests/train/faults.cpp runs them on
// threads). Run by ctest as
//   mpirun -np {2,4} test_mpi --filenames-as-tags "[#faults]"
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>

#include <tessera/comm/mpi.hpp>

#include "fault_suite.hpp"

namespace test_mpi_faults {

using tessera::comm::mpi_communicator;
namespace fs = std::filesystem;

static mpi_communicator world() {
  tessera::comm::comm_options o;
  o.timeout = std::chrono::seconds(60);
  return mpi_communicator(MPI_COMM_WORLD, o);
}

TEST_CASE("mpi: a checkpoint write failing on rank 0 ends every rank with its message",
          "[mpi][trainer][errors]") {
  auto c = world();
  // One folder for the job: rank 0's process id, broadcast.
  std::int64_t id = ::getpid();
  c.broadcast(&id, 1, 0);
  const fs::path dir = fs::temp_directory_path() / ("tessera_mpi_faults_" + std::to_string(id));
  if (c.rank() == 0) fs::create_directories(dir);
  c.barrier();
  REQUIRE_NOTHROW(fault_suite::failed_save_ends_every_rank(c, dir));
  if (c.rank() == 0) fs::remove_all(dir);
}

TEST_CASE("mpi: ranks given different settings are refused at construction",
          "[mpi][trainer][errors]") {
  auto c = world();
  REQUIRE_NOTHROW(fault_suite::differing_settings_refused(c));
}

}  // namespace test_mpi_faults
