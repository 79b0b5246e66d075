// `meshtrain eval DECK --checkpoint PATH`: the validation loss of a checkpoint, on whatever
// layout the deck (and --set) gives; checkpoints are layout-free, so it need not be the one
// that wrote it.

#include <cstdio>

#include "meshtrain/app/commands.h"
#include "meshtrain/app/mpi_session.h"
#include "meshtrain/app/run_setup.h"
#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/comm/mpi_communicator.h"
#include "meshtrain/config/deck_error.h"
#include "meshtrain/checkpoint/checkpointer.h"
#include "meshtrain/train/trainer.h"

namespace meshtrain {

int eval_command(const EvalArgs& args) {
  MpiSession mpi;
  return run_reporting_errors([&] {
    MpiCommunicator world(MPI_COMM_WORLD, "world");
    RunSetup run = setup_run(args.deck, args.overrides, world);
    const Config& config = run.config;
    ProcessGrid& grid = *run.grid;
    if (!config.data.has_val())
      throw DeckError(config.deck_path + ": data.val = \"none\": eval needs validation data "
                      "(data.val = \"synthetic\" or token shards)");
    Trainer trainer(config, grid, *run.backend);
    Checkpointer checkpointer(config, grid);
    const CheckpointStats loaded = checkpointer.load(trainer.state(), args.checkpoint);
    const double val = trainer.evaluate();
    if (grid.world_rank() == 0) {
      std::printf("checkpoint %s: step %lld, layout %s, %d eval batch(es) of %d sequences\n",
                  loaded.path.c_str(), static_cast<long long>(loaded.step),
                  describe_layout(config).c_str(), config.train.eval_batches, config.train.global_batch);
      std::printf("val_loss %.*f\n", args.digits, val);
      std::fflush(stdout);
    }
    return kExitOk;
  });
}

}  // namespace meshtrain
