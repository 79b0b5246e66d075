#include <cstdio>
#include <cstdlib>

#include "meshtrain/app/commands.h"
#include "meshtrain/app/mpi_session.h"
#include "meshtrain/app/run_setup.h"
#include "meshtrain/comm/agreement.h"
#include "meshtrain/parallel/slowdown.h"
#include "meshtrain/train/stop_request.h"
#include "meshtrain/train/trainer.h"

namespace meshtrain {

int train_command(const TrainArgs& args) {
  // Before MPI_Init and every other start-up step: a SIGTERM from then on stops the run with
  // the requeue status instead of killing it (stop_request.h).
  install_stop_handlers();
  MpiSession mpi;
  return run_reporting_errors([&] {
    MpiCommunicator world(MPI_COMM_WORLD, "world");
    watch_stop_file(world);
    // An emulated slow device (tests, benchmarks): a bad value stops every rank with one message.
    agree(world, [&] {
      const char* spec = std::getenv("MESHTRAIN_SLOWDOWN");
      set_compute_slowdown(spec ? slowdown_for_rank(spec, world.rank()) : 1.0);
    });
    RunSetup run = setup_run(args.deck, args.overrides, world, Flight::Record);
    check_stop_during_startup(world, "setting up the device and the process grid");
    Trainer trainer(run.config, *run.grid, *run.backend);
    return trainer.run() == RunEnd::Stopped ? kExitRequeue : kExitOk;
  });
}

}  // namespace meshtrain
