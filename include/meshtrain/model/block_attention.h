#pragma once
// The attention sub-layer of a block that a ModelSpec picks (model/model_spec.h: attention):
// causal self-attention, multi-head or grouped-query (model/attention.h), or multi-head latent
// attention (model/latent_attention.h). As FeedForward is for the feed-forward: a new kind is a
// class with these members added to the variants below and to the constructor.

#include <string>
#include <variant>

#include "meshtrain/model/attention.h"
#include "meshtrain/model/cost_sheet.h"
#include "meshtrain/model/latent_attention.h"
#include "meshtrain/model/layer.h"
#include "meshtrain/model/model_spec.h"

namespace meshtrain {

class BlockAttention {
 public:
  using Saved = std::variant<CausalSelfAttention::Saved, LatentAttention::Saved>;

  BlockAttention(const LayerContext& ctx, const std::string& name, const ModelSpec& spec,
                 double residual_scale);

  // As CausalSelfAttention's.
  Tensor forward(const Tensor& x, TokenShape shape, Saved& saved, MemoryCategory category,
                 Recompute recompute, const Tensor* residual = nullptr);
  Tensor backward(const Tensor& dy, TokenShape shape, const Saved& saved,
                  DeferredWeightGradients* deferred = nullptr);
  void add_costs(CostSheet& sheet) const;
  // Generation's key/value cache (model/generator.h) exists for the standard kind only: null
  // for latent attention, which `sample` refuses.
  const CausalSelfAttention* standard() const { return std::get_if<CausalSelfAttention>(&layer_); }
  CausalSelfAttention* standard() { return std::get_if<CausalSelfAttention>(&layer_); }

 private:
  std::variant<CausalSelfAttention, LatentAttention> layer_;
};

}  // namespace meshtrain
