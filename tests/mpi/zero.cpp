// Tests include/tessera/parallel/zero.hpp and train/trainer.hpp over
// mpi_communicator: the bodies of tests/parallel/zero_suite.hpp and
// trainer_suite.hpp (the same ones tests/parallel/ runs on threads). Run by
// ctest as
//   mpirun -np {1,2,3,4} test_mpi --filenames-as-tags "[#zero]"
//          --order rand --rng-seed 20261129
// Every test case gets a fresh communicator (a dup of MPI_COMM_WORLD) with a
// 60 s timeout, so a failing rank makes the others fail instead of hanging.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>

#include <tessera/comm/mpi.hpp>

#include "trainer_suite.hpp"
#include "zero_suite.hpp"

namespace test_mpi_zero {

using tessera::comm::mpi_communicator;
namespace fs = std::filesystem;

static mpi_communicator world() {
  tessera::comm::comm_options o;
  o.timeout = std::chrono::seconds(60);
  return mpi_communicator(MPI_COMM_WORLD, o);
}

// MPI's reduce_scatter and all_reduce need not add in the same order, so the
// stages are compared with the 1-rank run within tolerance, not bit for bit.
TEST_CASE("mpi zero<0..3> match the 1-rank run (float64)", "[mpi][zero]") {
  auto c = world();
  REQUIRE_NOTHROW(zero_suite::stages_match_single_rank<tessera::precision::fp64>(c, false));
}
TEST_CASE("mpi zero<0..3> match the 1-rank run (float32)", "[mpi][zero]") {
  auto c = world();
  REQUIRE_NOTHROW(zero_suite::stages_match_single_rank<tessera::precision::fp32>(c, false));
}
TEST_CASE("mpi zero<2,3> reducing every micro-batch match the 1-rank run", "[mpi][zero]") {
  auto c = world();
  REQUIRE_NOTHROW(zero_suite::per_micro_batch_matches_single_rank<tessera::precision::fp64>(c));
}
TEST_CASE("mpi bf16_mixed stages stay within bf16 rounding of 1 rank", "[mpi][zero][bf16]") {
  auto c = world();
  REQUIRE_NOTHROW(zero_suite::bf16_stages_agree(c, false));
}
TEST_CASE("mpi communicated bytes per step follow the formulas", "[mpi][zero][bytes]") {
  auto c = world();
  REQUIRE_NOTHROW(zero_suite::comm_bytes_per_step(c));
}
TEST_CASE("mpi data-parallel trainer reproduces the 1-rank trainer", "[mpi][trainer]") {
  using namespace tessera::parallel;
  auto c = world();
  REQUIRE_NOTHROW(trainer_suite::matches_single_rank<zero<0>>(c));
  REQUIRE_NOTHROW(trainer_suite::matches_single_rank<zero<1>>(c));
  REQUIRE_NOTHROW(trainer_suite::matches_single_rank<zero<2>>(c));
  REQUIRE_NOTHROW(trainer_suite::matches_single_rank<zero<3>>(c));
}
TEST_CASE("mpi data-parallel trainer fails before any work naming the numbers",
          "[mpi][trainer][errors]") {
  auto c = world();
  REQUIRE_NOTHROW(trainer_suite::bad_settings_fail_before_work(c));
}
TEST_CASE("mpi zero<0> checkpoint resumes exactly; sharded stages refuse",
          "[mpi][trainer][checkpoint]") {
  auto c = world();
  std::int64_t pid = ::getpid();  // rank 0's pid names the folder every rank shares
  c.broadcast(&pid, 1, 0);
  const fs::path dir = fs::temp_directory_path() / ("tessera_mpi_ckpt_" + std::to_string(pid));
  if (c.rank() == 0) fs::create_directories(dir);
  c.barrier();
  REQUIRE_NOTHROW(trainer_suite::checkpoint_resumes_or_refuses(c, dir));
  c.barrier();
  if (c.rank() == 0) fs::remove_all(dir);
}

}  // namespace test_mpi_zero
