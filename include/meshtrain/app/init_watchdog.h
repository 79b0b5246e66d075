#pragma once
// A bound on MPI_Init itself. run.comm_timeout bounds every blocking call from the moment the deck
// is read, but the deck is read after MPI_Init, and MPI_Init waits for every rank of the job (Open
// MPI's and MPICH's start-up exchange their addresses): a rank stopped or stalled before it joins
// (SIGSTOPped, swapped out, its node hung) kept the others inside PMPI_Init_thread for ever. The
// bound comes from the environment, MESHTRAIN_INIT_TIMEOUT (seconds; default run.comm_timeout's
// default, 600; 0: unbounded), since nothing else has been read yet. Not a bound on anything
// after MPI_Init: run.comm_timeout takes over from there.

#include <memory>
#include <string>

namespace meshtrain {

// MESHTRAIN_INIT_TIMEOUT's value from `text` (the variable's value, or null when unset): seconds,
// a finite number >= 0. Throws DeckError naming the variable, the value and what is accepted.
double init_timeout_seconds(const char* text);

// The rank the launcher gave this process, from its environment (before MPI_Init), or -1 when
// it was started alone.
int launched_rank();

// While alive, a thread ends the process with kExitTimeout once `seconds` pass (0: never),
// after printing which stage did not end and what that likely means. Disarmed by destruction.
class InitWatchdog {
 public:
  InitWatchdog(double seconds, std::string stage);
  ~InitWatchdog();
  InitWatchdog(const InitWatchdog&) = delete;
  InitWatchdog& operator=(const InitWatchdog&) = delete;

 private:
  struct State;
  std::shared_ptr<State> state_;  // shared with the thread, which returns once woken disarmed
};

}  // namespace meshtrain
