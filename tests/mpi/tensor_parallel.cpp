// The trainer on a dp x tp mesh of MPI processes computes the single-rank
// run: the bodies of tests/train/tp_suite.hpp (the same ones
// tests/train/tensor_parallel.cpp runs on threads). Run by ctest as
//   mpirun -np N test_mpi --filenames-as-tags "[#tensor_parallel]" with
//   N = 2: (dp, tp) = (1, 2)
//   N = 4: (1, 4) and (2, 2)
//   N = 8: (4, 2)
// with and without sequence parallelism, under zero<0> and zero<1>.
#include <catch2/catch.hpp>

#include <tessera/comm/mpi.hpp>

#include "tp_suite.hpp"

namespace test_mpi_tensor_parallel {

using namespace tessera;
using comm::mpi_communicator;

namespace {

mpi_communicator world() {
  comm::comm_options o;
  o.timeout = std::chrono::seconds(60);
  return mpi_communicator(MPI_COMM_WORLD, o);
}

// Every mesh of this world's size, on float64 to 1e-10 and float32 to 1e-5.
template <class P>
void meshes(double tol) {
  auto w = world();
  // One corpus per process (each writes and reads its own file).
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("mpi_tp", w.rank())};
  data::token_file f(corpus.path);
  const tp_suite::reference ref = tp_suite::single_rank<P>(f, 5);
  std::vector<std::pair<int, int>> shapes;
  if (w.size() == 2) shapes = {{1, 2}};
  if (w.size() == 4) shapes = {{1, 4}, {2, 2}};
  if (w.size() == 8) shapes = {{4, 2}};
  for (auto [dp, tp] : shapes)
    for (bool sp : {false, true}) {
      REQUIRE_NOTHROW(tp_suite::check_mesh<P, parallel::zero<0>>(w, ref, f, dp, tp, sp, tol));
      REQUIRE_NOTHROW(tp_suite::check_mesh<P, parallel::zero<1>>(w, ref, f, dp, tp, sp, tol));
    }
}

}  // namespace

TEST_CASE("mpi tp trainer equals one rank's (float64)", "[mpi][tp]") {
  meshes<precision::fp64>(1e-10);
}
TEST_CASE("mpi tp trainer equals one rank's (float32)", "[mpi][tp]") {
  meshes<precision::fp32>(1e-5);
}

}  // namespace test_mpi_tensor_parallel
