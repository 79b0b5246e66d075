#pragma once
// Deterministic compute slowdown, for tests and benchmarks of mixed and straggling hardware
// (not for production runs): a rank told to be FACTOR times slower pads every compute action of
// the pipeline executor (a chunk's forward or backward) by sleeping (FACTOR - 1) x the action's
// measured duration, and counts the padded time as compute (PipelineStats::compute_seconds).
//
// Sleeping emulates a slower device that the host waits for. Repeating the kernels instead would
// also slow the rank down, but where the ranks of a machine share its cores (every test here),
// the slowed rank would take cores from the others and slow them too; a sleeping rank takes none.
//
// The setting is process-wide: one number, 1 (no slowdown) unless set. `meshtrain train` sets it
// at start-up from the environment variable
//   MESHTRAIN_SLOWDOWN="RANK:FACTOR[,RANK:FACTOR...]"
// where RANK is a world rank or "*" (every rank not named otherwise) and FACTOR a real >= 1,
// e.g. "2:3" (rank 2 three times slower) or "*:1.5,0:1" (all but rank 0 half as fast again).
// Benchmarks call set_compute_slowdown() directly.

#include <string>

namespace meshtrain {

// This process's factor (>= 1; 1: no slowdown).
void set_compute_slowdown(double factor);
double compute_slowdown();

// The factor `spec` (the MESHTRAIN_SLOWDOWN syntax above) gives `world_rank`; 1 for an empty
// spec or a rank it does not name. Throws std::invalid_argument naming MESHTRAIN_SLOWDOWN, the
// value and what is accepted.
double slowdown_for_rank(const std::string& spec, int world_rank);

// After a compute action of `seconds`: sleeps (factor - 1) x seconds on a slowed process and
// returns the padded duration: `seconds` plus the time slept (about factor x seconds; `seconds`
// itself where there is no slowdown).
double pad_compute(double seconds);

}  // namespace meshtrain
