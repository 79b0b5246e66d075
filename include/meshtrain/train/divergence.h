#pragma once
// A diverged run: the loss or the gradient norm stopped being finite. That is an outcome of
// training, not a bug and not bad input — the deck is valid, its optimisation settings did not
// hold — so it has its own exit status (kExitDiverged) and a message whose advice fits the
// deck: the learning rate it had, whether it warmed up, whether it clipped.

#include <stdexcept>
#include <string>

#include "meshtrain/config/config.h"

namespace meshtrain {

// Thrown by the same step on every rank (the loss it reports is reduced over the world), so
// one rank prints it.
class RunDiverged : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// "<deck>: the run diverged at step 12 (loss nan, gradient norm inf): lower train.lr (now
// 0.01, e.g. 0.005), ..." — only the advice that applies to this deck.
RunDiverged diverged(const Config& config, int step, double loss, double grad_norm);

}  // namespace meshtrain
