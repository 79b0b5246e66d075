// GoogleTest main for every meshtrain test binary: initialises MPI (the trainer always runs
// under MPI, even on one rank) and lets only rank 0 print, so multi-rank runs read like one.

#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

#include "meshtrain/comm/mpi_runtime.h"
#include "support/isa_cap.h"

namespace {

// A test run capped at an ISA this CPU lacks (ONEDNN_MAX_CPU_ISA above it) would test a lower
// ISA under the wrong name: every test is skipped instead, with the reason (CTest reports the
// run as skipped on kIsaUnavailable).
class IsaCapEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    const meshtrain::testing::IsaCap cap = meshtrain::testing::onednn_isa_cap();
    if (cap.requested.empty()) return;
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (cap.reached) {
      if (rank == 0) std::printf("# ONEDNN_MAX_CPU_ISA=%s: oneDNN dispatches to %s\n", cap.requested.c_str(),
                                 cap.effective.c_str());
      return;
    }
    if (rank == 0)
      std::printf("# %s: ONEDNN_MAX_CPU_ISA=%s, but oneDNN dispatches to %s here\n",
                  meshtrain::testing::kIsaUnavailable, cap.requested.c_str(), cap.effective.c_str());
    GTEST_SKIP() << meshtrain::testing::kIsaUnavailable << ": " << cap.requested << " (this CPU: "
                 << cap.effective << ")";
  }
};

}  // namespace

int main(int argc, char** argv) {
  meshtrain::init_mpi(&argc, &argv);  // as the binary starts it, under either MPI
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new IsaCapEnvironment);
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
