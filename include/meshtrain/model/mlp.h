#pragma once
// The block's MLP: fc (C -> H, column-parallel), GELU (tanh), proj (H -> C, row-parallel); GPT-2
// has H = 4C.

#include <string>

#include "meshtrain/model/layer.h"
#include "meshtrain/model/linear.h"

namespace meshtrain {

class Mlp {
 public:
  struct Saved {
    ColumnParallelLinear::Saved fc_in;
    Tensor fc_out;                     // (N, 4C / tp), before GELU
    RowParallelLinear::Saved proj_in;  // GELU output (N, 4C / tp)
  };

  // with_bias false: neither linear has a bias.
  Mlp(const LayerContext& ctx, const std::string& name, int64_t C, int64_t hidden, double residual_scale,
      bool with_bias = true);

  // x (N_local, C) -> (N_local, C); intermediates in `category`, the output in `out_category`.
  // `tp` as for ColumnParallelLinear::forward; `residual`, where given, is added to the output
  // (RowParallelLinear::forward).
  Tensor forward(const Tensor& x, Saved& saved, MemoryCategory category,
                 MemoryCategory out_category, const TensorParallel* tp = nullptr,
                 const Tensor* residual = nullptr);
  Tensor backward(const Tensor& dy, const Saved& saved, DeferredWeightGradients* deferred = nullptr);
  // Its two linears and the GELU between them (model/cost_sheet.h).
  void add_costs(CostSheet& sheet) const;

 private:
  LayerContext ctx_;
  ColumnParallelLinear fc_;
  RowParallelLinear proj_;
};

}  // namespace meshtrain
