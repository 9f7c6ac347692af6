// Catch2 main of test_cuda_nccl, run under mpirun (one process per GPU).
// Every rank decides together (MPI_Allreduce) whether the node has a GPU
// for each of its ranks; if not, rank 0 prints why and every rank exits 77,
// which ctest reports as "Skipped" (SKIP_RETURN_CODE), never as passed.
// Otherwise rank i of a node uses device i, the same test cases run in the
// same order on every rank, and the job exits with the worst status.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <cstdio>

#include <tessera/comm/mpi.hpp>

namespace {
int g_device = -1;
}
/// This rank's CUDA device (its rank among the ranks of its node).
int tessera_nccl_test_device() {
  return g_device;
}

int main(int argc, char** argv) {
  tessera::comm::mpi_environment env(&argc, &argv);
  int world_rank = 0, world_size = 1, local_rank = 0, local_size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &local_rank);
  MPI_Comm_size(node, &local_size);
  MPI_Comm_free(&node);

  int n_dev = 0;
  const cudaError_t e = cudaGetDeviceCount(&n_dev);
  if (e != cudaSuccess) n_dev = 0;
  const int mine = n_dev >= local_size ? 1 : 0;
  int all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!all) {
    if (!mine)
      std::printf(
          "SKIPPED: world rank %d: %d ranks on this node need %d CUDA devices, found %d "
          "(cudaGetDeviceCount: %s); the [cuda][nccl] tests did not run\n",
          world_rank, local_size, local_size, n_dev,
          e == cudaSuccess ? "cudaSuccess" : cudaGetErrorName(e));
    std::fflush(stdout);
    return 77;
  }
  g_device = local_rank;
  if (local_rank == 0) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, 0) == cudaSuccess)
      std::printf("world rank %d: %d ranks on %d devices (%s, sm_%d%d)\n", world_rank, local_size,
                  n_dev, p.name, p.major, p.minor);
  }
  const int rc = Catch::Session().run(argc, argv);
  int worst = rc;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return worst;
}
