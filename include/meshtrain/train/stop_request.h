#pragma once
// Graceful stop on a signal. Slurm warns a job before its time limit (sbatch
// --signal=B:USR1@<seconds>, forwarded to the ranks by the job script) and sends SIGTERM on
// preemption or scancel. The handler only sets a flag; after every step the ranks agree on it
// (one scalar all-reduce, since a signal may reach them in different steps), finish the step,
// write a checkpoint, and exit with kExitRequeue so that the job script requeues the job and
// the next run resumes from that checkpoint.

namespace meshtrain {

// Installs handlers for SIGUSR1 and SIGTERM (idempotent).
void install_stop_handlers();
// The signal received so far (0: none).
int stop_signal();
const char* signal_name(int sig);

}  // namespace meshtrain
