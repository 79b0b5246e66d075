#pragma once
// The head: final norm (the spec's kind), vocabulary-parallel logits (N, V/tp) and softmax cross-entropy that
// never gathers the full vocabulary (see backend/cpu/cross_entropy.cpp for the math).
//
// In training the head runs its own backward immediately after the loss: the (N, V/tp) logits
// become their gradient in place, the weight gradient is accumulated, and only the gradient
// with respect to the head's input (N_local, C) is kept for the pipeline's backward pass. A
// stage then never holds logits of more than one micro-batch, whatever the schedule.

#include "meshtrain/model/layer.h"
#include "meshtrain/model/norm.h"
#include "meshtrain/model/loss_accumulator.h"
#include "meshtrain/model/mtp_module.h"

namespace meshtrain {

class LanguageModelHead {
 public:
  struct Saved {
    Tensor dx;  // (N_local, C): gradient with respect to the head's input
  };

  // weight: the (V/tp, C) slice of the output embedding (wte itself when tied on this rank).
  // mtp: the multi-token prediction depths run inside a training forward (null: none).
  LanguageModelHead(const LayerContext& ctx, int64_t C, const NormSpec& norm, Parameter& weight,
                    MultiTokenPrediction* mtp = nullptr);

  // Adds the sum over the micro-batch's N tokens of the cross-entropy to `loss` (on the device:
  // nothing waits for it here). With `saved`, also the backward pass for d(loss)/d(logit)
  // scaled by `dloss` (1 / tokens in the global batch).
  void forward(const Tensor& x, const Tensor& targets, TokenShape shape, double dloss,
               Saved* saved, LossAccumulator& loss);
  Tensor backward(Saved& saved);
  // Generation: this rank's slice of the logits, (N, V / tp) for vocabulary ids from
  // vocab_begin(), of x (N, C) whole on every rank (never sequence-parallel).
  Tensor logits(const Tensor& x);
  int64_t vocab_begin() const { return weight_.split_begin; }
  // The final norm, the logits' GEMM and the cross-entropy over them (model/cost_sheet.h), and
  // the multi-token prediction depths'.
  CostSheet cost_sheet() const;

 private:
  LayerContext ctx_;
  Norm ln_f_;
  Parameter& weight_;
  MultiTokenPrediction* mtp_;
};

}  // namespace meshtrain
