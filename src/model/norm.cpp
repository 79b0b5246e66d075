#include "meshtrain/model/norm.h"

namespace meshtrain {

namespace {

// LayerNorm's kernels compute with eps 1e-5 (the deck refuses another, config/deck.cpp).
std::variant<LayerNorm, RmsNorm> norm_layer(const LayerContext& ctx, const std::string& name,
                                            int64_t C, const NormSpec& spec) {
  if (spec.kind == NormKind::Rms)
    return std::variant<LayerNorm, RmsNorm>(std::in_place_type<RmsNorm>, ctx, name, C, spec.eps);
  return std::variant<LayerNorm, RmsNorm>(std::in_place_type<LayerNorm>, ctx, name, C);
}

}  // namespace

Norm::Norm(const LayerContext& ctx, const std::string& name, int64_t C, const NormSpec& spec)
    : layer_(norm_layer(ctx, name, C, spec)) {}

Tensor Norm::forward(const Tensor& inp, Saved& saved, MemoryCategory category) {
  return std::visit(
      [&](auto& layer) {
        using S = typename std::decay_t<decltype(layer)>::Saved;
        return layer.forward(inp, saved.template emplace<S>(), category);
      },
      layer_);
}

Tensor Norm::backward(const Tensor& dout, const Saved& saved) {
  return std::visit(
      [&](auto& layer) {
        using S = typename std::decay_t<decltype(layer)>::Saved;
        return layer.backward(dout, std::get<S>(saved));
      },
      layer_);
}

Tensor Norm::backward_add(const Tensor& dout, const Saved& saved, const Tensor& residual) {
  return std::visit(
      [&](auto& layer) {
        using S = typename std::decay_t<decltype(layer)>::Saved;
        return layer.backward_add(dout, std::get<S>(saved), residual);
      },
      layer_);
}

void Norm::add_costs(CostSheet& sheet) const {
  std::visit([&](const auto& layer) { layer.add_costs(sheet); }, layer_);
}

}  // namespace meshtrain
