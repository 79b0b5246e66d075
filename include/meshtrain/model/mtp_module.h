#pragma once
// Multi-token prediction (DeepSeek-V3, arXiv 2412.19437 section 2.2; Hugging Face's MtpLayer in
// transformers/modeling_layers.py): after the head, depth k = 1..D predicts token t + k + 1 at
// position t from the previous depth's state and the embedding of token t + k:
//   h_0  = the head's normed input (the final norm's output, as HF feeds it)
//   u_k  = eh_proj([enorm(wte[token_{t+k}]) | hnorm(h_{k-1})])      eh_proj (C, 2C), embedding first
//   h_k  = norm_k(Block_k(u_k))                                      HF's shared_head.norm
//   L_k  = mean over positions t < T - k of CE(h_k @ W_head^T, token_{t+k+1})
// and the objective gains (lambda / D) sum_k L_k. The token embedding and the output head are the
// main model's (shared, as DeepSeek-V3 shares them); each depth's block is one of the model's
// kind (latent attention, a mixture of experts when the model has them). token_{t+k} is the
// micro-batch's target at t + k - 1, so depth k reads the targets only.
//
// Training only, and inside the head's call like the head's own backward (model/lm_head.h): all
// depths' forward and backward run there, the weight gradients accumulate (+=), and only
// d(objective)/d(h_0) leaves, to join the head's gradient before the final norm's backward. No
// activation outlives the call, so pipelines and recomputation never see the module. Eval and
// generation skip it; the main loss stays the head's.

#include <memory>
#include <vector>

#include "meshtrain/model/block.h"
#include "meshtrain/model/cost_sheet.h"
#include "meshtrain/model/layer.h"
#include "meshtrain/model/model_spec.h"
#include "meshtrain/model/norm.h"
#include "meshtrain/model/replicated_linear.h"

namespace meshtrain {

class MultiTokenPrediction {
 public:
  // Its parameters are named "mtp.<k>.{enorm,hnorm,eh_proj,norm}..." and "mtp.<k>.block...."
  // (k from 0), block k being layer spec.layers + k. wte: the token embedding this rank reads
  // (its vocabulary slice); head_weight: the output head's slice (wte itself when tied).
  MultiTokenPrediction(const LayerContext& ctx, const ModelSpec& spec, Parameter& wte,
                       Parameter& head_weight);
  ~MultiTokenPrediction();

  // h0 (N_local, C): the head's normed input; targets (N) int32 as the head's. dloss: the head's
  // d(objective)/d(per-token loss) (1 / tokens of the step). Returns d(objective)/d(h0)
  // (N_local, C) in Workspace.
  Tensor forward_backward(const Tensor& h0, const Tensor& targets, TokenShape shape, double dloss);

  // Per depth, the sum of its cross-entropies since the last take() and the rows they were
  // summed over (zeros on tensor ranks other than 0, which compute the same sums): 2 D numbers.
  std::vector<double> take_sums();
  int depths() const { return static_cast<int>(depths_.size()); }
  // Every depth's layers, and its second pass over the head's GEMM and cross-entropy.
  void add_costs(CostSheet& sheet) const;

 private:
  struct Depth;
  struct Rows;
  std::vector<int32_t> sequence_targets(const Tensor& targets, const TokenShape& shape) const;
  Rows rows_of(const std::vector<int32_t>& whole, TokenShape shape, int k) const;

  LayerContext ctx_;
  Parameter& wte_;
  Parameter& head_weight_;
  double loss_weight_;  // lambda / D
  std::vector<std::unique_ptr<Depth>> depths_;
};

}  // namespace meshtrain
