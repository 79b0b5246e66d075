#include "meshtrain/model/linear.h"

#include <stdexcept>

namespace meshtrain {

namespace {
ParamSpec weight_spec(const std::string& name, Shape shape, int split_dim, TpSplit split,
                      double std_dev) {
  ParamSpec s;
  s.name = name + ".weight";
  s.global_shape = shape;
  s.tp_split_dim = split_dim;
  s.tp_split = split;
  s.init = Init::Normal;
  s.init_std = std_dev;
  s.role = ParamRole::HiddenMatrix;  // the linear layers are the blocks' matrices
  return s;
}

ParamSpec bias_spec(const std::string& name, Shape shape, int split_dim, TpGrad tp_grad) {
  ParamSpec s;
  s.name = name + ".bias";
  s.global_shape = shape;
  s.tp_split_dim = split_dim;
  s.tp_split = split_dim < 0 ? TpSplit::None : TpSplit::OutputFeatures;
  s.init = Init::Zeros;
  s.decay = WeightDecay::Skip;
  s.tp_grad = tp_grad;
  return s;
}

// The bias parameter, registered only when the layer has one.
Parameter* maybe_bias(const LayerContext& ctx, bool with_bias, const ParamSpec& spec) {
  return with_bias ? &ctx.store->add(spec, ctx.tp.rank(), ctx.tp.size()) : nullptr;
}

// A column-parallel weight's spec: split along `split_dim`, or whole on every rank with a
// gradient the tensor group sums when each part of its outputs is shared by `replicas` ranks.
ParamSpec column_weight_spec(const std::string& name, Shape shape, int split_dim, double std_dev,
                             int replicas) {
  if (replicas == 1) return weight_spec(name, shape, split_dim, TpSplit::OutputFeatures, std_dev);
  ParamSpec s = weight_spec(name, shape, -1, TpSplit::None, std_dev);
  s.tp_grad = TpGrad::Partial;
  return s;
}

ParamSpec column_bias_spec(const std::string& name, Shape shape, int replicas) {
  if (replicas == 1) return bias_spec(name, shape, shape.rank() - 1, TpGrad::Full);
  return bias_spec(name, shape, -1, TpGrad::Partial);
}

// The output features one rank computes: the whole weight's, over the tp / replicas parts.
int64_t column_local_out(const Shape& weight_shape, int64_t in, const TensorParallel& tp,
                         int replicas) {
  if (replicas < 1 || tp.size() % replicas != 0)
    throw std::logic_error("ColumnParallelLinear: " + std::to_string(replicas) +
                           " replicas do not divide tp = " + std::to_string(tp.size()));
  return weight_shape.numel() / in / (tp.size() / replicas);
}

}  // namespace

ColumnParallelLinear::ColumnParallelLinear(const LayerContext& ctx, const std::string& name,
                                           Shape weight_shape, int split_dim, Shape bias_shape,
                                           double init_std, bool with_bias, int replicas)
    : ctx_(ctx),
      in_(weight_shape[weight_shape.rank() - 1]),
      replicas_(replicas),
      weight_(ctx.store->add(column_weight_spec(name, weight_shape, split_dim, init_std, replicas),
                             ctx.tp.rank(), ctx.tp.size())),
      bias_(maybe_bias(ctx, with_bias, column_bias_spec(name, bias_shape, replicas))),
      local_out_(column_local_out(weight_shape, in_, ctx.tp, replicas)) {
  if (replicas_ > 1) row_begin_ = ctx.tp.rank() / replicas_ * local_out_;
}

Tensor ColumnParallelLinear::weight_rows(const Tensor& t) const {
  return t.view(row_begin_ * in_, {local_out_, in_});
}

Tensor ColumnParallelLinear::bias_rows(const Tensor& t) const {
  return t.view(row_begin_, {local_out_});
}

Tensor ColumnParallelLinear::forward(const Tensor& x, Saved& saved, MemoryCategory category,
                                     const TensorParallel* tp) {
  return forward_through(x, saved, nullptr, category, tp);
}

Tensor ColumnParallelLinear::forward_gelu(const Tensor& x, Saved& saved, Tensor& pre,
                                          MemoryCategory category, const TensorParallel* tp) {
  return forward_through(x, saved, &pre, category, tp);
}

Tensor ColumnParallelLinear::forward_through(const Tensor& x, Saved& saved, Tensor* gelu_pre,
                                             MemoryCategory category, const TensorParallel* tp) {
  Backend& be = *ctx_.backend;
  saved.inp = enter_tp_region_forward(be, tp ? *tp : ctx_.tp, x, category);
  const int64_t N = saved.inp.dim(0);
  Tensor out = be.empty(Shape{N, local_out()}, x.dtype(), category);
  const Tensor w = weight_rows(weight_.value);
  const Tensor b = bias_ ? bias_rows(bias_->value) : Tensor{};
  if (!gelu_pre) {
    be.matmul_forward(out, saved.inp, w, bias_ ? &b : nullptr);
    return out;
  }
  *gelu_pre = out;
  Tensor activated = be.empty(out.shape(), x.dtype(), category);
  if (bias_) {
    be.matmul_gelu_forward(activated, *gelu_pre, saved.inp, w, b);
  } else {
    be.matmul_forward(*gelu_pre, saved.inp, w, nullptr);
    be.gelu_forward(activated, *gelu_pre);
  }
  return activated;
}

Tensor ColumnParallelLinear::forward_entered(const Saved& entered, MemoryCategory category) {
  Backend& be = *ctx_.backend;
  Tensor out = be.empty(Shape{entered.inp.dim(0), local_out()}, entered.inp.dtype(), category);
  const Tensor w = weight_rows(weight_.value);
  const Tensor b = bias_ ? bias_rows(bias_->value) : Tensor{};
  be.matmul_forward(out, entered.inp, w, bias_ ? &b : nullptr);
  return out;
}

Tensor ColumnParallelLinear::backward(const Tensor& dy, const Saved& saved,
                                      DeferredWeightGradients* deferred) {
  return leave_region_backward(backward_in_region(dy, saved, deferred));
}

Tensor ColumnParallelLinear::leave_region_backward(const Tensor& dinp) {
  return enter_tp_region_backward(*ctx_.backend, ctx_.tp, dinp, MemoryCategory::Workspace);
}

Tensor ColumnParallelLinear::backward_in_region(const Tensor& dy, const Saved& saved,
                                                DeferredWeightGradients* deferred) {
  Backend& be = *ctx_.backend;
  Tensor dinp = be.empty(saved.inp.shape(), saved.inp.dtype(), MemoryCategory::Workspace);
  be.matmul_backward(&dinp, nullptr, nullptr, dy, saved.inp, weight_rows(weight_.value));
  run_or_defer(deferred, [this, dy, inp = saved.inp] { write_weight_gradients(dy, inp); });
  return dinp;
}

void ColumnParallelLinear::write_weight_gradients(const Tensor& dy, const Tensor& inp) {
  Backend& be = *ctx_.backend;
  // Shared parts: the rows of the parts other ranks compute stay zero in this rank's gradient.
  if (replicas_ > 1) weight_.zero_grad_if_unwritten(be);
  Tensor dw = weight_rows(weight_.grad);
  Tensor db = bias_ ? bias_rows(bias_->grad) : Tensor{};
  if (bias_) bias_->zero_grad_if_unwritten(be);
  be.matmul_backward(nullptr, &dw, bias_ ? &db : nullptr, dy, inp, Tensor{},
                     weight_.take_grad_write());
}

RowParallelLinear::RowParallelLinear(const LayerContext& ctx, const std::string& name, int64_t in,
                                     int64_t out, double init_std, bool with_bias)
    : ctx_(ctx),
      out_(out),
      weight_(ctx.store->add(weight_spec(name, Shape{out, in}, 1, TpSplit::InputFeatures, init_std),
                             ctx.tp.rank(), ctx.tp.size())),
      bias_(maybe_bias(ctx, with_bias,
                       bias_spec(name, Shape{out}, -1,
                                 ctx.tp.sequence_parallel() ? TpGrad::Partial : TpGrad::Full))) {}

Tensor RowParallelLinear::forward(const Tensor& x, Saved& saved, MemoryCategory category,
                                  const TensorParallel* tp, const Tensor* residual) {
  Backend& be = *ctx_.backend;
  const TensorParallel& group = tp ? *tp : ctx_.tp;
  saved.inp = x;
  // Under sequence parallelism the partial sums are reduce-scattered into a new, smaller
  // tensor and are a temporary; otherwise they are reduced in place and become the output.
  const MemoryCategory partial_category =
      group.sequence_parallel() && group.size() > 1 ? MemoryCategory::Workspace : category;
  Tensor partial = be.empty(Shape{x.dim(0), out_}, x.dtype(), partial_category);
  // Alone in its group the product is the output, and the GEMM's epilogue adds the bias and
  // the residual (passes over the output saved); otherwise they are added once, after the
  // reduction.
  const bool alone = group.size() == 1;
  const Tensor* bias = bias_ ? &bias_->value : nullptr;
  if (alone && residual) {
    be.matmul_forward_add(partial, x, weight_.value, bias, *residual);
    return exit_tp_region_forward(be, group, partial, category);
  }
  be.matmul_forward(partial, x, weight_.value, alone ? bias : nullptr);
  Tensor out = exit_tp_region_forward(be, group, partial, category);
  if (!alone && bias) be.bias_forward(out, *bias);
  if (residual) be.add_inplace(out, *residual);
  return out;
}

Tensor RowParallelLinear::backward(const Tensor& dy, const Saved& saved,
                                   DeferredWeightGradients* deferred) {
  return backward_through(dy, saved, nullptr, deferred);
}

Tensor RowParallelLinear::backward_gelu(const Tensor& dy, const Saved& saved, const Tensor& pre,
                                        DeferredWeightGradients* deferred) {
  return backward_through(dy, saved, &pre, deferred);
}

Tensor RowParallelLinear::backward_through(const Tensor& dy, const Saved& saved,
                                           const Tensor* gelu_pre,
                                           DeferredWeightGradients* deferred) {
  Backend& be = *ctx_.backend;
  Tensor dfull = exit_tp_region_backward(be, ctx_.tp, dy, MemoryCategory::Workspace);
  Tensor dinp = be.empty(saved.inp.shape(), saved.inp.dtype(), MemoryCategory::Workspace);
  if (gelu_pre)
    be.matmul_gelu_backward(dinp, dfull, weight_.value, *gelu_pre);
  else
    be.matmul_backward(&dinp, nullptr, nullptr, dfull, saved.inp, weight_.value);
  run_or_defer(deferred, [this, dy, dfull, inp = saved.inp] {
    if (bias_) {
      bias_->zero_grad_if_unwritten(*ctx_.backend);
      ctx_.backend->bias_backward(bias_->grad, dy);
    }
    ctx_.backend->matmul_backward(nullptr, &weight_.grad, nullptr, dfull, inp, Tensor{},
                                  weight_.take_grad_write());
  });
  return dinp;
}

void ColumnParallelLinear::add_costs(CostSheet& sheet) const {
  sheet.linears.push_back({in_, weight_.spec.global_shape.numel() / in_, TpSplitOf::Outputs});
  sheet.parameters.push_back(parameter_cost(weight_.spec));
  if (bias_) sheet.parameters.push_back(parameter_cost(bias_->spec));
}

void RowParallelLinear::add_costs(CostSheet& sheet) const {
  sheet.linears.push_back({weight_.spec.global_shape.numel() / out_, out_, TpSplitOf::Inputs});
  sheet.parameters.push_back(parameter_cost(weight_.spec));
  if (bias_) sheet.parameters.push_back(parameter_cost(bias_->spec));
}

}  // namespace meshtrain
