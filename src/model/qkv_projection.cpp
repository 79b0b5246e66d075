#include "meshtrain/model/qkv_projection.h"

#include <algorithm>
#include <cmath>

#include "meshtrain/model/norm_parts.h"

namespace meshtrain {

namespace {
// A per-head norm's weight: replicated over the tensor group, whose ranks normalise different
// heads, so its gradient is partial there with or without sequence parallelism.
ParamSpec head_norm_spec(const std::string& name, int64_t head_dim, const TensorParallel& tp) {
  ParamSpec s = norm_parameter_spec(name, head_dim, Init::Ones, tp);
  s.tp_grad = TpGrad::Partial;
  return s;
}

// Ranks sharing each key/value head: 1 while tp divides kv_heads, else tp / kv_heads
// (parallel.tp beyond the key/value heads; config/layout_check.cpp allows only divisors).
int kv_head_replicas(const ModelSpec& spec, const TensorParallel& tp) {
  return tp.size() > spec.kv_heads() ? static_cast<int>(tp.size() / spec.kv_heads()) : 1;
}

// (N, heads x head_dim) seen as (N x heads, head_dim) and back.
Tensor by_head(const Tensor& t, int64_t head_dim) { return t.reshape({t.numel() / head_dim, head_dim}); }
}  // namespace

QkvProjection::QkvProjection(const LayerContext& ctx, const std::string& name,
                             const ModelSpec& spec)
    : ctx_(ctx),
      local_heads_(spec.heads / ctx.tp.size()),
      local_kv_heads_(spec.kv_heads() * kv_head_replicas(spec, ctx.tp) / ctx.tp.size()),
      head_size_(spec.head_dim()),
      kv_heads_(spec.kv_heads()),
      key_bias_cancels_(!spec.qk_norm && spec.positions != PositionKind::Rotary) {
  const int64_t q_width = spec.heads * head_size_, kv_width = spec.kv_heads() * head_size_;
  if (spec.kv_heads() == spec.heads && !spec.qk_norm) {
    fused_.emplace(ctx, name + ".qkv", Shape{3, q_width, spec.d_model}, 1, Shape{3, q_width}, 0.02,
                   spec.linear_bias);
    return;
  }
  q_.emplace(ctx, name + ".q", Shape{q_width, spec.d_model}, 0, Shape{q_width}, 0.02,
             spec.linear_bias);
  // tp beyond the key/value heads: each rank computes the one key/value head its query heads
  // read, as the other ranks of its group of tp / kv_heads do (Megatron-Core's replicated query
  // groups); the weights are stored whole and their gradients summed over tp.
  const int replicas = kv_head_replicas(spec, ctx.tp);
  k_.emplace(ctx, name + ".k", Shape{kv_width, spec.d_model}, 0, Shape{kv_width}, 0.02,
             spec.linear_bias, replicas);
  v_.emplace(ctx, name + ".v", Shape{kv_width, spec.d_model}, 0, Shape{kv_width}, 0.02,
             spec.linear_bias, replicas);
  // One product needs the three weights' local rows back to back: not with shared heads.
  if (!spec.qk_norm && replicas == 1)
    stacked_.emplace(std::vector<ColumnParallelLinear*>{&*q_, &*k_, &*v_});
  if (spec.qk_norm) {
    q_norm_.emplace(ctx, head_norm_spec(name + ".q_norm.weight", head_size_, ctx.tp), spec.norm.eps);
    k_norm_.emplace(ctx, head_norm_spec(name + ".k_norm.weight", head_size_, ctx.tp), spec.norm.eps);
  }
}

Tensor QkvProjection::forward(const Tensor& x, Saved& saved, MemoryCategory category,
                              const TensorParallel* tp) {
  if (fused_) return fused_->forward(x, saved.entered, category, tp);
  if (stacked_) return stacked_->forward(x, saved.entered, category, tp);
  // Separate projections (model.qk_norm, or shared key/value heads); with model.qk_norm the
  // query and key heads are normalised before packing.
  Backend& be = *ctx_.backend;
  const MemoryCategory ws = MemoryCategory::Workspace;
  const int64_t q_cols = local_heads_ * head_size_, kv_cols = local_kv_heads_ * head_size_;
  // The normalised heads' inputs are kept for the backward pass: activations, not workspace.
  Tensor q = q_->forward(x, saved.entered, category, tp);
  Tensor k = k_->forward_entered(saved.entered, category);
  const Tensor v = v_->forward_entered(saved.entered, ws);
  const int64_t N = q.dim(0);
  if (q_norm_) {
    q = q_norm_->forward(by_head(q, head_size_), saved.q_norm, ws).reshape({N, q_cols});
    k = k_norm_->forward(by_head(k, head_size_), saved.k_norm, ws).reshape({N, kv_cols});
  }
  Tensor packed = be.empty({q.dim(0), q_cols + 2 * kv_cols}, x.dtype(), category);
  be.copy_columns(packed, 0, q, 0, q_cols);
  be.copy_columns(packed, q_cols, k, 0, kv_cols);
  be.copy_columns(packed, q_cols + kv_cols, v, 0, kv_cols);
  return packed;
}

void QkvProjection::add_qk_clip_scales(const std::vector<double>& local_gammas,
                                       std::vector<RowScale>& out) {
  if (std::all_of(local_gammas.begin(), local_gammas.end(), [](double g) { return g == 1.0; }))
    return;
  const int64_t q_rows = local_heads_ * head_size_;
  // Multi-head: the fused (3, q_rows) rows, q and k by sqrt(gamma); else q's rows by gamma.
  const int64_t parts = fused_ ? 3 : 1;
  std::vector<double> factors(static_cast<size_t>(parts * q_rows), 1.0);
  for (int64_t r = 0; r < q_rows; ++r) {
    const double g = local_gammas[static_cast<size_t>(r / head_size_)];
    factors[static_cast<size_t>(r)] = fused_ ? std::sqrt(g) : g;
    if (fused_) factors[static_cast<size_t>(q_rows + r)] = std::sqrt(g);
  }
  ColumnParallelLinear& query = fused_ ? *fused_ : *q_;
  Parameter& w = query.weight();
  out.push_back({&w, w.numel() / (parts * q_rows), factors});
  if (Parameter* b = query.bias()) out.push_back({b, 1, factors});
}

Tensor QkvProjection::backward(const Tensor& dqkv, const Saved& saved,
                               DeferredWeightGradients* deferred) {
  Backend& be = *ctx_.backend;
  const int64_t q_cols = local_heads_ * head_size_, kv_cols = local_kv_heads_ * head_size_;
  Tensor dx;
  Parameter* key_bias = nullptr;
  int64_t key_bias_begin = 0;
  if (fused_) {
    dx = fused_->backward(dqkv, saved.entered, deferred);
    key_bias = fused_->bias();
    key_bias_begin = q_cols;
  } else if (stacked_) {
    dx = stacked_->backward(dqkv, saved.entered, deferred);
    key_bias = k_->bias();  // null without biases
  } else {  // separate projections: model.qk_norm, or shared key/value heads
    const MemoryCategory ws = MemoryCategory::Workspace;
    const int64_t N = dqkv.dim(0);
    Tensor dq = be.empty({N, q_cols}, dqkv.dtype(), ws);
    Tensor dk = be.empty({N, kv_cols}, dqkv.dtype(), ws);
    Tensor dv = be.empty({N, kv_cols}, dqkv.dtype(), ws);
    be.copy_columns(dq, 0, dqkv, 0, q_cols);
    be.copy_columns(dk, 0, dqkv, q_cols, kv_cols);
    be.copy_columns(dv, 0, dqkv, q_cols + kv_cols, kv_cols);
    if (q_norm_) {
      dq = q_norm_->backward(by_head(dq, head_size_), saved.q_norm).reshape({N, q_cols});
      dk = k_norm_->backward(by_head(dk, head_size_), saved.k_norm).reshape({N, kv_cols});
    }
    dx = q_->backward_in_region(dq, saved.entered, deferred);
    be.add_inplace(dx, k_->backward_in_region(dk, saved.entered, deferred));
    be.add_inplace(dx, v_->backward_in_region(dv, saved.entered, deferred));
    dx = q_->leave_region_backward(dx);
    key_bias = k_->bias();  // the whole (replicated) bias
  }
  // Where it cancels, the key bias's gradient is round-off of a true zero: made exactly zero.
  // After a norm or a rotation it is learnt, and its gradient stays.
  if (!key_bias_cancels_) key_bias = nullptr;
  // After the bias gradient is written, so deferred with it when that is.
  const int64_t key_bias_count = fused_ || !key_bias ? kv_cols : key_bias->numel();
  if (key_bias)
    run_or_defer(deferred, [this, key_bias, key_bias_begin, key_bias_count] {
      key_bias->zero_grad_if_unwritten(*ctx_.backend);
      Tensor dkey_bias =
          key_bias->grad.reshape({key_bias->numel()}).view(key_bias_begin, {key_bias_count});
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
  // Without biases between their weights the three are one product writing the packed rows;
  // otherwise each projection's outputs take that layout pass and the copy into the packed
  // rows (forward) and out of them (backward).
  const bool one_product = stacked_ && !k_->has_bias();
  for (const std::optional<ColumnParallelLinear>* p : {&q_, &k_, &v_}) {
    const size_t first_parameter = sheet.parameters.size();
    (*p)->add_costs(sheet);
    // Keys and values split by whole heads: tp beyond kv_heads shares them (whole weights).
    if (p != &q_) {
      sheet.linears.back().tp_parts = kv_heads_;
      for (size_t i = first_parameter; i < sheet.parameters.size(); ++i)
        sheet.parameters[i].tp_parts = kv_heads_;
    }
    sheet.add_pass_over_last_outputs(one_product ? 2 : 4, one_product ? 4 : 6);
  }
  if (q_norm_) {
    // The query and key heads normalised as a norm layer's rows are (model/norm_parts.h).
    sheet.parameters.push_back(parameter_cost(q_norm_->weight_spec()));
    sheet.parameters.push_back(parameter_cost(k_norm_->weight_spec()));
    ElementwiseCost pass;
    pass.width = (local_heads_ + local_kv_heads_) * ctx_.tp.size() * head_size_;
    pass.width_split = true;
    pass.tokens = ElementwiseCost::Tokens::All;
    pass.forward_accesses = 2;
    pass.backward_accesses = 4;
    sheet.elementwise.push_back(pass);
  }
}

}  // namespace meshtrain
