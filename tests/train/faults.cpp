// Tests the trainer's failure paths over local_communicator (thread ranks):
// a checkpoint write failing on rank 0 ends every rank at once with its
// message, and ranks given different settings are refused at construction
// (tests/train/fault_suite.hpp; tests/mpi/faults.cpp runs the same bodies
// under MPI).
#include <catch2/catch.hpp>

#include <omp.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>

#include <tessera/comm/local.hpp>

#include "fault_suite.hpp"

namespace test_train_faults {

using tessera::comm::local_communicator;
using tessera::comm::local_world;
namespace fs = std::filesystem;

namespace {
tessera::comm::comm_options test_options() {
  tessera::comm::comm_options o;
  o.timeout = std::chrono::seconds(60);
  return o;
}
template <class Body>
void for_dp(Body body) {
  for (int N = 1; N <= 3; ++N) {
    INFO("dp " << N);
    REQUIRE_NOTHROW(local_world::run(
        N,
        [&](local_communicator& c) {
          omp_set_num_threads(1);
          body(c);
        },
        test_options()));
  }
}
}  // namespace

TEST_CASE("a checkpoint write failing on rank 0 ends every rank with its message",
          "[train][errors]") {
  const fs::path dir = fs::temp_directory_path() / ("tessera_faults_" + std::to_string(::getpid()));
  for_dp([&](local_communicator& c) {
    if (c.rank() == 0) {
      fs::remove_all(dir);
      fs::create_directories(dir);
    }
    c.barrier();
    fault_suite::failed_save_ends_every_rank(c, dir);
  });
  fs::remove_all(dir);
}

TEST_CASE("ranks given different settings are refused at construction, naming the setting",
          "[train][errors]") {
  for_dp([](local_communicator& c) { fault_suite::differing_settings_refused(c); });
}

}  // namespace test_train_faults
