#pragma once
// Softmax cross-entropy of rows against the vocabulary-parallel output embedding, never gathering
// the full vocabulary (see backend/cpu/cross_entropy.cpp for the math): the language-model head's
// (model/lm_head.h) and each multi-token prediction depth's (model/mtp_module.h), which share
// the head's weight. Not the final norm or the tensor-region boundaries: the callers own those.

#include "meshtrain/model/layer.h"
#include "meshtrain/model/loss_accumulator.h"
#include "meshtrain/model/parameter.h"

namespace meshtrain {

// hin (R, C): rows whole on every tensor rank; targets (R) int32, each a vocabulary id; weight:
// this rank's (V/tp, C) slice. Adds the sum of the R per-row losses to `loss` (on the device).
// With `train`, also runs the backward at once: accumulates weight's gradient and returns
// d(loss)/d(hin) (R, C) scaled by `dloss` (this rank's part, to be summed over the tensor group
// by the caller's region boundary); without, returns an empty tensor. The (R, V/tp) logits live
// only inside the call.
Tensor vocab_cross_entropy(const LayerContext& ctx, Parameter& weight, const Tensor& hin,
                           const Tensor& targets, double dloss, bool train, LossAccumulator& loss);

}  // namespace meshtrain
