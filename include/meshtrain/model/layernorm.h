#pragma once
// LayerNorm over channels, eps 1e-5, with weight (ones) and bias (zeros). Its parameters are
// replicated over the tensor group; under sequence parallelism each rank normalises only its
// own tokens, so its parameter gradients are partial and summed over the group.

#include <string>

#include "meshtrain/model/cost_sheet.h"
#include "meshtrain/model/layer.h"

namespace meshtrain {

class LayerNorm {
 public:
  struct Saved {
    Tensor inp;   // (N_local, C)
    Tensor mean;  // (N_local)
    Tensor rstd;  // (N_local)
  };

  LayerNorm(const LayerContext& ctx, const std::string& name, int64_t C);

  // out (N_local, C), in `category`.
  Tensor forward(const Tensor& inp, Saved& saved, MemoryCategory category);
  // Returns dinp (N_local, C); accumulates weight and bias gradients.
  Tensor backward(const Tensor& dout, const Saved& saved);
  // backward(dout, saved) + residual: the input's gradient with the residual path's added, in
  // one pass where the device fuses them.
  Tensor backward_add(const Tensor& dout, const Saved& saved, const Tensor& residual);
  // Its parameters and its pass over the residual stream (model/cost_sheet.h).
  void add_costs(CostSheet& sheet) const;

 private:
  LayerContext ctx_;
  Parameter& weight_;
  Parameter& bias_;
};

}  // namespace meshtrain
