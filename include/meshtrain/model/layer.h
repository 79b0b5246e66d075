#pragma once
// What every layer is built with, and the shape of a micro-batch as layers see it.

#include <cstdint>

#include "meshtrain/backend/backend.h"
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
};

// A micro-batch of B sequences of T tokens: N = B * T tokens in all; a sequence-parallel region
// of a rank holds tp.local_tokens(N) of them. Under context parallelism T is this rank's part
// of each sequence (ContextParallel: two chunks of it).
// document_starts (data.document_mask): int32 (N) on the device, each token's document start
// as a position in its whole sequence (Backend::attention_forward), built once per micro-batch
// by the data feed (train/document_starts.h); undefined without the mask. It travels with the
// shape because every layer that takes a micro-batch's shape, forward, backward and
// recomputation alike, is handed the one of that micro-batch.
struct TokenShape {
  int64_t B = 0, T = 0;
  Tensor document_starts;
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
