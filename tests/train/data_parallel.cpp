// Tests include/tessera/train/trainer.hpp over local_communicator: for
// dp 1..4 and zero<0..3>, with the global batch fixed at 12 sequences, the
// loss curve, gradient norms, parameters, evaluation and samples equal one
// rank's train::trainer (float64 1e-12); bad degrees and batches fail before
// any collective naming the numbers; a zero<0> checkpoint of a dp run resumes
// exactly and sharded stages refuse. tests/mpi/zero.cpp runs the same bodies
// under MPI.
#include <catch2/catch.hpp>

#include <omp.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>

#include <tessera/comm/local.hpp>

#include "trainer_suite.hpp"

namespace test_train_data_parallel {

using tessera::comm::local_communicator;
using tessera::comm::local_world;
namespace fs = std::filesystem;

namespace {
tessera::comm::comm_options test_options() {
  tessera::comm::comm_options o;
  o.timeout = std::chrono::seconds(60);
  return o;
}
// One OpenMP thread per rank (ranks are threads; see tests/parallel/zero.cpp).
template <class Body>
void for_dp(Body body) {
  for (int N = 1; N <= 4; ++N) {
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

TEST_CASE("the data-parallel trainer reproduces the 1-rank trainer for every dp and stage",
          "[parallel][trainer]") {
  using namespace tessera::parallel;
  for_dp([](local_communicator& c) {
    trainer_suite::matches_single_rank<zero<0>>(c);
    trainer_suite::matches_single_rank<zero<1>>(c);
    trainer_suite::matches_single_rank<zero<2>>(c);
    trainer_suite::matches_single_rank<zero<3>>(c);
  });
}

TEST_CASE("the data-parallel trainer fails before any work naming the numbers",
          "[parallel][trainer][errors]") {
  for_dp([](local_communicator& c) { trainer_suite::bad_settings_fail_before_work(c); });
}

TEST_CASE("a zero<0> checkpoint of a dp run resumes exactly; sharded stages refuse",
          "[parallel][trainer][checkpoint]") {
  const fs::path dir =
      fs::temp_directory_path() / ("tessera_dp_ckpt_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  for_dp([&](local_communicator& c) { trainer_suite::checkpoint_resumes_or_refuses(c, dir); });
  fs::remove_all(dir);
}

}  // namespace test_train_data_parallel
