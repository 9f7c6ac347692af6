// The communicators' error path under MPI (comm::mpi_notify_failure): four
// processes train data-parallel steps; after its first, world rank 2 fails
// (an error only it sees, as a full disk or a failed check would be) and
// tells the job. The other ranks, waiting in collectives of the first or
// second step, must throw comm_error naming rank 2 and its message within
// seconds (the collectives' timeout is 60 s), and rank 2's own later
// operations fail at once instead of waiting. Every rank then
// leaves main; mpi_environment waits for all of them (so none is ended by
// mpirun before it printed) and skips MPI_Finalize, whose progress of the
// pending collectives would touch freed buffers. The test passes when all
// four ranks printed their line.
#include <chrono>
#include <cstdio>
#include <string>

#include <tessera/comm/mpi.hpp>

#include "trainer_suite.hpp"

using namespace tessera;

int main(int argc, char** argv) {
  comm::mpi_environment env(&argc, &argv);
  comm::comm_options o;
  o.timeout = std::chrono::seconds(60);
  int rc = 0;
  {
    comm::mpi_communicator world(MPI_COMM_WORLD, o);
    if (world.size() != 4) {
      std::fprintf(stderr, "error_path: run under mpirun -np 4\n");
      return 2;
    }
    trainer_suite::temp_file corpus{trainer_suite::make_corpus("mpi_err", world.rank())};
    data::token_file f(corpus.path);
    train::trainer<precision::fp32, host, optim::adamw, parallel::zero<1>, comm::mpi_communicator>
        tr(trainer_suite::model(), trainer_suite::config(4), f, parallel::layout{world});
    // Rank 2 fails after its first step; the others train on, and their
    // next wait (perhaps the end of step 1 still) must throw.
    const auto t0 = std::chrono::steady_clock::now();
    std::string msg;
    try {
      (void)tr.train_step();
      if (world.rank() == 2) comm::mpi_notify_failure("writing metrics.jsonl failed (injected)");
      for (int s = 0; s < 3; ++s) (void)tr.train_step();  // blocks in step 2 without rank 2
    } catch (const comm_error& e) {
      msg = e.what();
    }
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::string want = "world rank 2 failed: writing metrics.jsonl failed (injected)";
    const double limit = 10.0;
    if (msg.find(want) == std::string::npos || secs > limit) {
      std::fprintf(stderr, "error_path: rank %d: after %.2f s (limit %.0f): '%s', want '%s'\n",
                   world.rank(), secs, limit, msg.c_str(), want.c_str());
      rc = 1;
    } else {
      std::printf("error_path: rank %d ended the step after %.3f s: %s\n", world.rank(), secs,
                  msg.c_str());
    }
    std::fflush(stdout);
  }
  return rc;
}
