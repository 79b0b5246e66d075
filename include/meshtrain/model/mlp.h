#pragma once
// The block's MLP: fc (C -> 4C, column-parallel), GELU (tanh), proj (4C -> C, row-parallel).

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

  Mlp(const LayerContext& ctx, const std::string& name, int64_t C, double residual_scale);

  // x (N_local, C) -> (N_local, C); intermediates in `category`, the output in `out_category`.
  // `tp` as for ColumnParallelLinear::forward; `residual`, where given, is added to the output
  // (RowParallelLinear::forward).
  Tensor forward(const Tensor& x, Saved& saved, MemoryCategory category,
                 MemoryCategory out_category, const TensorParallel* tp = nullptr,
                 const Tensor* residual = nullptr);
  Tensor backward(const Tensor& dy, const Saved& saved, DeferredWeightGradients* deferred = nullptr);

 private:
  LayerContext ctx_;
  ColumnParallelLinear fc_;
  RowParallelLinear proj_;
};

}  // namespace meshtrain
