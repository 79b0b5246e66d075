#include <cstdio>
#include <cstdlib>

#include "meshtrain/app/commands.h"
#include "meshtrain/app/mpi_session.h"
#include "meshtrain/app/run_setup.h"
#include "meshtrain/comm/agreement.h"
#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/parallel/parameter_server.h"
#include "meshtrain/parallel/slowdown.h"
#include "meshtrain/train/parameter_client.h"
#include "meshtrain/train/stop_request.h"
#include "meshtrain/train/trainer.h"

namespace meshtrain {

namespace {

// A parameter server's whole run (parallel/parameter_server.h).
int serve_parameters(RunSetup& run) {
  int index = 0;
  MPI_Comm_rank(run.servers, &index);
  const ServerOptions o = server_options(run.config, index);
  ParameterServer server(run.server_channel, run.servers, *run.backend, o);
  return server.run();
}

// On worker 0 of an asynchronous run: tells the servers the run is over, on every way out.
struct EndServers {
  explicit EndServers(const RunSetup& run) : run_(run) {}
  ~EndServers() {
    if (!run_.config.parallel.async() || run_.grid->world_rank() != 0) return;
    ParameterClient::shutdown(run_.server_channel, run_.grid->world_size(), run_.config.parallel.servers,
                              status, run_.config.run.comm_timeout);
  }
  const RunSetup& run_;
  int status = kExitInput;  // unless the run ends
};

}  // namespace

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
    if (run.is_server()) {
      publish_flight_records(run, world);
      return serve_parameters(run);
    }
    // Worker 0 ends the servers' run with the workers' status, whatever ends the workers'.
    EndServers end_servers(run);
    Trainer trainer(run.config, *run.grid, *run.backend);
    if (run.config.parallel.async()) trainer.attach_servers(run.server_channel);
    trainer.on_started([&] { publish_flight_records(run, world); });
    const int status = trainer.run() == RunEnd::Stopped ? kExitRequeue : kExitOk;
    end_servers.status = status;
    return status;
  });
}

}  // namespace meshtrain
