// agree(): every rank reaches the verdict of the lowest failing rank, and memory running out is
// reported as such (AgreedOutOfMemory, which the program turns into advice), not as the bare
// "std::bad_alloc". Under mpiexec with 1 and 2 ranks; with 2, the failing rank is each in turn.

#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <new>
#include <stdexcept>
#include <string>

#include "meshtrain/comm/agreement.h"
#include "meshtrain/comm/mpi_communicator.h"
#include "support/mpi_world.h"

namespace meshtrain {
namespace {

MpiCommunicator world() {
  return MpiCommunicator(MPI_COMM_WORLD, "world", std::chrono::duration<double>(60));
}

TEST(Agree, OutOfMemoryOnOneRankIsOutOfMemoryEverywhere) {
  MpiCommunicator comm = world();
  for (int failing = 0; failing < comm.size(); ++failing) {
    try {
      agree(comm, [&] {
        if (comm.rank() == failing) throw std::bad_alloc();
      });
      FAIL() << "no error agreed";
    } catch (const AgreedOutOfMemory& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.find("out of memory (an allocation failed)"), 0u) << what;
      EXPECT_EQ(what.find("bad_alloc"), std::string::npos) << what;
      if (comm.size() > 1) {
        EXPECT_NE(what.find("[rank " + std::to_string(failing) + "]"), std::string::npos) << what;
      }
    }
  }
}

TEST(Agree, TheLowestFailingRankDecidesTheKind) {
  MpiCommunicator comm = world();
  if (comm.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  try {
    agree(comm, [&] {
      if (comm.rank() == 0) throw std::runtime_error("disk full on rank 0");
      throw std::bad_alloc();
    });
    FAIL() << "no error agreed";
  } catch (const AgreedOutOfMemory& e) {
    FAIL() << "rank 0's error was not the agreed one: " << e.what();
  } catch (const AgreedError& e) {
    EXPECT_EQ(std::string(e.what()), "disk full on rank 0 [rank 0 and 1 other rank(s)]");
  }
}

}  // namespace
}  // namespace meshtrain
