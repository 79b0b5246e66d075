#pragma once
// A pre-norm transformer block of four named sub-layers, each the variant the ModelSpec picks
// (model/norm.h, model/feed_forward.h):
//   x2  = x  + attention(attention_norm(x))          (GPT-2: attn, ln_1)
//   out = x2 + feed_forward(feed_forward_norm(x2))   (GPT-2: mlp, ln_2)
// With Recompute::Full only x is kept; backward re-runs the forward into temporaries first.

#include <string>

#include "meshtrain/model/block_attention.h"
#include "meshtrain/model/feed_forward.h"
#include "meshtrain/model/layer.h"
#include "meshtrain/model/model_spec.h"
#include "meshtrain/model/norm.h"

namespace meshtrain {

class Block {
 public:
  struct Saved {
    Tensor x;  // (N_local, C), the block input
    Norm::Saved attention_norm;
    BlockAttention::Saved attention;
    Norm::Saved feed_forward_norm;  // its input is x2
    FeedForward::Saved feed_forward;
  };

  // Its parameters are named "h.<index>.<sub-layer>..." with GPT-2's sub-layer names.
  Block(const LayerContext& ctx, int index, const ModelSpec& spec);
  // The same named "<prefix>.<sub-layer>...", as layer `index` of the spec (which picks its
  // feed-forward): a multi-token prediction depth's block (model/mtp_module.h).
  Block(const LayerContext& ctx, const std::string& prefix, int index, const ModelSpec& spec);

  // x (N_local, C) -> (N_local, C) in Activations; saved according to `recompute`.
  Tensor forward(const Tensor& x, TokenShape shape, Saved& saved, Recompute recompute);
  // Returns dx (N_local, C).
  // deferred: where the weight gradients go (model/weight_gradients.h); null: computed now.
  Tensor backward(const Tensor& dout, TokenShape shape, Saved& saved, Recompute recompute,
                  DeferredWeightGradients* deferred = nullptr);
  // Generation: one token x (1, C) at `position` through the block, attending to (and
  // extending) this layer's cache (BlockAttention::decode). Keeps nothing.
  Tensor decode(const Tensor& x, DecodeCache& cache, int64_t position);
  const BlockAttention& attention() const { return attention_; }
  BlockAttention& attention() { return attention_; }
  // Its layers' sheets and the two residual adds (model/cost_sheet.h).
  CostSheet cost_sheet() const;

 private:
  // recomputing: backward's re-run of a forward already counted (model/moe_layer.h).
  Tensor forward_all(const Tensor& x, TokenShape shape, Saved& saved, MemoryCategory inner,
                     Recompute recompute, bool recomputing);

  LayerContext ctx_;
  Norm attention_norm_;
  BlockAttention attention_;
  Norm feed_forward_norm_;
  FeedForward feed_forward_;
};

}  // namespace meshtrain
