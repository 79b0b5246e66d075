#include "meshtrain/model/mlp.h"

namespace meshtrain {

Mlp::Mlp(const LayerContext& ctx, const std::string& name, int64_t C, int64_t hidden,
         double residual_scale, bool with_bias)
    : ctx_(ctx),
      fc_(ctx, name + ".fc", Shape{hidden, C}, 0, Shape{hidden}, 0.02, with_bias),
      proj_(ctx, name + ".proj", hidden, C, 0.02 * residual_scale, with_bias) {}

Tensor Mlp::forward(const Tensor& x, Saved& saved, MemoryCategory category,
                    MemoryCategory out_category, const TensorParallel* tp,
                    const Tensor* residual) {
  const Tensor g = fc_.forward_gelu(x, saved.fc_in, saved.fc_out, category, tp);
  return proj_.forward(g, saved.proj_in, out_category, tp, residual);
}

Tensor Mlp::backward(const Tensor& dy, const Saved& saved, DeferredWeightGradients* deferred) {
  const Tensor dh = proj_.backward_gelu(dy, saved.proj_in, saved.fc_out, deferred);
  return fc_.backward(dh, saved.fc_in, deferred);
}


void Mlp::add_costs(CostSheet& sheet) const {
  fc_.add_costs(sheet);
  sheet.add_pass_over_last_outputs(2, 4);  // GELU over the hidden activations
  proj_.add_costs(sheet);
}
}  // namespace meshtrain
