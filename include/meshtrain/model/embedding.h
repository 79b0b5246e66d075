#pragma once
// Token embedding wte (V, C), vocabulary-parallel: rank r of the tensor group holds rows
// [r V/tp, (r+1) V/tp) and contributes zeros for other tokens; the partial embeddings are
// summed across the group (reduce-scattered along tokens under sequence parallelism). Learned
// position embedding wpe (T, C), replicated, is then added to this rank's tokens (under context
// parallelism at their places in the whole sequence: model/ring_attention.h).

#include "meshtrain/model/cost_sheet.h"
#include "meshtrain/model/layer.h"
#include "meshtrain/model/weight_gradients.h"

namespace meshtrain {

class Embedding {
 public:
  // learned_positions false: no wpe (rotary positions act in attention instead).
  // tied: the head multiplies by wte (the PaLM 6N term counts it once, here); untied, wte is
  // only looked up, and the head's own weight is the one that multiplies.
  Embedding(const LayerContext& ctx, int64_t vocab_size, int64_t seq_len, int64_t C,
            bool learned_positions = true, bool tied = true);

  // tokens (N) int32 -> x (N_local, C) in Activations.
  Tensor forward(const Tensor& tokens, TokenShape shape);
  // dx (N_local, C): accumulates the wte and wpe gradients.
  // The gradient sums now, or kept in `deferred` (the collective under sequence parallelism
  // still runs now, in the same order on every rank of the group).
  void backward(const Tensor& dx, const Tensor& tokens, TokenShape shape,
                DeferredWeightGradients* deferred = nullptr);
  // Generation: tokens (n) int32 at positions [position, position + n) of one sequence ->
  // x (n, C), whole on every rank of the tensor group (never sequence-parallel).
  Tensor forward_at(const Tensor& tokens, int64_t position);

  Parameter& wte() { return wte_; }
  // Its tables and its lookup (model/cost_sheet.h).
  CostSheet cost_sheet() const;

 private:
  LayerContext ctx_;
  Parameter& wte_;
  Parameter* wpe_;  // null: no learned positions
  bool tied_;
};

}  // namespace meshtrain
