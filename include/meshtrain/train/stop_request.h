#pragma once
// Graceful stop on request. Slurm warns a job before its time limit (sbatch
// --signal=B:USR1@<seconds>) and sends SIGTERM on preemption or scancel. A request is a signal
// (SIGUSR1, SIGTERM) or the appearance of a stop file (MESHTRAIN_STOP_FILE, watched by world
// rank 0). The job scripts use the file: a signal forwarded to the ranks can reach one before
// its handler exists (while the loader still maps the libraries), kill it, and leave the others
// waiting in MPI_Init; a file cannot be missed, however early it appears. The handler only sets
// a flag; after every step the ranks agree on the request (one scalar all-reduce, since it may
// reach them in different steps), finish the step, write a checkpoint, and exit with
// kExitRequeue so that the job script requeues the job and the next run resumes from that
// checkpoint.
//
// Start-up (device, grid, model initialisation, data generation and verification, loading the
// checkpoint to resume from) can take minutes, longer than Slurm's KillWait (30 s by default)
// between SIGTERM and SIGKILL. The handlers are installed before it, and the ranks agree on the
// request between its steps (check_stop_during_startup); a step that can take long on its own
// (generating the synthetic corpus) polls it. Stopping then needs no checkpoint: no step was
// taken since the one the run resumed from, so the job exits at once with kExitRequeue.

#include <stdexcept>
#include <string>

#include "meshtrain/comm/communicator.h"

namespace meshtrain {

// The environment variable naming the stop file.
inline constexpr const char* kStopFileVariable = "MESHTRAIN_STOP_FILE";
// stop_request()'s code for the stop file (above every signal number, so that an all-reduce
// Max of the ranks' codes is a request whenever any rank has one).
inline constexpr int kStopFileRequest = 1000;

// Installs handlers for SIGUSR1 and SIGTERM (idempotent).
void install_stop_handlers();
// Reads kStopFileVariable on every rank of `world` and agrees on it: throws AgreedError where it
// is set but its directory does not exist (the file could never appear), is not writable (the
// run could not remove the file it stopped on), or where the path names something that is not
// a file (a directory: it would stop every start, and a requeued job forever). World rank 0 then
// watches the file; the other ranks learn of it through the agreement on the request.
void watch_stop_file(Communicator& world);
// The request so far: a signal number, kStopFileRequest, or 0 for none. Each call on world
// rank 0 stats the stop file: one metadata operation per step, on one rank of the job, is
// nothing even on a parallel file system, and a rate limit would let a fast run finish before
// it looked.
int stop_request();
// Removes the stop file once the run stops on it (world rank 0; nothing elsewhere), so that the
// restarted job (a Kubernetes restart, a requeue by a script that does not remove it) does not
// stop again at once.
void consume_stop_file();
// "SIGUSR1", "SIGTERM", or "the stop file <path>".
std::string stop_reason(int request);

// Thrown on every rank when the ranks agree that a stop was requested during start-up.
class StopDuringStartup : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Collective over `world`: throws StopDuringStartup, saying what asked for the stop and which
// start-up step (`after`, e.g. "the model's initialisation") was the last completed, if any
// rank has a request.
void check_stop_during_startup(Communicator& world, const char* after);

}  // namespace meshtrain
