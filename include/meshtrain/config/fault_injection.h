#pragma once
// Fault injection for tests of the failure paths: environment variable MESHTRAIN_FAULT, a
// comma-separated list of faults:
//   stall:rank=<world rank>:step=<step>
//           the rank stops making progress (sleeps) at the start of that step
//   exit:rank=<world rank>:step=<step>
//           the rank exits with status 9, as a crashed process would, one second into that
//           step: the others are then waiting for it, as they are when a rank dies mid-step.
//           Exiting at the very start raced with the launcher, which may kill the others while
//           they still compute, between two operations, where no record shows anyone waiting
//           (MPICH's Hydra kills within milliseconds; under it diagnose_test failed now and then).
//   checkpoint_kill:<phase>[@<step>]
//           world rank 0 raises SIGKILL in that phase of writing a checkpoint (of <step>, or
//           any); the phases are described in checkpoint/checkpointer.h.
//   checkpoint_stall:<phase>[@<step>]:rank=<world rank>
//           that rank stops making progress (sleeps, until killed) in that phase of writing a
//           checkpoint: in 'data', halfway through the datasets, before one is written, while
//           the others go on into the write (collective I/O: into MPI-IO, where no
//           communicator's timeout reaches; comm/blocking_watchdog.h is what ends the job).
// This file is the one parser of the variable; the trainer injects the first two kinds, the
// checkpointer the others. Unset in production; parsing errors are reported, not ignored.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace meshtrain {

// Where in writing a checkpoint checkpoint_kill strikes.
enum class CheckpointPhase { Data, Rename, Prune };
std::string_view checkpoint_phase_name(CheckpointPhase phase);  // "data", "rename", "prune"

struct Fault {
  enum class Kind { Stall, Exit, CheckpointKill, CheckpointStall };
  Kind kind = Kind::Stall;
  int rank = -1;       // stall, exit, checkpoint_stall: the world rank that fails
  int64_t step = -1;   // stall, exit: the 1-based step; checkpoint_kill: the checkpoint's, -1 any
  CheckpointPhase phase = CheckpointPhase::Data;  // checkpoint_kill and checkpoint_stall
};

// Parses a MESHTRAIN_FAULT value. Throws DeckError naming the item that does not parse and the
// syntax expected.
std::vector<Fault> parse_faults(const std::string& text);
// The faults MESHTRAIN_FAULT asks for (none when it is unset), parsed once per process.
const std::vector<Fault>& requested_faults();

// Called by the trainer at the start of every step (1-based step about to run): carries out
// the stall and exit faults of this rank and step.
void inject_faults(int world_rank, int step);

}  // namespace meshtrain
