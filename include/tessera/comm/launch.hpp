#pragma once
/// \file comm/launch.hpp
/// What an MPI launcher (Open MPI's mpirun, MPICH's or Slurm's PMI, PMIx)
/// tells a process through its environment before MPI_Init: its rank, the
/// world size and the ranks on its node (and this process's index among them). A program reads it to decide, before
/// any communicator exists, whether it runs as one of several processes
/// (comm/mpi.hpp then builds the world) and which rank prints.

#include <cstdlib>

namespace tessera::comm {

/// This process's rank, the world size and the ranks on this node as the
/// launcher tells them; {0, 1, 1} when no launcher started it.
struct launch_world {
  int rank = 0;        ///< OMPI_COMM_WORLD_RANK, PMI_RANK or PMIX_RANK
  int size = 1;        ///< OMPI_COMM_WORLD_SIZE or PMI_SIZE
  int local_size = 1;  ///< OMPI_COMM_WORLD_LOCAL_SIZE (1 when not given)
  int local_rank = -1; ///< OMPI_COMM_WORLD_LOCAL_RANK (-1 when not given)
};

namespace detail {
inline int env_int(const char* name) {
  const char* s = std::getenv(name);
  return s ? std::atoi(s) : -1;
}
}  // namespace detail

/// True when this process was started by an MPI launcher (mpirun, srun).
inline bool launched_by_mpi() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") ||
         std::getenv("PMIX_RANK");
}

/// The launcher's view of this process (launch_world); never throws.
inline launch_world launched_world() {
  launch_world w;
  for (const char* r : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"})
    if (detail::env_int(r) >= 0) {
      w.rank = detail::env_int(r);
      break;
    }
  for (const char* n : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"})
    if (detail::env_int(n) > 0) {
      w.size = detail::env_int(n);
      break;
    }
  if (detail::env_int("OMPI_COMM_WORLD_LOCAL_SIZE") > 0)
    w.local_size = detail::env_int("OMPI_COMM_WORLD_LOCAL_SIZE");
  w.local_rank = detail::env_int("OMPI_COMM_WORLD_LOCAL_RANK");
  return w;
}

}  // namespace tessera::comm
