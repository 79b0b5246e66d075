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
//   flip_param:rank=<r>:step=<s>[:param=<name>][:index=<i>][:bit=<b>]
//           silent data corruption of memory: after step s's update, the rank flips bit b
//           (default 0, the lowest mantissa bit: invisible in the loss) of element i (default 0)
//           of its slice of the parameter (default: its first), in every copy of it that rank
//           holds (the layers' values and the optimizer's master weights). The replica check
//           (run.replica_check_every) must find it.
//   flip_grad:rank=<r>:step=<s>[:index=<i>][:bit=<b>]
//           silent data corruption of a computation: on the first attempt of step s only, after
//           its backward and reductions, the rank flips bit b (default 30, the top exponent bit
//           of an fp32 value: a small gradient becomes ~1e38 times larger) of element i (default
//           0) of the gradient elements its share of the gradient norm counts. The step's
//           re-run (train/step_rerun.h) must tell it from a divergence and name the rank.
//   checkpoint_stall:<phase>[@<step>]:rank=<world rank>
//           that rank stops making progress (sleeps, until killed) in that phase of writing a
//           checkpoint: in 'data', halfway through the datasets, before one is written, while
//           the others go on into the write (collective I/O: into MPI-IO, where no
//           communicator's timeout reaches; comm/blocking_watchdog.h is what ends the job).
// This file is the one parser of the variable; the trainer injects the stall, exit and flip
// kinds, the checkpointer checkpoint_kill and checkpoint_stall. Unset in production; parsing
// errors are reported, not ignored.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace meshtrain {

// Where in writing a checkpoint checkpoint_kill strikes.
enum class CheckpointPhase { Data, Rename, Prune };
std::string_view checkpoint_phase_name(CheckpointPhase phase);  // "data", "rename", "prune"

struct Fault {
  enum class Kind { Stall, Exit, CheckpointKill, CheckpointStall, FlipParam, FlipGrad };
  Kind kind = Kind::Stall;
  int rank = -1;       // stall, exit, checkpoint_stall, flips: the world rank that fails
  int64_t step = -1;   // stall, exit, flips: the 1-based step; checkpoint_kill: the checkpoint's, -1 any
  CheckpointPhase phase = CheckpointPhase::Data;  // checkpoint_kill and checkpoint_stall
  std::string param;   // flip_param: the parameter's name; "" its first
  int64_t index = 0;   // flips: the element of the slice (or of the gradient)
  int bit = 0;         // flips: the bit of that element, 0 the lowest
};

// Parses a MESHTRAIN_FAULT value. Throws DeckError naming the item that does not parse and the
// syntax expected.
std::vector<Fault> parse_faults(const std::string& text);
// The faults MESHTRAIN_FAULT asks for (none when it is unset), parsed once per process.
const std::vector<Fault>& requested_faults();

// Called by the trainer at the start of every step (1-based step about to run): carries out
// the stall and exit faults of this rank and step.
void inject_faults(int world_rank, int step);
// The flip faults of `kind` for this rank and step (none when MESHTRAIN_FAULT asks for none).
std::vector<Fault> flips_at(Fault::Kind kind, int world_rank, int step);

}  // namespace meshtrain
