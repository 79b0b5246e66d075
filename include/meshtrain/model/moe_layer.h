#pragma once
// A mixture-of-experts feed-forward (Shazeer et al. 2017; Mixtral, arXiv 2401.04088; Qwen3-MoE;
// DeepSeek-V3, arXiv 2412.19437), in place of the dense one where ModelSpec::moe_layer says:
//   router: logits (N, E) = x @ router^T (no bias), routed on the host (model/moe_routing.h);
//   dispatch: x's rows copied into expert-sorted order, each token once per chosen expert;
//   experts: per expert e, down_e(silu(gate_e(x_e)) * up_e(x_e)) on its contiguous rows;
//   combine: each token's expert outputs weighted by its gates, in the order of its choices;
//   plus a shared SwiGLU expert every token passes (shared_ffn_hidden > 0).
// Dropless: every choice is computed, so routing and the result are the same on every layout.
//
// Expert parallelism (LayerContext::ep) splits the experts over the expert group: each rank
// holds E / ep of them (dimension 0 of the expert weights) and its rows travel to their
// experts' ranks and back (model/expert_exchange.h); routing, the losses and the combine stay
// with the tokens. The shared expert runs while the rows travel.
//
// The experts are whole on every tensor rank (Megatron's expert tensor parallelism 1): each rank
// routes the tokens it holds (all of them without sequence parallelism, its N/tp share with it),
// so the expert and router gradients are partial over tp exactly when sequence parallelism is on.
// The balancing losses need the micro-batch's sums over the ranks sharing it (the
// sequence-parallel tensor group, the context group): one all-reduce of 2E + 2 numbers each.
//
// The router's GEMM runs in fp32 under bf16 (its input and weight widened, as Megatron's
// moe_router_dtype does): a near-tie between two experts is decided on fp32 logits.
//
// Parameters (global shapes): <name>.router.weight (E, C); <name>.experts.gate.weight and
// .experts.up.weight (E, F, C), .experts.down.weight (E, C, F); the shared expert's
// <name>.shared.gate/up/down.weight as SwiGluMlp's.

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "meshtrain/model/cost_sheet.h"
#include "meshtrain/model/layer.h"
#include "meshtrain/model/expert_exchange.h"
#include "meshtrain/model/model_spec.h"
#include "meshtrain/model/moe_routing.h"
#include "meshtrain/model/swiglu_mlp.h"

namespace meshtrain {

class MixtureOfExperts {
 public:
  struct Saved {
    Tensor x;                                // (N, C) the layer's input
    Tensor router_x;                         // x in the router's dtype (fp32 under bf16)
    std::shared_ptr<const Routing> routing;  // host
    std::vector<double> balance_grad;        // (N, E) the balancing losses' logit gradient
    Tensor token_of_row, gate_of_row;        // (M, 1) int32, wide: combine's gradient
    Tensor row_of_choice, gates;             // (N, k) int32, wide: combine and dispatch's gradient
    std::shared_ptr<const ExpertExchange> exchange;  // the rows' way to their experts and back
    Tensor xe, gate, up, hidden;             // the expert side's R rows: (R, C), (R, F) x 3
    Tensor ys;                               // the experts' outputs, expert-sorted (M, C)
    SwiGluMlp::Saved shared;
  };

  MixtureOfExperts(const LayerContext& ctx, const std::string& name, const ModelSpec& spec,
                   int layer, double residual_scale);

  // As FeedForward::forward; `shape` carries the micro-batch's loss weight (TokenShape), which
  // the balancing losses take their gradient with (0: evaluation or generation, no losses).
  // `recomputing`: a re-run of a forward already counted (full recomputation): the losses and
  // the expert loads are not logged again.
  Tensor forward(const Tensor& x, const TokenShape& shape, bool recomputing, Saved& saved,
                 MemoryCategory category, MemoryCategory out_category,
                 const TensorParallel* tp = nullptr, const Tensor* residual = nullptr);
  Tensor backward(const Tensor& dy, const Saved& saved, DeferredWeightGradients* deferred = nullptr);
  void add_costs(CostSheet& sheet) const;

 private:
  // The routing of x's rows (read to the host), its balancing sums over the sharing ranks, and
  // the losses' gradient and log entries.
  std::shared_ptr<const Routing> route(const Tensor& x, const TokenShape& shape, bool recomputing,
                                       Saved& saved);
  // The router's weight in `dtype` (its compute copy, widened from bf16 to fp32).
  Tensor router_weight(DType dtype) const;
  // This rank's experts of `t` (p's value or gradient), stacked (local experts, rows, cols).
  Tensor local_experts(const Tensor& t, const Parameter& p, const ExpertExchange& x) const;

  LayerContext ctx_;
  MoeSpec spec_;
  int layer_;
  int64_t C_, F_;
  Parameter& router_;
  Parameter& gate_;
  Parameter& up_;
  Parameter& down_;
  std::optional<SwiGluMlp> shared_;
  // The planner's dry run routes every micro-batch of N tokens the same way: built once.
  std::shared_ptr<const Routing> planned_routing_;
  // ... and so are its sequences' sums, for a given split of the tokens into sequences: summed
  // once (over N x experts, the dry run's hottest loop at DeepSeek-V3's shape), not per pass.
  struct PlannedSums {
    const Routing* routing = nullptr;
    int64_t begin = -1, T = 0, B = 0;
    std::vector<double> sums;
  };
  PlannedSums planned_sums_;
};

}  // namespace meshtrain
