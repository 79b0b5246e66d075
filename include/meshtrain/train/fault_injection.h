#pragma once
// Fault injection for tests of the failure paths: environment variable MESHTRAIN_FAULT, a
// comma-separated list of faults, each "<kind>:rank=<world rank>:step=<step>":
//   stall   the rank stops making progress (sleeps) at the start of that step
//   exit    the rank exits with status 9, as a crashed process would, one second into that
//           step: the others are then waiting for it, as they are when a rank dies mid-step.
//           Exiting at the very start raced with the launcher, which may kill the others while
//           they still compute, between two operations, where no record shows anyone waiting
//           (MPICH's Hydra kills within milliseconds; under it diagnose_test failed now and then).
// and the checkpointer's "checkpoint_kill:<phase>[@<step>]" (see train/checkpointer.h).
// Unset in production; parsing errors are reported, not ignored.

#include <string>

namespace meshtrain {

// Called by the trainer at the start of every step (1-based step about to run).
void inject_faults(int world_rank, int step);

}  // namespace meshtrain
