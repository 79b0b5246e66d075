#pragma once
// The router of a mixture of experts, on the host (model/moe_layer.h runs it between the router's
// GEMM and the experts'): each token's scores over the experts, its top-k, its gates, the order
// in which the experts receive the tokens, and the balancing losses with their gradients.
//
// Two kinds (MoeSpec::router):
// - softmax (Mixtral, Qwen3-MoE): scores p = softmax(logits), the top k chosen by score;
// - sigmoid (DeepSeek-V3, arXiv 2412.19437, eqs. 15-16): scores s = sigmoid(logits), the top k
//   chosen by s_e + b_e, where b is the per-expert bias of auxiliary-loss-free balancing
//   (model/expert_bias.h): it only chooses, so no gradient reaches it, and the gates use s.
//   With MoeSpec::groups > 1 (DeepSeek-V3's noaux_tc), the experts form `groups` groups of
//   consecutive indices, a group's score is the sum of its two largest s_e + b_e, and the top k
//   is chosen among the experts of the top_groups best groups only (equal group scores: the lower
//   group index). The choice of groups is discrete, like the top k: no gradient flows through it.
// Either way a token's gates are its chosen scores, divided by their sum when normalize_top_k,
// times route_scale (DeepSeek's routed_scaling_factor).
//
// Routing is read back to the host because the expert GEMMs need their row counts there anyway
// (Megatron-Core's token dispatcher synchronises for the same reason), and on the host it is
// computed in fp64, the same on every device and every layout:
// - top-k ties go to the lower expert index, and a token's choices are ordered by probability
//   (then index), so the combine adds its experts' outputs in one fixed order;
// - the expert-sorted order lists expert 0's tokens first, each expert's in token order.
//
// Capacity (MoeSpec::capacity_factor > 0; Megatron's moe_expert_capacity_factor): an expert
// takes at most ceil(factor x tokens x top_k / E) of the tokens routed here. Of more, it keeps
// those whose gates are highest (Megatron's "probs" drop policy; equal gates: the earlier
// token): a dropped choice is the one that weighed least in its token's output, whereas dropping
// the latest positions would always cut the same end of the micro-batch. A dropped choice has
// no row (row_of_choice -1) and adds nothing; the token's other gates are not renormalised (a
// token whose expert was full keeps less of the experts' output, as in Megatron and GShard),
// and the balancing losses count what the router chose, dropped or not.
//
// Balancing losses, k choices of E experts per token:
//   load balance (Switch, Fedus et al., arXiv 2101.03961, over each sequence as DeepSeek-V3's
//   sequence-wise loss is, arXiv 2412.19437): for a sequence of T tokens
//     L_aux = alpha * E * sum_e f_e * P_e,  f_e = count_e / (T k),  P_e = sum_t p_te / T
//     (balanced routing gives alpha; f is a count, so the gradient flows through P only);
//     with the sigmoid router p_te is the token's sigmoid scores normalised over all E experts,
//     s_te / sum_e' s_te' (DeepSeek-V3's s'_{i,t}, eqs. 17-20, whose f_i = E count_i / (k T) is
//     the E f_e above): the same loss, a probability per token as the softmax's is;
//     a step's loss is its sequences' mean;
//   z-loss (ST-MoE, Zoph et al., arXiv 2202.08906): beta * lse_t^2, a step's loss its tokens' mean.
// Per sequence, not per micro-batch: a sum over a micro-batch would change with the micro-batch
// size (data parallelism and gradient accumulation change it), and the result would depend on
// the layout. A sequence is split only by context parallelism and, under sequence parallelism,
// by the tensor group: the sums below add up over those ranks.

#include <cstdint>
#include <vector>

#include "meshtrain/model/model_spec.h"

namespace meshtrain {

struct Routing {
  int64_t tokens = 0, experts = 0, top_k = 0;
  RouterKind router = RouterKind::Softmax;
  // (tokens, experts) the probabilities the load-balancing loss averages: the softmax of the
  // logits; the sigmoid router's scores normalised over the experts.
  std::vector<double> probs;
  // The sigmoid router only (empty for the softmax router, whose scores are probs):
  std::vector<double> scores;   // (tokens, experts) sigmoid of the logits, the gates' source
  std::vector<double> softmax;  // (tokens, experts) the logits' softmax, with a z-loss only
  std::vector<double> lse;             // (tokens) log-sum-exp of each token's logits
  std::vector<int32_t> choice;         // (tokens, top_k) chosen experts, best first
  std::vector<double> gate;            // (tokens, top_k) combine weights
  std::vector<int64_t> counts;         // (experts) tokens each expert computes (after capacity)
  int64_t dropped = 0;                 // choices dropped for capacity
  std::vector<int64_t> expert_begin;   // (experts + 1) first sorted row of each expert
  std::vector<int32_t> token_of_row;   // (rows) the token of each expert-sorted row
  std::vector<int32_t> row_of_choice;  // (tokens, top_k) the sorted row of each choice; -1: dropped
  std::vector<double> gate_of_row;     // (rows) the gate of each sorted row
  // rows = tokens x top_k - dropped
};

// Routes `tokens` rows of `experts` logits each (row-major). `expert_bias` (experts values, or
// null: zeros) is added to the sigmoid router's scores to choose; the softmax router has none.
Routing route_tokens(const double* logits, int64_t tokens, const MoeSpec& spec,
                     const double* expert_bias = nullptr);

// The tokens an expert takes of `tokens` routed together: ceil(capacity_factor x tokens x
// top_k / experts), or every choice (tokens) when dropless.
int64_t expert_capacity(const MoeSpec& spec, int64_t tokens);

// Balanced routing with no arithmetic (the planner's dry run, whose logits are not computed):
// token t's j-th choice is expert (t k + j) mod E, gates 1/k.
Routing route_balanced(int64_t tokens, const MoeSpec& spec);

// The per-sequence sums the balancing losses need, over the sequences of a micro-batch; a rank's
// local ones add up over the ranks that share the sequences (a flat vector: to_vector /
// from_vector). sequence_of[t] is the micro-batch sequence local token t belongs to.
struct RouterSums {
  int64_t sequences = 0, experts = 0;
  std::vector<double> counts;     // (sequences, experts) routed slots
  std::vector<double> prob_sums;  // (sequences, experts)
  std::vector<double> tokens;     // (sequences)
  double lse_squares = 0;         // over every token
  double dropped = 0;             // choices dropped for capacity

  static RouterSums of(const Routing& r, const std::vector<int32_t>& sequence_of, int64_t sequences);
  std::vector<double> to_vector() const;
  static RouterSums from_vector(const std::vector<double>& v, int64_t sequences, int64_t experts);
  std::vector<double> expert_counts() const;  // (experts) summed over the sequences
  double token_count() const;
};

// Summed over the micro-batch: the load-balancing losses of its sequences and the z-losses of its
// tokens, each as its share of the step's loss counts it (a step's loss is the mean over its
// sequences and tokens: divide these by their numbers); and `per_token`, both as a sum of
// per-token losses (a sequence's loss times its tokens), the form the step's loss adds up.
struct BalancingLosses {
  double load_balance = 0, z = 0;  // sums over the sequences, and over the tokens
  double per_token = 0;
};
BalancingLosses balancing_losses(const RouterSums& sums, const MoeSpec& spec);

// d(weight * per_token) / d logits for this rank's tokens, given the sequences' sums:
// (tokens, experts), the part of the logits' gradient the losses add (weight: each token's
// weight in the step's loss).
std::vector<double> balancing_logit_gradient(const Routing& r, const RouterSums& sums,
                                             const std::vector<int32_t>& sequence_of,
                                             const MoeSpec& spec, double weight);

// The logits' gradient from the gates' gradient dgate (tokens, top_k), through the scale, the
// renormalisation (if any) and the softmax or sigmoid (the bias has none: it only chose);
// `add` (tokens, experts), when not empty, is added
// (the balancing losses' part). Returns (tokens, experts).
std::vector<double> router_logit_gradient(const Routing& r, const std::vector<double>& dgate,
                                          const MoeSpec& spec, const std::vector<double>& add);

}  // namespace meshtrain
