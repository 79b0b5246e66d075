#include "meshtrain/model/layernorm.h"

#include "meshtrain/model/norm_parts.h"

namespace meshtrain {

LayerNorm::LayerNorm(const LayerContext& ctx, const std::string& name, int64_t C)
    : ctx_(ctx),
      weight_(ctx.store->add(norm_parameter_spec(name + ".weight", C, Init::Ones, ctx.tp), ctx.tp.rank(),
                             ctx.tp.size())),
      bias_(ctx.store->add(norm_parameter_spec(name + ".bias", C, Init::Zeros, ctx.tp), ctx.tp.rank(),
                           ctx.tp.size())) {}

Tensor LayerNorm::forward(const Tensor& inp, Saved& saved, MemoryCategory category) {
  Backend& be = *ctx_.backend;
  const int64_t N = inp.dim(0);
  Tensor out = be.empty(inp.shape(), inp.dtype(), category);
  saved.inp = inp;
  saved.mean = be.empty({N}, stats_dtype(inp.dtype()), category);
  saved.rstd = be.empty({N}, stats_dtype(inp.dtype()), category);
  be.layernorm_forward(out, saved.mean, saved.rstd, inp, weight_.value, bias_.value);
  return out;
}

Tensor LayerNorm::backward(const Tensor& dout, const Saved& saved) {
  Backend& be = *ctx_.backend;
  Tensor dinp = be.empty(saved.inp.shape(), saved.inp.dtype(), MemoryCategory::Workspace);
  weight_.zero_grad_if_unwritten(be);
  bias_.zero_grad_if_unwritten(be);
  be.layernorm_backward(dinp, weight_.grad, bias_.grad, dout, saved.inp, weight_.value, saved.mean,
                        saved.rstd);
  return dinp;
}

Tensor LayerNorm::backward_add(const Tensor& dout, const Saved& saved, const Tensor& residual) {
  Backend& be = *ctx_.backend;
  Tensor dinp = be.empty(saved.inp.shape(), saved.inp.dtype(), MemoryCategory::Workspace);
  weight_.zero_grad_if_unwritten(be);
  bias_.zero_grad_if_unwritten(be);
  be.layernorm_backward_add(dinp, weight_.grad, bias_.grad, dout, saved.inp, weight_.value,
                            saved.mean, saved.rstd, residual);
  return dinp;
}


void LayerNorm::add_costs(CostSheet& sheet) const {
  sheet.parameters.push_back(parameter_cost(weight_.spec));
  sheet.parameters.push_back(parameter_cost(bias_.spec));
  add_norm_pass(sheet, weight_.spec.global_shape.numel());
}
}  // namespace meshtrain
