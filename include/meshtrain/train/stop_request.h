#pragma once
// Graceful stop on a signal. Slurm warns a job before its time limit (sbatch
// --signal=B:USR1@<seconds>, forwarded to the ranks by the job script) and sends SIGTERM on
// preemption or scancel. The handler only sets a flag; after every step the ranks agree on it
// (one scalar all-reduce, since a signal may reach them in different steps), finish the step,
// write a checkpoint, and exit with kExitRequeue so that the job script requeues the job and
// the next run resumes from that checkpoint.
//
// Start-up (device, grid, model initialisation, data generation and verification, loading the
// checkpoint to resume from) can take minutes, longer than Slurm's KillWait (30 s by default)
// between SIGTERM and SIGKILL. The handlers are installed before it, and the ranks agree on the
// flag between its steps (check_stop_during_startup); a step that can take long on its own
// (generating the synthetic corpus) polls the flag. Stopping then needs no checkpoint: no step
// was taken since the one the run resumed from, so the job exits at once with kExitRequeue.

#include <stdexcept>

#include "meshtrain/comm/communicator.h"

namespace meshtrain {

// Installs handlers for SIGUSR1 and SIGTERM (idempotent).
void install_stop_handlers();
// The signal received so far (0: none).
int stop_signal();
const char* signal_name(int sig);

// Thrown on every rank when the ranks agree that a stop signal arrived during start-up.
class StopDuringStartup : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Collective over `world`: throws StopDuringStartup, saying which signal arrived and which
// start-up step (`after`, e.g. "the model's initialisation") was the last completed, if any
// rank received a stop signal.
void check_stop_during_startup(Communicator& world, const char* after);

}  // namespace meshtrain
