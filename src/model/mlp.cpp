#include "meshtrain/model/mlp.h"

namespace meshtrain {

Mlp::Mlp(const LayerContext& ctx, const std::string& name, int64_t C, double residual_scale)
    : ctx_(ctx),
      fc_(ctx, name + ".fc", Shape{4 * C, C}, 0, Shape{4 * C}, 0.02),
      proj_(ctx, name + ".proj", 4 * C, C, 0.02 * residual_scale) {}

Tensor Mlp::forward(const Tensor& x, Saved& saved, MemoryCategory category,
                    MemoryCategory out_category, const TensorParallel* tp) {
  Backend& be = *ctx_.backend;
  saved.fc_out = fc_.forward(x, saved.fc_in, category, tp);
  Tensor g = be.empty(saved.fc_out.shape(), x.dtype(), category);
  be.gelu_forward(g, saved.fc_out);
  return proj_.forward(g, saved.proj_in, out_category, tp);
}

Tensor Mlp::backward(const Tensor& dy, const Saved& saved, DeferredWeightGradients* deferred) {
  Backend& be = *ctx_.backend;
  Tensor dg = proj_.backward(dy, saved.proj_in, deferred);
  Tensor dh = be.empty(dg.shape(), dg.dtype(), MemoryCategory::Workspace);
  be.gelu_backward(dh, saved.fc_out, dg);
  return fc_.backward(dh, saved.fc_in, deferred);
}

}  // namespace meshtrain
