#pragma once
// The shape of a micro-batch as every layer and any model family's stage see it. A header of
// its own so that what parallel/ sees of a model (pipeline_stage.h, micro_batch.h) reaches no
// layer's header.

#include <cstdint>

#include "meshtrain/tensor/tensor.h"

namespace meshtrain {

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

}  // namespace meshtrain
