#include "meshtrain/model/attention.h"

namespace meshtrain {

CausalSelfAttention::CausalSelfAttention(const LayerContext& ctx, const std::string& name,
                                         const ModelSpec& spec, double residual_scale)
    : ctx_(ctx),
      local_heads_(spec.heads / ctx.tp.size()),
      head_size_(spec.head_dim()),
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
  if (ctx_.cp.on()) {
    saved.lse = be.empty({shape.B, local_heads_, shape.T}, stats_dtype(x.dtype()), category);
    ring_attention_forward(be, ctx_.cp, att, saved.lse, saved.qkv, shape.B, shape.T, local_heads_,
                           qkv_.local_kv_heads(), head_size_, nullptr, shape.document_mask());
    return proj_.forward(att, saved.proj_in, category, nullptr, residual);
  }
  const MemoryCategory stash_category =
      recompute == Recompute::Selective ? MemoryCategory::Workspace : category;
  Tensor stash = empty_stash(shape, x.dtype(), stash_category);
  be.attention_forward(att, stash, saved.qkv, shape.B, shape.T, local_heads_,
                       qkv_.local_kv_heads(), head_size_, shape.document_mask());
  if (recompute != Recompute::Selective) saved.stash = stash;
  return proj_.forward(att, saved.proj_in, category, nullptr, residual);
}

// What the backend keeps from forward to backward (backend.h, attention_stash): the CPU's row
// log-sum-exp, the CUDA backend's (B, NH, T, T).
Tensor CausalSelfAttention::empty_stash(TokenShape shape, DType activations,
                                        MemoryCategory category) const {
  Backend& be = *ctx_.backend;
  const Backend::AttentionStash s = be.attention_stash(shape.B, shape.T, local_heads_, activations);
  return be.empty(s.shape, s.dtype, category);
}

Tensor CausalSelfAttention::decode(const Tensor& x, Tensor& k_cache, Tensor& v_cache,
                                   int64_t position) {
  Backend& be = *ctx_.backend;
  const MemoryCategory ws = MemoryCategory::Workspace;
  const int64_t local_c = local_heads_ * head_size_, T_max = k_cache.dim(1);
  const TensorParallel tp = ctx_.tp.without_sequence();
  QkvProjection::Saved qkv_in;
  Tensor qkv = qkv_.forward(x, qkv_in, ws, &tp);  // (1, (NH + 2 KVH) HS / tp)
  if (rotary_) rotary_->forward_at(qkv, position);
  const int64_t kv_heads = qkv_.local_kv_heads(), kv_c = kv_heads * head_size_;
  for (int64_t h = 0; h < kv_heads; ++h) {
    const int64_t row = (h * T_max + position) * head_size_;
    Tensor k_row = k_cache.view(row, {head_size_}), v_row = v_cache.view(row, {head_size_});
    be.copy(k_row, qkv.view(local_c + h * head_size_, {head_size_}));
    be.copy(v_row, qkv.view(local_c + kv_c + h * head_size_, {head_size_}));
  }
  Tensor att = be.empty({1, local_c}, x.dtype(), ws);
  be.attention_decode(att, qkv.view(0, {local_heads_, head_size_}), k_cache, v_cache, position + 1);
  RowParallelLinear::Saved proj_in;
  return proj_.forward(att, proj_in, ws, &tp);
}

Tensor CausalSelfAttention::backward(const Tensor& dy, TokenShape shape, const Saved& saved,
                                     DeferredWeightGradients* deferred) {
  Backend& be = *ctx_.backend;
  Tensor datt = proj_.backward(dy, saved.proj_in, deferred);
  Tensor dqkv = be.empty(saved.qkv.shape(), dy.dtype(), MemoryCategory::Workspace);
  if (ctx_.cp.on()) {
    ring_attention_backward(be, ctx_.cp, dqkv, datt, saved.qkv, saved.proj_in.inp, saved.lse,
                            shape.B, shape.T, local_heads_, qkv_.local_kv_heads(), head_size_,
                            nullptr, shape.document_mask());
    return finish_backward(dqkv, shape, saved, deferred);
  }
  Tensor stash = saved.stash;
  if (!stash.defined()) {  // selective recomputation: rebuild the stash from the saved qkv
    stash = empty_stash(shape, dy.dtype(), MemoryCategory::Workspace);
    Tensor att = be.empty(saved.proj_in.inp.shape(), dy.dtype(), MemoryCategory::Workspace);
    be.attention_forward(att, stash, saved.qkv, shape.B, shape.T, local_heads_,
                         qkv_.local_kv_heads(), head_size_, shape.document_mask());
  }
  // proj's saved input is forward's out (a recomputation writes the same bits)
  be.attention_backward(dqkv, datt, saved.qkv, saved.proj_in.inp, stash, shape.B, shape.T,
                        local_heads_, qkv_.local_kv_heads(), head_size_, shape.document_mask());
  return finish_backward(dqkv, shape, saved, deferred);
}

Tensor CausalSelfAttention::finish_backward(Tensor& dqkv, TokenShape shape, const Saved& saved,
                                            DeferredWeightGradients* deferred) {
  if (rotary_) rotary_->backward(dqkv, shape);
  return qkv_.backward(dqkv, saved.qkv_in, deferred);
}

void CausalSelfAttention::add_costs(CostSheet& sheet) const {
  qkv_.add_costs(sheet);
  if (rotary_) rotary_->add_costs(sheet);
  sheet.attention.push_back(attention_core_cost(local_heads_ * ctx_.tp.size(), head_size_));
  proj_.add_costs(sheet);
}
}  // namespace meshtrain
