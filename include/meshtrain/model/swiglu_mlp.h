#pragma once
// The SwiGLU feed-forward (Shazeer, arXiv 2002.05202; Llama, Qwen):
//   down(silu(gate(x)) * up(x)),  gate and up C -> F column-parallel, down F -> C row-parallel.
// gate and up are two layers (Hugging Face's gate_proj and up_proj), each split by columns, so a
// rank's slices of the two pair up without interleaving; they run as one product whose rows
// hold gate's columns then up's (model/stacked_columns.h), which SwiGLU reads in place
// (Backend::swiglu_forward_packed), and its gradient, written in the same layout, is one
// product back to the input.

#include <string>

#include "meshtrain/model/cost_sheet.h"
#include "meshtrain/model/layer.h"
#include "meshtrain/model/linear.h"
#include "meshtrain/model/stacked_columns.h"

namespace meshtrain {

class SwiGluMlp {
 public:
  struct Saved {
    ColumnParallelLinear::Saved in;    // x in the tensor region, read by gate and up
    Tensor gate_up;                    // (N, 2F / tp): gate's columns, then up's
    RowParallelLinear::Saved down_in;  // silu(gate) * up, (N, F / tp)
  };

  SwiGluMlp(const LayerContext& ctx, const std::string& name, int64_t C, int64_t hidden,
            double residual_scale, bool with_bias);

  // As Mlp::forward.
  Tensor forward(const Tensor& x, Saved& saved, MemoryCategory category,
                 MemoryCategory out_category, const TensorParallel* tp = nullptr,
                 const Tensor* residual = nullptr);
  Tensor backward(const Tensor& dy, const Saved& saved, DeferredWeightGradients* deferred = nullptr);
  void add_costs(CostSheet& sheet) const;

 private:
  LayerContext ctx_;
  ColumnParallelLinear gate_;
  ColumnParallelLinear up_;
  StackedColumns gate_up_;
  RowParallelLinear down_;
};

}  // namespace meshtrain
