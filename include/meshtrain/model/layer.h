#pragma once
// What every layer is built with, and the shape of a micro-batch as layers see it.

#include <cstdint>

#include "meshtrain/backend/backend.h"
#include "meshtrain/model/expert_bias.h"
#include "meshtrain/model/expert_parallel.h"
#include "meshtrain/model/loss_accumulator.h"
#include "meshtrain/model/moe_log.h"
#include "meshtrain/model/parameter_store.h"
#include "meshtrain/model/recompute.h"
#include "meshtrain/model/ring_attention.h"
#include "meshtrain/model/tp_regions.h"

namespace meshtrain {

struct LayerContext {
  Backend* backend = nullptr;
  ParameterStore* store = nullptr;
  TensorParallel tp;
  ContextParallel cp;  // off unless parallel.cp > 1
  ExpertParallel ep;   // off unless parallel.ep > 1
  // Where a layer with a loss of its own (a mixture of experts' balancing losses) adds it, and
  // logs what it routed; null in models without one (and in tests of single layers).
  LossAccumulator* loss = nullptr;
  MoeLog* moe_log = nullptr;
  // The sigmoid router's per-expert bias, for choosing; null where there is none.
  const ExpertBias* expert_bias = nullptr;
};

// A micro-batch of B sequences of T tokens: N = B * T tokens in all; a sequence-parallel region
// of a rank holds tp.local_tokens(N) of them. Under context parallelism T is this rank's part
// of each sequence (ContextParallel: two chunks of it).
// document_starts (data.document_mask): int32 (N) on the device, each token's document start
// as a position in its whole sequence (Backend::attention_forward), built once per micro-batch
// by the data feed (train/document_starts.h); undefined without the mask. It travels with the
// shape because every layer that takes a micro-batch's shape, forward, backward and
// recomputation alike, is handed the one of that micro-batch.
// loss_weight: the weight of each of the micro-batch's tokens in the step's loss (the head's
// dloss, 1 / the step's tokens), with which a layer's own loss of the micro-batch enters it; 0
// in evaluation and generation, where no layer adds a loss.
struct TokenShape {
  int64_t B = 0, T = 0;
  Tensor document_starts;
  double loss_weight = 0;
  int64_t N() const { return B * T; }
  const Tensor* document_mask() const {
    return document_starts.defined() ? &document_starts : nullptr;
  }
};

// Per-row statistics (LayerNorm mean and rstd, softmax max and sum, losses) keep fp32 when
// activations are bf16: they are few, and their precision decides the result's.
inline DType stats_dtype(DType activations) {
  return activations == DType::BF16 || activations == DType::F16 ? DType::F32 : activations;
}

}  // namespace meshtrain
