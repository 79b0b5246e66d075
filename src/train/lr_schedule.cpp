#include "meshtrain/train/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace meshtrain {

double learning_rate(const TrainOptions& t, int step) {
  if (step < t.warmup_steps) return t.lr * (step + 1) / t.warmup_steps;
  const int decay_steps = std::max(1, t.steps - 1 - t.warmup_steps);
  const double progress = std::min(1.0, static_cast<double>(step - t.warmup_steps) / decay_steps);
  return t.min_lr + 0.5 * (t.lr - t.min_lr) * (1.0 + std::cos(M_PI * progress));
}

}  // namespace meshtrain
