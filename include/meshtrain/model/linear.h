#pragma once
// Tensor-parallel linear layers (Megatron-LM, arXiv 1909.08053). Weights are (out, in) globally.
//
//   ColumnParallelLinear  splits the OUTPUT dimension: each rank computes its slice of the
//                         outputs from the full input. Input crosses enter_tp_region.
//   RowParallelLinear     splits the INPUT dimension: each rank multiplies its slice of the
//                         inputs, the partial outputs are summed (exit_tp_region), then the
//                         bias, replicated, is added once.
//
// A column-parallel weight may also be given as (k, out/k..., in) blocks (the attention QKV
// weight is (3, C, C)); `split_dim` names the dimension that holds the output features.
//
// With `replicas` > 1 (tensor parallelism beyond the key/value heads, as Megatron-Core replicates
// its query groups when tp > num_query_groups) the outputs split into tp / replicas parts, each
// computed by `replicas` consecutive ranks. The weight is then stored whole on every rank
// (replicated, so checkpoints and ZeRO see it as any replicated parameter); a rank multiplies
// only its part's rows and writes only their gradient, leaving zeros elsewhere, so the sum over
// the tensor group (TpGrad::Partial) is each part's gradient summed over the ranks that share it.

#include <string>

#include "meshtrain/model/cost_sheet.h"
#include "meshtrain/model/weight_gradients.h"
#include "meshtrain/model/layer.h"

namespace meshtrain {

class ColumnParallelLinear {
 public:
  struct Saved {
    Tensor inp;  // (N, C): the input after entering the tensor region (gathered under SP)
  };
  // weight_shape: the global weight, split along split_dim; bias_shape: the global bias, split
  // along its last dimension. with_bias false: no bias (Llama's linears).
  ColumnParallelLinear(const LayerContext& ctx, const std::string& name, Shape weight_shape,
                       int split_dim, Shape bias_shape, double init_std, bool with_bias = true,
                       int replicas = 1);

  // x (N_local, C) -> (N, OC / tp). `tp`: the layer's own, or another setting of the same
  // group (generation runs one token, without sequence parallelism: tp_without_sequence()).
  Tensor forward(const Tensor& x, Saved& saved, MemoryCategory category,
                 const TensorParallel* tp = nullptr);
  // As forward, then GELU: returns gelu(out); `pre` receives out, which the GELU's gradient
  // reads (RowParallelLinear::backward_gelu). One backend call (Backend::matmul_gelu_forward).
  Tensor forward_gelu(const Tensor& x, Saved& saved, Tensor& pre, MemoryCategory category,
                      const TensorParallel* tp = nullptr);
  // dy (N, OC / tp) -> dx (N_local, C); the weight and bias gradients now, or kept in
  // `deferred` (model/weight_gradients.h).
  Tensor backward(const Tensor& dy, const Saved& saved, DeferredWeightGradients* deferred = nullptr);

  // Two column-parallel layers that read the same input (SwiGLU's gate and up) enter the tensor
  // region once: forward_entered reads the input another layer's forward entered (its Saved),
  // and backward_in_region returns the input gradient inside the region, (N, C), which the
  // caller sums and leaves once (leave_region_backward).
  Tensor forward_entered(const Saved& entered, MemoryCategory category);
  Tensor backward_in_region(const Tensor& dy, const Saved& saved,
                            DeferredWeightGradients* deferred = nullptr);
  Tensor leave_region_backward(const Tensor& dinp);
  int64_t local_out() const { return local_out_; }
  // Its GEMMs and parameters, from its global shapes (model/cost_sheet.h).
  void add_costs(CostSheet& sheet) const;
  Parameter* bias() { return bias_; }  // null without a bias
  bool has_bias() const { return bias_ != nullptr; }
  Parameter& weight() { return weight_; }
  int64_t in() const { return in_; }
  const LayerContext& context() const { return ctx_; }

 private:
  // This rank's rows of a weight-shaped (or bias-shaped) tensor: (local_out, in) / (local_out).
  Tensor weight_rows(const Tensor& t) const;
  Tensor bias_rows(const Tensor& t) const;
  // The weight and bias gradients of dy and the entered input, into this rank's rows.
  void write_weight_gradients(const Tensor& dy, const Tensor& inp);
  // forward's product, through the GELU into `out` when `gelu_pre` is given.
  Tensor forward_through(const Tensor& x, Saved& saved, Tensor* gelu_pre,
                         MemoryCategory category, const TensorParallel* tp);

  LayerContext ctx_;
  int64_t in_;
  int replicas_;           // ranks sharing each part of the outputs (1: an even split)
  Parameter& weight_;
  Parameter* bias_;        // null: none
  int64_t local_out_;      // this rank's output features
  int64_t row_begin_ = 0;  // their first row in the whole weight (replicas > 1)
};

class RowParallelLinear {
 public:
  struct Saved {
    Tensor inp;  // (N, C / tp)
  };
  RowParallelLinear(const LayerContext& ctx, const std::string& name, int64_t in, int64_t out,
                    double init_std, bool with_bias = true);

  // x (N, C / tp) -> (N_local, OC); `tp` as for ColumnParallelLinear::forward. With a
  // `residual` (N_local, OC) the output is the layer's plus the residual, added in the GEMM's
  // epilogue where the layer is alone in its tensor-parallel group.
  Tensor forward(const Tensor& x, Saved& saved, MemoryCategory category,
                 const TensorParallel* tp = nullptr, const Tensor* residual = nullptr);
  // dy (N_local, OC) -> dx (N, C / tp); the weight and bias gradients as for the column layer.
  Tensor backward(const Tensor& dy, const Saved& saved, DeferredWeightGradients* deferred = nullptr);
  // As backward, for an input that was gelu(pre): returns the gradient of `pre`
  // (Backend::matmul_gelu_backward).
  Tensor backward_gelu(const Tensor& dy, const Saved& saved, const Tensor& pre,
                       DeferredWeightGradients* deferred = nullptr);
  void add_costs(CostSheet& sheet) const;  // as ColumnParallelLinear's

 private:
  // The input gradient, through the GELU when `gelu_pre` is given.
  Tensor backward_through(const Tensor& dy, const Saved& saved, const Tensor* gelu_pre,
                          DeferredWeightGradients* deferred);

  LayerContext ctx_;
  int64_t out_;
  Parameter& weight_;
  Parameter* bias_;  // null: none
};

}  // namespace meshtrain
