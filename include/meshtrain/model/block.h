#pragma once
// A pre-LN transformer block (GPT-2):
//   x2  = x  + attn(ln_1(x))
//   out = x2 + mlp(ln_2(x2))
// With Recompute::Full only x is kept; backward re-runs the forward into temporaries first.

#include <string>

#include "meshtrain/model/attention.h"
#include "meshtrain/model/layer.h"
#include "meshtrain/model/layernorm.h"
#include "meshtrain/model/mlp.h"

namespace meshtrain {

class Block {
 public:
  struct Saved {
    Tensor x;  // (N_local, C), the block input
    LayerNorm::Saved ln_1;
    CausalSelfAttention::Saved attn;
    LayerNorm::Saved ln_2;  // its input is x2
    Mlp::Saved mlp;
  };

  Block(const LayerContext& ctx, int index, int64_t C, int64_t heads, int layers);

  // x (N_local, C) -> (N_local, C) in Activations; saved according to `recompute`.
  Tensor forward(const Tensor& x, TokenShape shape, Saved& saved, Recompute recompute);
  // Returns dx (N_local, C).
  // deferred: where the weight gradients go (model/weight_gradients.h); null: computed now.
  Tensor backward(const Tensor& dout, TokenShape shape, Saved& saved, Recompute recompute,
                  DeferredWeightGradients* deferred = nullptr);
  // Generation: one token x (1, C) at `position` through the block, attending to (and
  // extending) this layer's key/value cache (CausalSelfAttention::decode). Keeps nothing.
  Tensor decode(const Tensor& x, Tensor& k_cache, Tensor& v_cache, int64_t position);
  const CausalSelfAttention& attention() const { return attn_; }
  // Its layers' sheets and the two residual adds (model/cost_sheet.h).
  CostSheet cost_sheet() const;

 private:
  Tensor forward_all(const Tensor& x, TokenShape shape, Saved& saved, MemoryCategory inner,
                     Recompute recompute);

  LayerContext ctx_;
  LayerNorm ln_1_;
  CausalSelfAttention attn_;
  LayerNorm ln_2_;
  Mlp mlp_;
};

}  // namespace meshtrain
