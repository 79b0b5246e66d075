#include "meshtrain/model/attention.h"

namespace meshtrain {

CausalSelfAttention::CausalSelfAttention(const LayerContext& ctx, const std::string& name,
                                         const ModelSpec& spec, int layer, double residual_scale)
    : ctx_(ctx),
      layer_(layer),
      local_heads_(spec.heads / ctx.tp.size()),
      head_size_(spec.head_dim()),
      window_(spec.window(layer)),
      qkv_(ctx, name, spec),
      proj_(ctx, name + ".proj", spec.heads * head_size_, spec.d_model, 0.02 * residual_scale,
            spec.linear_bias) {
  if (spec.positions == PositionKind::Rotary)
    rotary_.emplace(ctx, spec, local_heads_, qkv_.local_kv_heads());
}

Tensor CausalSelfAttention::forward(const Tensor& x, TokenShape shape, Saved& saved,
                                    MemoryCategory category, Recompute recompute,
                                    const Tensor* residual) {
  Backend& be = *ctx_.backend;
  const int64_t local_c = local_heads_ * head_size_;
  saved.qkv = qkv_.forward(x, saved.qkv_in, category);
  if (rotary_) rotary_->forward(saved.qkv, shape);
  Tensor att = be.empty({shape.N(), local_c}, x.dtype(), category);
  if (ctx_.qk_log && ctx_.qk_log->on()) {
    std::vector<double> head_max;
    attention_core_forward(ctx_, att, saved.qkv, shape, dims(), saved.core, category, recompute,
                           &head_max);
    ctx_.qk_log->record(layer_, head_max);  // again under recomputation: the same maxima
  } else {
    attention_core_forward(ctx_, att, saved.qkv, shape, dims(), saved.core, category, recompute);
  }
  return proj_.forward(att, saved.proj_in, category, nullptr, residual);
}

Tensor CausalSelfAttention::decode(const Tensor& x, Tensor& k_cache, Tensor& v_cache,
                                   int64_t position) {
  Backend& be = *ctx_.backend;
  const MemoryCategory ws = MemoryCategory::Workspace;
  const int64_t local_c = local_heads_ * head_size_, rows = k_cache.dim(1);
  const TensorParallel tp = ctx_.tp.without_sequence();
  QkvProjection::Saved qkv_in;
  Tensor qkv = qkv_.forward(x, qkv_in, ws, &tp);  // (1, (NH + 2 KVH) HS / tp)
  if (rotary_) rotary_->forward_at(qkv, position);
  const int64_t kv_heads = qkv_.local_kv_heads(), kv_c = kv_heads * head_size_;
  for (int64_t h = 0; h < kv_heads; ++h) {
    const int64_t row = (h * rows + position % rows) * head_size_;
    Tensor k_row = k_cache.view(row, {head_size_}), v_row = v_cache.view(row, {head_size_});
    be.copy(k_row, qkv.view(local_c + h * head_size_, {head_size_}));
    be.copy(v_row, qkv.view(local_c + kv_c + h * head_size_, {head_size_}));
  }
  Tensor att = be.empty({1, local_c}, x.dtype(), ws);
  be.attention_decode(att, qkv.view(0, {local_heads_, head_size_}), k_cache, v_cache,
                      std::min(position + 1, rows));
  RowParallelLinear::Saved proj_in;
  return proj_.forward(att, proj_in, ws, &tp);
}

Tensor CausalSelfAttention::backward(const Tensor& dy, TokenShape shape, const Saved& saved,
                                     DeferredWeightGradients* deferred) {
  const Tensor datt = proj_.backward(dy, saved.proj_in, deferred);
  // proj's saved input is forward's out (a recomputation writes the same bits)
  Tensor dqkv = attention_core_backward(ctx_, datt, saved.qkv, saved.proj_in.inp, shape, dims(),
                                        saved.core);
  if (rotary_) rotary_->backward(dqkv, shape);  // rotated back in place, then the projection's
  return qkv_.backward(dqkv, saved.qkv_in, deferred);
}

void CausalSelfAttention::add_qk_clip_scales(const std::vector<double>& job_gammas,
                                             std::vector<RowScale>& out) {
  const int64_t heads = local_heads_ * ctx_.tp.size();
  const auto first = job_gammas.begin() + layer_ * heads + local_heads_ * ctx_.tp.rank();
  qkv_.add_qk_clip_scales(std::vector<double>(first, first + local_heads_), out);
}

void CausalSelfAttention::add_costs(CostSheet& sheet) const {
  qkv_.add_costs(sheet);
  if (rotary_) rotary_->add_costs(sheet);
  AttentionCost core = attention_core_cost(local_heads_ * ctx_.tp.size(), head_size_);
  core.window = window_;
  sheet.attention.push_back(core);
  proj_.add_costs(sheet);
  // Generation's keys and values of every key/value head, split with the heads (one head a rank
  // where tp goes beyond them).
  sheet.decode_cache.push_back({2 * qkv_.kv_heads() * head_size_, true, qkv_.kv_heads(), window_});
}
}  // namespace meshtrain
