#pragma once
// The world's size and this process's rank, for tests that run under mpiexec.

#include <mpi.h>

namespace meshtrain::testing {

inline int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

}  // namespace meshtrain::testing
