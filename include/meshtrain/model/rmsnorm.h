#pragma once
// RMSNorm over channels (Llama, Qwen): x / rms(x) * weight, with weight (ones) and no bias, eps
// from the spec (model.norm_eps). Replicated over the tensor group as LayerNorm is
// (model/norm_parts.h).

#include <string>

#include "meshtrain/model/cost_sheet.h"
#include "meshtrain/model/layer.h"

namespace meshtrain {

class RmsNorm {
 public:
  struct Saved {
    Tensor inp;   // (N_local, C)
    Tensor rstd;  // (N_local), stats dtype
  };

  RmsNorm(const LayerContext& ctx, const std::string& name, int64_t C, double eps);
  // A weight of another spec (Qwen 3's per-head norm: model/qkv_projection.h).
  RmsNorm(const LayerContext& ctx, const ParamSpec& weight, double eps);

  Tensor forward(const Tensor& inp, Saved& saved, MemoryCategory category);
  Tensor backward(const Tensor& dout, const Saved& saved);
  Tensor backward_add(const Tensor& dout, const Saved& saved, const Tensor& residual);
  void add_costs(CostSheet& sheet) const;
  const ParamSpec& weight_spec() const { return weight_.spec; }

 private:
  LayerContext ctx_;
  Parameter& weight_;
  double eps_;
};

}  // namespace meshtrain
