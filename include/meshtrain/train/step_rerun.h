#pragma once
// A step that looks like divergence — a NaN or infinite loss or gradient norm, or a gradient norm
// run.rerun_spike_factor times the median of the recent steps' — is run again on the same data
// from the same parameters before anything is decided (after Megatron's re-run machinery). The
// decision comes before the optimizer update, so only the gradients and the loss (which the
// re-run recomputes) have changed; the data of a step is a function of (seed, step) and the
// model has no random masks, so healthy hardware gives the same bits twice. Then:
//   - a rank whose loss or gradient differs between the two attempts has a hardware fault: the
//     job stops naming it (HardwareFault), the step not applied;
//   - the same bits everywhere: a real divergence (non-finite: RunDiverged as before), or a real
//     spike, which training takes (gradient clipping bounds it).

#include <cstdint>
#include <deque>
#include <string>

#include "meshtrain/config/config.h"
#include "meshtrain/parallel/process_grid.h"

namespace meshtrain {

// What one attempt of a step gave on this rank: its own loss sum (before the world's) and a hash
// of its gradients (after the reductions).
struct StepAttempt {
  double local_loss = 0;
  uint64_t gradient_hash = 0;
};

// Collective over the world: throws HardwareFault, the same on every rank, when any rank's two
// attempts of step `step` (1-based) differ; `why` says why the step was re-run.
void compare_attempts(const Config& config, ProcessGrid& grid, int step, const std::string& why,
                      const StepAttempt& first, const StepAttempt& second);

// The gradient norms of the last steps taken (every rank the same: the norm is the world's).
class GradNormHistory {
 public:
  static constexpr size_t kWindow = 20;  // steps in the median
  static constexpr size_t kMinimum = 5;  // fewer: no spike is called (the first steps move fast)
  void add(double norm);
  // Whether `norm` exceeds `factor` (> 1; 0 never) times the median of the window.
  bool spike(double norm, double factor) const;
  double median() const;

 private:
  std::deque<double> norms_;
};

}  // namespace meshtrain
