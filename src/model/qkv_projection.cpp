#include "meshtrain/model/qkv_projection.h"

namespace meshtrain {

QkvProjection::QkvProjection(const LayerContext& ctx, const std::string& name,
                             const ModelSpec& spec)
    : ctx_(ctx),
      local_heads_(spec.heads / ctx.tp.size()),
      local_kv_heads_(spec.kv_heads() / ctx.tp.size()),
      head_size_(spec.head_dim()) {
  const int64_t q_width = spec.heads * head_size_, kv_width = spec.kv_heads() * head_size_;
  if (spec.kv_heads() == spec.heads) {
    fused_.emplace(ctx, name + ".qkv", Shape{3, q_width, spec.d_model}, 1, Shape{3, q_width}, 0.02,
                   spec.linear_bias);
    return;
  }
  q_.emplace(ctx, name + ".q", Shape{q_width, spec.d_model}, 0, Shape{q_width}, 0.02,
             spec.linear_bias);
  k_.emplace(ctx, name + ".k", Shape{kv_width, spec.d_model}, 0, Shape{kv_width}, 0.02,
             spec.linear_bias);
  v_.emplace(ctx, name + ".v", Shape{kv_width, spec.d_model}, 0, Shape{kv_width}, 0.02,
             spec.linear_bias);
}

Tensor QkvProjection::forward(const Tensor& x, Saved& saved, MemoryCategory category,
                              const TensorParallel* tp) {
  if (fused_) return fused_->forward(x, saved, category, tp);
  Backend& be = *ctx_.backend;
  const MemoryCategory ws = MemoryCategory::Workspace;
  const int64_t q_cols = local_heads_ * head_size_, kv_cols = local_kv_heads_ * head_size_;
  const Tensor q = q_->forward(x, saved, ws, tp);
  const Tensor k = k_->forward_entered(saved, ws);
  const Tensor v = v_->forward_entered(saved, ws);
  Tensor packed = be.empty({q.dim(0), q_cols + 2 * kv_cols}, x.dtype(), category);
  be.copy_columns(packed, 0, q, 0, q_cols);
  be.copy_columns(packed, q_cols, k, 0, kv_cols);
  be.copy_columns(packed, q_cols + kv_cols, v, 0, kv_cols);
  return packed;
}

Tensor QkvProjection::backward(const Tensor& dqkv, const Saved& saved,
                               DeferredWeightGradients* deferred) {
  Backend& be = *ctx_.backend;
  const int64_t q_cols = local_heads_ * head_size_, kv_cols = local_kv_heads_ * head_size_;
  Tensor dx;
  Parameter* key_bias = nullptr;
  int64_t key_bias_begin = 0;
  if (fused_) {
    dx = fused_->backward(dqkv, saved, deferred);
    key_bias = fused_->bias();
    key_bias_begin = q_cols;
  } else {
    const MemoryCategory ws = MemoryCategory::Workspace;
    const int64_t N = dqkv.dim(0);
    Tensor dq = be.empty({N, q_cols}, dqkv.dtype(), ws);
    Tensor dk = be.empty({N, kv_cols}, dqkv.dtype(), ws);
    Tensor dv = be.empty({N, kv_cols}, dqkv.dtype(), ws);
    be.copy_columns(dq, 0, dqkv, 0, q_cols);
    be.copy_columns(dk, 0, dqkv, q_cols, kv_cols);
    be.copy_columns(dv, 0, dqkv, q_cols + kv_cols, kv_cols);
    dx = q_->backward_in_region(dq, saved, deferred);
    be.add_inplace(dx, k_->backward_in_region(dk, saved, deferred));
    be.add_inplace(dx, v_->backward_in_region(dv, saved, deferred));
    dx = q_->leave_region_backward(dx);
    key_bias = k_->bias();
  }
  // After the bias gradient is written, so deferred with it when that is.
  if (key_bias)
    run_or_defer(deferred, [this, key_bias, key_bias_begin, kv_cols] {
      Tensor dkey_bias = key_bias->grad.reshape({key_bias->numel()}).view(key_bias_begin, {kv_cols});
      ctx_.backend->fill(dkey_bias, 0.0);
    });
  return dx;
}

void QkvProjection::add_costs(CostSheet& sheet) const {
  if (fused_) {
    fused_->add_costs(sheet);
    // The projection's output read and written once more to lay out q, k and v by head.
    sheet.add_pass_over_last_outputs(2, 4);
    return;
  }
  // Each projection's outputs: that layout pass, and the copy into the packed rows (forward)
  // and out of them (backward).
  for (const std::optional<ColumnParallelLinear>* p : {&q_, &k_, &v_}) {
    (*p)->add_costs(sheet);
    sheet.add_pass_over_last_outputs(4, 6);
  }
}

}  // namespace meshtrain
