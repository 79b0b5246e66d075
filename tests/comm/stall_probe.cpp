// A job with one stalled rank, driven by stall_abort_test.py. Every other rank holds pending
// operations that can never complete (receives from the stalled rank), then waits in an
// all-reduce the stalled rank never joins. The job must end within seconds of the timeout, with
// the armed exit status and a diagnosis naming the operation, the rank and its node; before the
// armed abort, unwinding waited out one more timeout per pending operation and ended in
// std::terminate.
//
// Usage: stall_probe TIMEOUT_SECONDS PENDING_OPERATIONS

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "meshtrain/app/mpi_session.h"
#include "meshtrain/comm/mpi_communicator.h"
#include "meshtrain/tensor/allocator.h"

int main(int argc, char** argv) {
  using namespace meshtrain;
  MpiSession mpi(&argc, &argv);
  const double timeout = argc > 1 ? std::atof(argv[1]) : 2.0;
  const int pending = argc > 2 ? std::atoi(argv[2]) : 4;
  return run_reporting_errors([&] {
    MpiCommunicator world(MPI_COMM_WORLD, "world", std::chrono::duration<double>(timeout));
    const int stalled = world.size() - 1;
    if (world.rank() == stalled) {
      std::printf("probe: rank %d stalls\n", world.rank());
      std::fflush(stdout);
      for (;;) pause();
    }
    HostAllocator host;
    auto tensor = [&] { return Tensor(host.allocate(64 * sizeof(float), MemoryCategory::CommBuffers), 0, {64}, DType::F32); };
    std::vector<Tensor> buffers;
    std::vector<Work> held;
    for (int i = 0; i < pending; ++i) {
      buffers.push_back(tensor());
      held.push_back(world.recv(buffers.back(), stalled, i));
    }
    Tensor sum = tensor();
    const double since = std::chrono::duration<double>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
    std::printf("probe: rank %d waiting since %.3f\n", world.rank(), since);
    std::fflush(stdout);
    world.all_reduce(sum, ReduceOp::Sum).wait();
    return 0;
  });
}
