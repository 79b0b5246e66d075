#include "meshtrain/model/block_attention.h"

#include <type_traits>

namespace meshtrain {

namespace {

using Layers = std::variant<CausalSelfAttention, LatentAttention>;

// Latent attention takes no window (the deck refuses one there: config/deck.cpp).
Layers attention_layer(const LayerContext& ctx, const std::string& name, const ModelSpec& spec,
                       int layer, double residual_scale) {
  if (spec.latent_attention())
    return Layers(std::in_place_type<LatentAttention>, ctx, name, spec, residual_scale);
  return Layers(std::in_place_type<CausalSelfAttention>, ctx, name, spec, layer, residual_scale);
}

}  // namespace

BlockAttention::BlockAttention(const LayerContext& ctx, const std::string& name,
                               const ModelSpec& spec, int layer, double residual_scale)
    : layer_(attention_layer(ctx, name, spec, layer, residual_scale)) {}

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

DecodeCache BlockAttention::decode_cache(Backend& be, DType dtype, int64_t seq_len) const {
  const MemoryCategory ws = MemoryCategory::Workspace;
  if (const auto* latent = std::get_if<LatentAttention>(&layer_))
    return {be.zeros({1, seq_len, latent->cache_width()}, dtype, ws), Tensor{}};
  const auto& standard = std::get<CausalSelfAttention>(layer_);
  const Shape heads{standard.local_kv_heads(), standard.cache_rows(seq_len), standard.head_size()};
  return {be.zeros(heads, dtype, ws), be.zeros(heads, dtype, ws)};
}

Tensor BlockAttention::decode(const Tensor& x, DecodeCache& cache, int64_t position) {
  if (auto* latent = std::get_if<LatentAttention>(&layer_))
    return latent->decode(x, cache.keys, position);
  return std::get<CausalSelfAttention>(layer_).decode(x, cache.keys, cache.values, position);
}

void BlockAttention::add_qk_clip_scales(const std::vector<double>& job_gammas,
                                        std::vector<RowScale>& out) {
  if (auto* standard = std::get_if<CausalSelfAttention>(&layer_))
    standard->add_qk_clip_scales(job_gammas, out);
}

void BlockAttention::add_costs(CostSheet& sheet) const {
  std::visit([&](const auto& layer) { layer.add_costs(sheet); }, layer_);
}

}  // namespace meshtrain
