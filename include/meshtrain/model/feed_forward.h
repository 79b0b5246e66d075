#pragma once
// The feed-forward sub-layer of a block that a ModelSpec picks (model/model_spec.h: activation,
// ffn_hidden, feed_forward): GPT-2's GELU MLP, SwiGLU, or a mixture of SwiGLU experts in the
// blocks ModelSpec::moe_layer names. A new kind is a class with Mlp's members added to the
// variants below and to the constructor: the block and everything above it are unchanged.

#include <string>
#include <variant>

#include "meshtrain/model/cost_sheet.h"
#include "meshtrain/model/layer.h"
#include "meshtrain/model/mlp.h"
#include "meshtrain/model/model_spec.h"
#include "meshtrain/model/moe_layer.h"
#include "meshtrain/model/swiglu_mlp.h"

namespace meshtrain {

class FeedForward {
 public:
  using Saved = std::variant<Mlp::Saved, SwiGluMlp::Saved, MixtureOfExperts::Saved>;

  // residual_scale multiplies the output projection's init std (GPT-2: 1/sqrt(2 * layers)).
  // `layer`: the block's index (which blocks are mixtures).
  FeedForward(const LayerContext& ctx, const std::string& name, const ModelSpec& spec, int layer,
              double residual_scale);

  // x (N_local, C) -> (N_local, C), as Mlp::forward; `shape` and `recomputing` as
  // MixtureOfExperts::forward takes them (the dense kinds read neither).
  Tensor forward(const Tensor& x, const TokenShape& shape, bool recomputing, Saved& saved,
                 MemoryCategory category, MemoryCategory out_category,
                 const TensorParallel* tp = nullptr, const Tensor* residual = nullptr);
  Tensor backward(const Tensor& dy, const Saved& saved, DeferredWeightGradients* deferred = nullptr);
  void add_costs(CostSheet& sheet) const;

 private:
  std::variant<Mlp, SwiGluMlp, MixtureOfExperts> layer_;
};

}  // namespace meshtrain
