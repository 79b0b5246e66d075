#include <cstdio>

#include "meshtrain/app/commands.h"
#include "meshtrain/app/mpi_session.h"
#include "meshtrain/app/run_setup.h"
#include "meshtrain/train/stop_request.h"
#include "meshtrain/train/trainer.h"

namespace meshtrain {

int train_command(const TrainArgs& args) {
  MpiSession mpi;
  install_stop_handlers();
  return run_reporting_errors([&] {
    MpiCommunicator world(MPI_COMM_WORLD, "world");
    RunSetup run = setup_run(args.deck, args.overrides, world, Flight::Record);
    Trainer trainer(run.config, *run.grid, *run.backend);
    return trainer.run() == RunEnd::Stopped ? kExitRequeue : kExitOk;
  });
}

}  // namespace meshtrain
