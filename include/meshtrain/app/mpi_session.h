#pragma once
// MPI for the lifetime of a command: initialised once (even on one rank, so that every code path
// is the MPI one), finalised on scope exit. Also the uniform error reporting of commands.

#include <mpi.h>

#include <exception>
#include <functional>

namespace meshtrain {

class MpiSession {
 public:
  MpiSession(int* argc = nullptr, char*** argv = nullptr);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  int rank() const { return rank_; }
  int size() const { return size_; }

 private:
  int rank_ = 0, size_ = 1;
};

// Runs a command body, turning exceptions into exit statuses (commands.h): errors every rank
// agrees on are printed once (by rank 0) and exit with kExitInput, a diverged run with
// kExitDiverged, a hardware fault the trainer found (train/hardware_fault.h) with
// kExitHardwareFault; a communication timeout, memory exhausted, or an unexpected error on one rank
// is printed with that rank's name and aborts the whole job.
int run_reporting_errors(const std::function<int()>& body);

// For commands one rank does alone (export, import): world rank 0 runs `work`, prints an
// exception as "meshtrain: error: ..." and exits kExitInput; every rank returns rank 0's status,
// so a job of many ranks agrees on it.
int run_on_rank_zero(const std::function<void()>& work);

}  // namespace meshtrain
