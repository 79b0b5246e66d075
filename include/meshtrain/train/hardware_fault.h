#pragma once
// A hardware fault the trainer found itself: silent data corruption, seen as copies of the same
// parameters that stopped being equal (train/replica_check.h) or as a step whose re-run on the
// same data and parameters gave other results (train/step_rerun.h). Neither bad input nor a
// diverged run: the deck and the data are fine, a machine is not; so it has its own exit status
// (kExitHardwareFault), and its message names the ranks and nodes to leave out.

#include <stdexcept>
#include <string>

namespace meshtrain {

// Thrown by every rank with the same message (each builds it from the same gathered facts), so
// one rank prints it.
class HardwareFault : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace meshtrain
