// A stage that fails mid-run ends the whole MPI job promptly, naming it:
// four processes train a pp 4 pipeline (1F1B) for one step, then world rank
// 2 fails with comm::mpi_abort (what train_llama's ranks do on an error they
// cannot report through the pipeline) while the others are inside the
// second step's sends and receives. ctest passes when the output names
// rank 2 (PASS_REGULAR_EXPRESSION) within the test's timeout, far below the
// collectives' 60 s: the other ranks neither hang nor wait for a timeout.
#include <chrono>
#include <cstdio>

#include <tessera/comm/mpi.hpp>

#include "pp_suite.hpp"

using namespace tessera;

int main(int argc, char** argv) {
  comm::mpi_environment env(&argc, &argv);
  comm::comm_options o;
  o.timeout = std::chrono::seconds(60);
  comm::mpi_communicator world(MPI_COMM_WORLD, o);
  if (world.size() != 4) {
    std::fprintf(stderr, "pipeline_fault: run under mpirun -np 4\n");
    return 2;
  }
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("mpi_ppf", world.rank())};
  data::token_file f(corpus.path);
  pp_suite::layout l;
  l.pp = 4;
  const comm::device_mesh mesh(1, 1, 4);
  auto g = comm::make_groups(world, mesh);
  train::trainer<precision::fp64, host, optim::adamw, parallel::zero<0>, comm::mpi_communicator> tr(
      pp_suite::model(), pp_suite::config(l, 4), f,
      parallel::layout{g.dp, nn::dense_layers{}, g.pp});
  (void)tr.train_step();
  if (world.rank() == 2) comm::mpi_abort("pipeline stage 2 failed mid-step (injected)");
  (void)tr.train_step();
  (void)tr.train_step();
  std::printf("pipeline_fault: rank %d finished, which it must not\n", world.rank());
  return 0;
}
