#include "meshtrain/model/feed_forward.h"

#include <type_traits>

namespace meshtrain {

namespace {

using Layers = std::variant<Mlp, SwiGluMlp, MixtureOfExperts>;

Layers feed_forward_layer(const LayerContext& ctx, const std::string& name, const ModelSpec& spec,
                          int layer, double residual_scale) {
  if (spec.moe_layer(layer))
    return Layers(std::in_place_type<MixtureOfExperts>, ctx, name, spec, layer, residual_scale);
  if (spec.activation == ActivationKind::SwiGlu)
    return Layers(std::in_place_type<SwiGluMlp>, ctx, name, spec.d_model, spec.ffn_hidden(),
                  residual_scale, spec.linear_bias);
  return Layers(std::in_place_type<Mlp>, ctx, name, spec.d_model, spec.ffn_hidden(),
                residual_scale, spec.linear_bias);
}

}  // namespace

FeedForward::FeedForward(const LayerContext& ctx, const std::string& name, const ModelSpec& spec,
                         int layer, double residual_scale)
    : layer_(feed_forward_layer(ctx, name, spec, layer, residual_scale)) {}

Tensor FeedForward::forward(const Tensor& x, const TokenShape& shape, bool recomputing,
                            Saved& saved, MemoryCategory category, MemoryCategory out_category,
                            const TensorParallel* tp, const Tensor* residual) {
  return std::visit(
      [&](auto& layer) {
        using L = std::decay_t<decltype(layer)>;
        auto& s = saved.template emplace<typename L::Saved>();
        if constexpr (std::is_same_v<L, MixtureOfExperts>)
          return layer.forward(x, shape, recomputing, s, category, out_category, tp, residual);
        else
          return layer.forward(x, s, category, out_category, tp, residual);
      },
      layer_);
}

Tensor FeedForward::backward(const Tensor& dy, const Saved& saved, DeferredWeightGradients* deferred) {
  return std::visit(
      [&](auto& layer) {
        using S = typename std::decay_t<decltype(layer)>::Saved;
        return layer.backward(dy, std::get<S>(saved), deferred);
      },
      layer_);
}

void FeedForward::add_costs(CostSheet& sheet) const {
  std::visit([&](const auto& layer) { layer.add_costs(sheet); }, layer_);
}

}  // namespace meshtrain
