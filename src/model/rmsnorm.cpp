#include "meshtrain/model/rmsnorm.h"

#include "meshtrain/model/norm_parts.h"

namespace meshtrain {

RmsNorm::RmsNorm(const LayerContext& ctx, const std::string& name, int64_t C, double eps)
    : ctx_(ctx),
      weight_(ctx.store->add(norm_parameter_spec(name + ".weight", C, Init::Ones, ctx.tp),
                             ctx.tp.rank(), ctx.tp.size())),
      eps_(eps) {}

RmsNorm::RmsNorm(const LayerContext& ctx, const ParamSpec& weight, double eps)
    : ctx_(ctx), weight_(ctx.store->add(weight, ctx.tp.rank(), ctx.tp.size())), eps_(eps) {}

Tensor RmsNorm::forward(const Tensor& inp, Saved& saved, MemoryCategory category) {
  Backend& be = *ctx_.backend;
  Tensor out = be.empty(inp.shape(), inp.dtype(), category);
  saved.inp = inp;
  saved.rstd = be.empty({inp.dim(0)}, stats_dtype(inp.dtype()), category);
  be.rmsnorm_forward(out, saved.rstd, inp, weight_.value, eps_);
  return out;
}

Tensor RmsNorm::backward(const Tensor& dout, const Saved& saved) {
  Backend& be = *ctx_.backend;
  Tensor dinp = be.empty(saved.inp.shape(), saved.inp.dtype(), MemoryCategory::Workspace);
  weight_.zero_grad_if_unwritten(be);
  be.rmsnorm_backward(dinp, weight_.grad, dout, saved.inp, weight_.value, saved.rstd);
  return dinp;
}

Tensor RmsNorm::backward_add(const Tensor& dout, const Saved& saved, const Tensor& residual) {
  Backend& be = *ctx_.backend;
  Tensor dinp = be.empty(saved.inp.shape(), saved.inp.dtype(), MemoryCategory::Workspace);
  weight_.zero_grad_if_unwritten(be);
  be.rmsnorm_backward_add(dinp, weight_.grad, dout, saved.inp, weight_.value, saved.rstd,
                          residual);
  return dinp;
}

void RmsNorm::add_costs(CostSheet& sheet) const {
  sheet.parameters.push_back(parameter_cost(weight_.spec));
  add_norm_pass(sheet, weight_.spec.global_shape.numel());
}

}  // namespace meshtrain
