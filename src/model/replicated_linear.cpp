#include "meshtrain/model/replicated_linear.h"

namespace meshtrain {

ParamSpec replicated_weight_spec(const std::string& name, Shape shape, double init_std,
                                 const TensorParallel& tp) {
  ParamSpec s;
  s.name = name + ".weight";
  s.global_shape = std::move(shape);
  s.init = Init::Normal;
  s.init_std = init_std;
  s.tp_grad = tp.sequence_parallel() ? TpGrad::Partial : TpGrad::Full;
  return s;
}

namespace {
// A block's matrix like the split linears' (model/linear.cpp): Muon's, under train.optimizer = "muon".
ParamSpec down_projection_spec(const std::string& name, int64_t in, int64_t out, double init_std,
                               const TensorParallel& tp) {
  ParamSpec s = replicated_weight_spec(name, Shape{out, in}, init_std, tp);
  s.role = ParamRole::HiddenMatrix;
  return s;
}
}  // namespace

ReplicatedLinear::ReplicatedLinear(const LayerContext& ctx, const std::string& name, int64_t in,
                                   int64_t out, double init_std)
    : ctx_(ctx),
      in_(in),
      out_(out),
      weight_(ctx.store->add(down_projection_spec(name, in, out, init_std, ctx.tp), ctx.tp.rank(),
                             ctx.tp.size())) {}

Tensor ReplicatedLinear::forward(const Tensor& x, MemoryCategory category) {
  Backend& be = *ctx_.backend;
  Tensor out = be.empty(Shape{x.dim(0), out_}, x.dtype(), category);
  be.matmul_forward(out, x, weight_.value.reshape({out_, in_}), nullptr);
  return out;
}

Tensor ReplicatedLinear::backward(const Tensor& dy, const Tensor& x,
                                  DeferredWeightGradients* deferred) {
  Backend& be = *ctx_.backend;
  Tensor dx = be.empty(x.shape(), x.dtype(), MemoryCategory::Workspace);
  be.matmul_backward(&dx, nullptr, nullptr, dy, x, weight_.value.reshape({out_, in_}));
  run_or_defer(deferred, [this, dy, x] {
    Tensor dw = weight_.grad.reshape({out_, in_});
    ctx_.backend->matmul_backward(nullptr, &dw, nullptr, dy, x, Tensor{}, weight_.take_grad_write());
  });
  return dx;
}

void ReplicatedLinear::add_costs(CostSheet& sheet) const {
  sheet.linears.push_back({in_, out_, TpSplitOf::None});
  sheet.parameters.push_back(parameter_cost(weight_.spec));
}

}  // namespace meshtrain
