#pragma once
// What a layer costs to train, reported by the layer from its own shapes: its GEMMs, the
// memory-bound passes (normalisation, element-wise, lookups) with the elements they read and
// write, its attention core and its parameters. The time model, the pipeline partition, the
// work-balance probe and the FLOP counts (MFU) read these sheets, so that a model family with
// other shapes (a gated MLP, grouped-query attention) is priced by describing its layers, not by
// editing each of those (Megatron-Core's and torchtitan's FLOP counts are per-model formulas;
// here the layers themselves are the formula).
//
// Shapes are global (the model as one rank would hold it); each entry says which of its
// dimensions the tensor-parallel group splits, and the reader divides. Every token dimension is
// per context-parallel rank: a rank holds seq_len / cp tokens of each sequence.

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace meshtrain {

struct ParamSpec;

enum class GemmPass { Forward, BackwardData, BackwardWeight };

// Which dimension of a linear layer the tensor-parallel group splits: none, its outputs
// (column-parallel, and the vocabulary-parallel head) or its inputs (row-parallel, whose
// partial outputs are summed over the group).
enum class TpSplitOf { None, Outputs, Inputs };

// C[m, n] = A[m, k] B[k, n], on one rank.
struct GemmShape {
  double m = 0, n = 0, k = 0;
  GemmPass pass = GemmPass::Forward;
  double flops() const { return 2 * m * n * k; }
  bool operator==(const GemmShape&) const = default;
};

// y[tokens, out] = x[tokens, in] w[in, out] (+ bias).
struct LinearCost {
  int64_t in = 0, out = 0;
  TpSplitOf split = TpSplitOf::None;
  // An expert linear of a mixture (experts > 0): each token's `rows_per_token` rows (its top_k
  // choices) go to one of `experts` weight matrices, and a rank multiplies its experts' rows as
  // one grouped GEMM (Backend::grouped_matmul_forward): experts / ep groups. The time model
  // prices it as balanced routing, every expert getting the same share of the rows. 0: a dense
  // linear, one GEMM over every token.
  int64_t experts = 0;
  double rows_per_token = 1;
  // Outputs that split into at most this many parts (the key/value projections: kv_heads); a tp
  // beyond it gives each rank one part, shared with tp / parts ranks. 0: no limit.
  int64_t tp_parts = 0;

  double local_in(double tp) const { return split == TpSplitOf::Inputs ? static_cast<double>(in) / tp : static_cast<double>(in); }
  double local_out(double tp) const {
    if (split != TpSplitOf::Outputs) return static_cast<double>(out);
    return static_cast<double>(out) / (tp_parts > 0 ? std::min(tp, static_cast<double>(tp_parts)) : tp);
  }
  // The forward product and the backward's two (input gradient, weight gradient) on one rank.
  GemmShape forward(double tokens, double tp) const { return {tokens, local_out(tp), local_in(tp), GemmPass::Forward}; }
  GemmShape backward_data(double tokens, double tp) const {
    return {tokens, local_in(tp), local_out(tp), GemmPass::BackwardData};
  }
  GemmShape backward_weight(double tokens, double tp) const {
    return {local_in(tp), local_out(tp), tokens, GemmPass::BackwardWeight};
  }
  // Forward and backward multiply-adds per token, counted as two FLOPs each (unsplit).
  double training_flops_per_token() const {
    return 6.0 * rows_per_token * static_cast<double>(in) * static_cast<double>(out);
  }
  bool operator==(const LinearCost&) const = default;
};

// A memory-bound pass over `width` elements of each token, reading and writing the given number
// of elements in forward and in backward.
struct ElementwiseCost {
  enum class Tokens {
    Region,  // the residual stream's tokens: split over tp under sequence parallelism
    All,     // every token of the rank (inside a tensor-parallel region, or before its split)
  };
  enum class Bytes { Activation, Fp32 };
  int64_t width = 0;
  bool width_split = false;  // the width is split over tp (a column-parallel layer's outputs)
  Tokens tokens = Tokens::Region;
  Bytes forward_bytes = Bytes::Activation, backward_bytes = Bytes::Activation;
  double forward_accesses = 0, backward_accesses = 0;  // elements read + written, per element

  double local_width(double tp) const { return width_split ? static_cast<double>(width) / tp : static_cast<double>(width); }
  bool operator==(const ElementwiseCost&) const = default;
};

// Scaled dot-product attention over `heads` heads of `head_size` (queries and keys) and
// `value_size` (values; 0: head_size): per (sequence, head) pair, scores (q, k) = q (q, d)
// k^T (k, d) and out (q, d_v) = p (q, k) v (k, d_v), the scores' softmax kept in fp32. Heads
// are split over tp.
struct AttentionCost {
  int64_t heads = 0, head_size = 0, value_size = 0;
  double forward_score_accesses = 0, backward_score_accesses = 0;  // fp32 elements per score
  int64_t window = 0;  // a sliding window's keys per query (AttentionDims::window); 0: all

  int64_t values() const { return value_size ? value_size : head_size; }
  // The keys a query meets in a sequence of `keys`: at most the window (the kernel skips whole
  // blocks outside it, so its cost is O(T W), backend/cpu/flash_attention.cpp).
  double keys_seen(double keys) const {
    return window > 0 ? std::min(keys, static_cast<double>(window)) : keys;
  }
  // The two forward GEMMs of one (sequence, head) pair: `queries` rows meeting `keys` keys.
  GemmShape scores(double queries, double keys) const { return {queries, keys, static_cast<double>(head_size)}; }
  GemmShape weighted_sum(double queries, double keys) const { return {queries, static_cast<double>(values()), keys}; }
  // Forward and backward FLOPs per token of a sequence of `seq_len`, the causal mask ignored
  // (the PaLM convention, Chowdhery et al., arXiv 2204.02311, appendix B: 12 x heads x d x T;
  // 6 x heads x (d + d_v) x T with value heads of their own width).
  double training_flops_per_token(double seq_len) const {
    seq_len = keys_seen(seq_len);
    if (value_size == 0)
      return 3.0 * 2.0 * 2.0 * seq_len * static_cast<double>(heads) * static_cast<double>(head_size);
    return 3.0 * 2.0 * seq_len * static_cast<double>(heads) *
           static_cast<double>(head_size + value_size);
  }
  bool operator==(const AttentionCost&) const = default;
};

// An attention core's entry: its fp32 scores read and written by the softmax (forward), and
// read with their gradient to write the logits' gradient (backward).
AttentionCost attention_core_cost(int64_t heads, int64_t head_size, int64_t value_size = 0);

struct ParameterCost {
  int64_t numel = 0;
  bool tp_split = false;
  // A lookup table (position embedding) takes part in no multiply: left out of the 6N term.
  bool lookup_only = false;
  // Another layer's parameter used here too (the head's tied embedding): state this layer's rank
  // holds, but not a parameter of the model a second time.
  bool shared = false;
  // The share of it one token multiplies by: top_k / experts for a mixture's expert weights
  // (the 6N term counts active parameters), 1 otherwise.
  double active_share = 1.0;
  // An expert's weight: split over the expert group (parallel.ep) rather than replicated, and
  // reduced (and ZeRO-sharded) over the expert-data group only.
  bool expert_parallel = false;
  // A split into at most this many parts (LinearCost::tp_parts): beyond it the weight is whole on
  // every rank (model/linear.h's shared parts). 0: no limit.
  int64_t tp_parts = 0;

  double local_numel(double tp) const {
    const bool split = tp_split && (tp_parts == 0 || tp <= static_cast<double>(tp_parts));
    return split ? static_cast<double>(numel) / tp : static_cast<double>(numel);
  }
  bool operator==(const ParameterCost&) const = default;
};

// Expert parallelism's exchange in one layer: every token's `rows_per_token` rows of `width`
// activation elements travel to their experts' ranks of the expert group by all_to_all and back
// (forward), the gradients the same way (backward), after `counts` integers per rank are
// exchanged (forward). Priced only where parallel.ep > 1, as balanced routing: (ep-1)/ep of a
// rank's rows leave it.
struct ExchangeCost {
  int64_t width = 0;
  double rows_per_token = 0;
  int64_t counts = 0;
  bool operator==(const ExchangeCost&) const = default;
};

// Generation's cache of one layer (model/generator.h), per token of the context: `width`
// elements of the activation dtype, split over tp (standard attention: the keys and values of
// the key/value heads, 2 x kv_heads x head_dim) or whole on every tensor rank (latent attention:
// the compressed latent and the rotary key, kv_lora_rank + qk_rope_head_dim).
struct DecodeCacheCost {
  int64_t width = 0;
  bool tp_split = false;
  int64_t tp_parts = 0;  // as LinearCost's: key/value heads, each shared by the ranks beyond
  int64_t rows = 0;      // a sliding window's: the tokens it keeps at most; 0: the whole context

  // Tokens it keeps for a context of seq_len.
  double tokens(double seq_len) const {
    return rows > 0 ? std::min(seq_len, static_cast<double>(rows)) : seq_len;
  }
  double local_width(double tp) const {
    if (!tp_split) return static_cast<double>(width);
    return static_cast<double>(width) / (tp_parts > 0 ? std::min(tp, static_cast<double>(tp_parts)) : tp);
  }
  bool operator==(const DecodeCacheCost&) const = default;
};

// A registered parameter's entry: its global size and whether the tp group splits it.
ParameterCost parameter_cost(const ParamSpec& spec);

// One unit's sheet (the embedding, a block, the head), in the order its layers run.
struct CostSheet {
  std::vector<LinearCost> linears;
  std::vector<ElementwiseCost> elementwise;
  std::vector<AttentionCost> attention;
  std::vector<ParameterCost> parameters;
  std::vector<ExchangeCost> exchanges;
  std::vector<DecodeCacheCost> decode_cache;

  void add(const CostSheet& other);
  // A memory-bound pass over the outputs of the linear added last (the qkv split, an
  // activation), split over tp as they are, on every token of the rank.
  void add_pass_over_last_outputs(double forward_accesses, double backward_accesses);
  // Parameters this rank holds on a tp-way split; shared ones where `include_shared`.
  double local_parameters(double tp, bool include_shared = true) const;
  // The model's parameters in the FLOP count's N: neither lookups nor shared copies.
  double multiplying_parameters() const;
  // GEMM and attention FLOPs of forward and backward, per token (what balances pipeline chunks).
  double training_flops_per_token(double seq_len) const;
  // Linears whose outputs are split (column-parallel: the group sums their input gradients in
  // backward) and whose inputs are (row-parallel: the group sums their outputs in forward).
  int column_parallel_linears() const;
  int row_parallel_linears() const;
  // Elements of generation's cache per token of the context on one rank of a tp-way group.
  double decode_cache_width(double tp) const;
  // Elements of generation's cache for a context of seq_len on one rank: a sliding window's
  // layer keeps its window's tokens only.
  double decode_cache_elements(double tp, double seq_len) const;
  bool operator==(const CostSheet&) const = default;
};

// The sheets of a whole model, unit by unit.
struct ModelCostSheet {
  CostSheet embedding;
  std::vector<CostSheet> blocks;  // one per layer
  CostSheet head;

  // Training FLOPs per token by the PaLM convention: 6 x the multiplying parameters + attention.
  double flops_per_token(double seq_len) const;
};

}  // namespace meshtrain
