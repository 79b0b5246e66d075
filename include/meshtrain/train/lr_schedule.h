#pragma once
// Learning rate: linear warm-up from lr/warmup to lr over warmup_steps, then cosine decay to
// min_lr at the last step (Loshchilov & Hutter, SGDR, arXiv 1608.03983).

#include "meshtrain/config/config.h"

namespace meshtrain {

// The learning rate of 0-based optimizer step `step`.
double learning_rate(const TrainOptions& t, int step);

}  // namespace meshtrain
