#include "meshtrain/model/swiglu_mlp.h"

namespace meshtrain {

SwiGluMlp::SwiGluMlp(const LayerContext& ctx, const std::string& name, int64_t C, int64_t hidden,
                     double residual_scale, bool with_bias)
    : ctx_(ctx),
      gate_(ctx, name + ".gate", Shape{hidden, C}, 0, Shape{hidden}, 0.02, with_bias),
      up_(ctx, name + ".up", Shape{hidden, C}, 0, Shape{hidden}, 0.02, with_bias),
      gate_up_({&gate_, &up_}),
      down_(ctx, name + ".down", hidden, C, 0.02 * residual_scale, with_bias) {}

Tensor SwiGluMlp::forward(const Tensor& x, Saved& saved, MemoryCategory category,
                          MemoryCategory out_category, const TensorParallel* tp,
                          const Tensor* residual) {
  Backend& be = *ctx_.backend;
  saved.gate_up = gate_up_.forward(x, saved.in, category, tp);
  Tensor h = be.empty({saved.gate_up.dim(0), gate_.local_out()}, x.dtype(), category);
  be.swiglu_forward_packed(h, saved.gate_up);
  return down_.forward(h, saved.down_in, out_category, tp, residual);
}

Tensor SwiGluMlp::backward(const Tensor& dy, const Saved& saved, DeferredWeightGradients* deferred) {
  Backend& be = *ctx_.backend;
  const Tensor dh = down_.backward(dy, saved.down_in, deferred);
  Tensor dgate_up = be.empty(saved.gate_up.shape(), dh.dtype(), MemoryCategory::Workspace);
  be.swiglu_backward_packed(dgate_up, dh, saved.gate_up);
  return gate_up_.backward(dgate_up, saved.in, deferred);
}

void SwiGluMlp::add_costs(CostSheet& sheet) const {
  gate_.add_costs(sheet);
  up_.add_costs(sheet);
  // SwiGLU reads gate and up and writes their product; backward reads the three and writes two.
  sheet.add_pass_over_last_outputs(3, 5);
  down_.add_costs(sheet);
}

}  // namespace meshtrain
