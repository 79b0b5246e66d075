#include <cstdio>

#include "meshtrain/app/commands.h"
#include "meshtrain/app/mpi_session.h"
#include "meshtrain/app/run_setup.h"
#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/comm/mpi_communicator.h"
#include "meshtrain/train/trainer.h"

namespace meshtrain {

int train_command(const TrainArgs& args) {
  MpiSession mpi;
  return run_reporting_errors([&] {
    MpiCommunicator world(MPI_COMM_WORLD, "world");
    const Config config = load_config(args.deck, args.overrides, world);
    CpuBackend backend(choose_threads(config.run.threads, local_ranks()));
    ProcessGrid grid(MPI_COMM_WORLD, config.grid_shape(), config.run.comm_timeout);
    if (grid.tensor_group_spans_nodes() && grid.world_rank() == 0)
      std::fprintf(stderr, "meshtrain: warning: tensor-parallel groups span nodes (tp = %d, "
                   "%d rank(s) per node): every layer's all-reduce crosses the network; use "
                   "tp <= ranks per node, or order \"tp-...\"\n",
                   config.parallel.tp, grid.local_size());
    Trainer trainer(config, grid, backend);
    trainer.run();
    return kExitOk;
  });
}

}  // namespace meshtrain
