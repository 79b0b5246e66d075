#include "meshtrain/model/block_attention.h"

#include <type_traits>

namespace meshtrain {

namespace {

using Layers = std::variant<CausalSelfAttention, LatentAttention>;

Layers attention_layer(const LayerContext& ctx, const std::string& name, const ModelSpec& spec,
                       double residual_scale) {
  if (spec.latent_attention())
    return Layers(std::in_place_type<LatentAttention>, ctx, name, spec, residual_scale);
  return Layers(std::in_place_type<CausalSelfAttention>, ctx, name, spec, residual_scale);
}

}  // namespace

BlockAttention::BlockAttention(const LayerContext& ctx, const std::string& name,
                               const ModelSpec& spec, double residual_scale)
    : layer_(attention_layer(ctx, name, spec, residual_scale)) {}

Tensor BlockAttention::forward(const Tensor& x, TokenShape shape, Saved& saved,
                               MemoryCategory category, Recompute recompute,
                               const Tensor* residual) {
  return std::visit(
      [&](auto& layer) {
        auto& s = saved.template emplace<typename std::decay_t<decltype(layer)>::Saved>();
        return layer.forward(x, shape, s, category, recompute, residual);
      },
      layer_);
}

Tensor BlockAttention::backward(const Tensor& dy, TokenShape shape, const Saved& saved,
                                DeferredWeightGradients* deferred) {
  return std::visit(
      [&](auto& layer) {
        using S = typename std::decay_t<decltype(layer)>::Saved;
        return layer.backward(dy, shape, std::get<S>(saved), deferred);
      },
      layer_);
}

void BlockAttention::add_costs(CostSheet& sheet) const {
  std::visit([&](const auto& layer) { layer.add_costs(sheet); }, layer_);
}

}  // namespace meshtrain
