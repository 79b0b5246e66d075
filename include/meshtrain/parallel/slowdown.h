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

// What PaddedCompute pads a slowed action to: factor x its elapsed time (MESHTRAIN_SLOWDOWN's
// stragglers, slower than ranks that share the same cores under the same contention), or factor
// x the CPU time the action took (emulated devices: every rank slowed alike so that ranks
// outnumbering the cores fit on them, each as if it had a device of its own; see PaddedCompute).
enum class PaddingBasis { Elapsed, CpuTime };

// This process's factor (>= 1; 1: no slowdown), and the basis of its padding.
void set_compute_slowdown(double factor, PaddingBasis basis = PaddingBasis::Elapsed);
double compute_slowdown();

// Emulated devices whose every action takes the same time: while `seconds` > 0, PaddedCompute
// pads each compute action to `seconds` of elapsed time, whatever the factor (0 turns it off).
// The zero-bubble schedules are planned on such a clock (F = I = W); benchmarks use it to
// measure how near the executor comes to a schedule's own bubble, apart from the spread of the
// emulated actions' costs. An action that takes longer than `seconds` is not cut short; it is
// counted (fixed_compute_overruns), so that a benchmark can say its clock did not hold.
void set_fixed_compute_time(double seconds);
double fixed_compute_time();
long fixed_compute_overruns();  // since the process started

// The factor `spec` (the MESHTRAIN_SLOWDOWN syntax above) gives `world_rank`; 1 for an empty
// spec or a rank it does not name. Throws std::invalid_argument naming MESHTRAIN_SLOWDOWN, the
// value and what is accepted.
double slowdown_for_rank(const std::string& spec, int world_rank);

// After a compute action of `seconds`: sleeps (factor - 1) x seconds on a slowed process and
// returns the padded duration: `seconds` plus the time slept (about factor x seconds; `seconds`
// itself where there is no slowdown).
double pad_compute(double seconds);

// Times one compute action, made before it; finish() after it pads the action on a slowed
// process (sleeping what is missing) and returns the action's duration, padded; without a
// slowdown, the elapsed time, nothing slept. Under PaddingBasis::CpuTime the padding is to
// factor x the CPU time the calling thread spent in the action: where ranks share cores, an
// action that waited for a core would otherwise be stretched factor-fold for the wait too, and an
// emulated device's speed would depend on what the other ranks did (bench --suite pipeline, 4
// ranks on 2 cores: the ranks' compute differed by 2-16% padded on elapsed time, 1-5% on CPU
// time). On a multi-threaded backend the calling thread's CPU time stands for the team's: it
// takes part in every parallel region.
class PaddedCompute {
 public:
  PaddedCompute();
  double finish();

 private:
  double factor_, fixed_;
  bool cpu_basis_;
  double wall_start_, cpu_start_;
};

}  // namespace meshtrain
