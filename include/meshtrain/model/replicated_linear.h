#pragma once
// A bias-free linear layer whose weight is whole on every tensor rank, multiplying the rows the
// rank holds where it stands (the block's input: every token, or this rank's N / tp under
// sequence parallelism): latent attention's down-projections (model/latent_attention.h),
// which Megatron-Core also keeps "duplicated" rather than split. Its output enters the tensor
// region after it, so the input gradient arriving here is already the whole one for these rows;
// the weight's gradient is then the full gradient without sequence parallelism and a partial
// one (each rank saw its own tokens, summed over the group) with it, as a norm's is
// (model/norm_parts.h).

#include <string>

#include "meshtrain/model/cost_sheet.h"
#include "meshtrain/model/layer.h"
#include "meshtrain/model/weight_gradients.h"

namespace meshtrain {

// The spec of a weight `name`.weight whole on every tensor rank, initialised N(0, init_std), its
// gradient full without sequence parallelism and partial (each rank's own tokens) with it:
// ReplicatedLinear's, and the mixture's router and experts' (model/moe_layer.h).
ParamSpec replicated_weight_spec(const std::string& name, Shape shape, double init_std,
                                 const TensorParallel& tp);

class ReplicatedLinear {
 public:
  // weight (out, in), initialised N(0, init_std).
  ReplicatedLinear(const LayerContext& ctx, const std::string& name, int64_t in, int64_t out,
                   double init_std);

  // x (N_local, in) -> (N_local, out).
  Tensor forward(const Tensor& x, MemoryCategory category);
  // dy (N_local, out) and forward's x -> dx (N_local, in); the weight's gradient now or in
  // `deferred`.
  Tensor backward(const Tensor& dy, const Tensor& x, DeferredWeightGradients* deferred);
  // Its GEMMs (on the rows where it stands: not split over tp) and its parameter.
  void add_costs(CostSheet& sheet) const;

 private:
  LayerContext ctx_;
  int64_t in_, out_;
  Parameter& weight_;
};

}  // namespace meshtrain
