// GoogleTest main for every meshtrain test binary: initialises MPI (the trainer always runs
// under MPI, even on one rank) and lets only rank 0 print, so multi-rank runs read like one.

#include <gtest/gtest.h>
#include <mpi.h>

#include "meshtrain/comm/mpi_runtime.h"

int main(int argc, char** argv) {
  meshtrain::init_mpi(&argc, &argv);  // as the binary starts it, under either MPI
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int failed = RUN_ALL_TESTS();
  // A failure on any rank fails every rank: the exit status tells the truth.
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any_failed;
}
