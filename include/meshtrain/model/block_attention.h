#pragma once
// The attention sub-layer of a block that a ModelSpec picks (model/model_spec.h: attention):
// causal self-attention, multi-head or grouped-query (model/attention.h), or multi-head latent
// attention (model/latent_attention.h). As FeedForward is for the feed-forward: a new kind is a
// class with these members added to the variants below and to the constructor.

#include <string>
#include <variant>

#include "meshtrain/model/attention.h"
#include "meshtrain/model/cost_sheet.h"
#include "meshtrain/model/decode_cache.h"
#include "meshtrain/model/latent_attention.h"
#include "meshtrain/model/layer.h"
#include "meshtrain/model/model_spec.h"

namespace meshtrain {

class BlockAttention {
 public:
  using Saved = std::variant<CausalSelfAttention::Saved, LatentAttention::Saved>;

  // layer: the block's index (its sliding window; QK-clip's log, model/qk_clip.h).
  BlockAttention(const LayerContext& ctx, const std::string& name, const ModelSpec& spec,
                 int layer, double residual_scale);

  // As CausalSelfAttention's.
  Tensor forward(const Tensor& x, TokenShape shape, Saved& saved, MemoryCategory category,
                 Recompute recompute, const Tensor* residual = nullptr);
  Tensor backward(const Tensor& dy, TokenShape shape, const Saved& saved,
                  DeferredWeightGradients* deferred = nullptr);
  // QK-clip's rows to scale (CausalSelfAttention::add_qk_clip_scales; none for latent
  // attention, which config/ refuses with QK-clip).
  void add_qk_clip_scales(const std::vector<double>& job_gammas, std::vector<RowScale>& out);
  void add_costs(CostSheet& sheet) const;
  // Generation: an empty cache of seq_len positions for this layer, or of its window's where
  // that is smaller (CausalSelfAttention::cache_rows) (zeros: the decode kernels
  // read only the rows written, but a defined value costs nothing), and one token x (1, C) at
  // `position` through the layer, writing its row of the cache and attending to rows
  // [0, position] (CausalSelfAttention::decode, LatentAttention::decode).
  DecodeCache decode_cache(Backend& be, DType dtype, int64_t seq_len) const;
  Tensor decode(const Tensor& x, DecodeCache& cache, int64_t position);

 private:
  std::variant<CausalSelfAttention, LatentAttention> layer_;
};

}  // namespace meshtrain
