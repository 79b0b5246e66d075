#pragma once
// What every layer is built with (the shape of a micro-batch as layers see it: token_shape.h).

#include <cstdint>

#include "meshtrain/backend/backend.h"
#include "meshtrain/model/expert_bias.h"
#include "meshtrain/model/expert_parallel.h"
#include "meshtrain/model/loss_accumulator.h"
#include "meshtrain/model/moe_log.h"
#include "meshtrain/model/qk_clip.h"
#include "meshtrain/model/parameter_store.h"
#include "meshtrain/model/recompute.h"
#include "meshtrain/model/ring_attention.h"
#include "meshtrain/model/token_shape.h"
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
  // Where attention records its heads' largest logits for QK-clip (model/qk_clip.h); null, or
  // off, unless train.qk_clip_threshold > 0.
  QkLogitLog* qk_log = nullptr;
};

// Per-row statistics (LayerNorm mean and rstd, softmax max and sum, losses) keep fp32 when
// activations are bf16: they are few, and their precision decides the result's.
inline DType stats_dtype(DType activations) {
  return activations == DType::BF16 || activations == DType::F16 ? DType::F32 : activations;
}

}  // namespace meshtrain
