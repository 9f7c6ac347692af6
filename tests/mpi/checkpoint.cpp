// Checkpoint folders move between layouts on MPI processes: the pairs of
// tests/train/reshard_suite.hpp (the same bodies tests/train/
// checkpoint_folder.cpp runs on threads) whose larger mesh has np ranks,
// each saved at one (dp, tp, pp, schedule, ZeRO stage) mesh and loaded at
// another (the smaller mesh on the first ranks of MPI_COMM_WORLD): the
// state loaded equals the state saved bit for bit, and three more steps
// equal the single-rank run within 1e-10. Run by ctest as
//   mpirun -np {2,4,8} test_mpi --filenames-as-tags "[#checkpoint]"
#include <catch2/catch.hpp>

#include <algorithm>

#include <tessera/comm/mpi.hpp>

#include "reshard_suite.hpp"

namespace test_mpi_checkpoint {

using namespace tessera;

TEST_CASE(
    "mpi checkpoints saved at one layout load bit for bit at another and continue as "
    "one rank would",
    "[mpi][checkpoint]") {
  comm::comm_options o;
  // 8 processes on 2 cores beside other jobs: a collective can wait long.
  o.timeout = std::chrono::seconds(150);
  comm::mpi_communicator world(MPI_COMM_WORLD, o);
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("mpi_reshard", world.rank())};
  data::token_file f(corpus.path);
  const auto ref = reshard_suite::single_rank(f);
  int pairs = 0;
  for (const auto& [a, b] : reshard_suite::matrix()) {
    if (std::max(a.ranks(), b.ranks()) != world.size()) continue;
    INFO("saved at " << a.name() << ", loaded at " << b.name());
    REQUIRE_NOTHROW(reshard_suite::check_pair(world, a, b, f, ref));
    ++pairs;
  }
  CHECK(pairs > 0);
  // bf16_mixed: the master weights and moments, bit for bit.
  for (const auto& [a, b] : reshard_suite::master_pairs()) {
    if (std::max(a.ranks(), b.ranks()) != world.size()) continue;
    INFO("bf16_mixed saved at " << a.name() << ", loaded at " << b.name());
    REQUIRE_NOTHROW(reshard_suite::check_resave<precision::bf16_mixed>(world, a, b, f));
  }
}

}  // namespace test_mpi_checkpoint
