#pragma once
// Multi-head latent attention (DeepSeek-V2, arXiv 2405.04434; DeepSeek-V3; HF
// DeepseekV3Attention), model.attention = "latent". Of block input x (N_local, C), with n heads
// (h = n / tp on this tensor rank), d_n = qk_nope_head_dim, d_r = qk_rope_head_dim,
// d_qk = d_n + d_r, d_v = v_head_dim, r_q = q_lora_rank, r_kv = kv_lora_rank:
//   1. down-projections, whole on every tensor rank (model/replicated_linear.h), on the rows
//      where x stands: q_lat = RMSNorm(x q_a^T) (r_q), and from one weight kv_a (r_kv + d_r, C)
//      the latent c = RMSNorm(first r_kv outputs) and the rotary key k_pe (last d_r outputs,
//      one head shared by every head). Both norms take eps 1e-6 whatever model.norm_eps is
//      (HF builds them with DeepseekV3RMSNorm's default).
//   2. q_lat, c and k_pe enter the tensor region together, one (N, r_q + r_kv + d_r) tensor:
//      far narrower than x (all-gathered under sequence parallelism; their gradients summed).
//   3. k_pe rotated at the rows' positions; q = q_lat q_b^T (n d_qk, column-parallel by heads),
//      each query head [q_nope d_n | q_rot d_r] with its tail rotated; kv = c kv_b^T
//      (n (d_n + d_v), column-parallel by heads), each head [k_nope d_n | v d_v].
//   4. the packed row of attention_forward (Backend::mla_pack): queries, keys [k_nope | k_pe]
//      and values per head; the core with query/key heads of d_qk and value heads of d_v,
//      softmax scale d_qk^-1/2; ring attention under context parallelism.
//   5. proj (C, n d_v), row-parallel, adding the residual.
// With q_lora_rank 0 the queries come straight from x (q, column-parallel; HF's q_proj).
// Parameters: h.i.attn.{q_a, q_a_norm, q_b | q, kv_a, kv_a_norm, kv_b, proj}.weight.

#include <optional>
#include <string>

#include "meshtrain/model/attention_core.h"
#include "meshtrain/model/cost_sheet.h"
#include "meshtrain/model/layer.h"
#include "meshtrain/model/linear.h"
#include "meshtrain/model/model_spec.h"
#include "meshtrain/model/replicated_linear.h"
#include "meshtrain/model/rmsnorm.h"
#include "meshtrain/model/rotary_positions.h"

namespace meshtrain {

class LatentAttention {
 public:
  struct Saved {
    Tensor x;                             // (N_local, C): the down-projections' input
    RmsNorm::Saved q_norm, kv_norm;       // q_lat and c before their norms
    ColumnParallelLinear::Saved q_in;     // q_b's input in the region (q's: x entered)
    ColumnParallelLinear::Saved kv_in;    // kv_b's input in the region, c normalised
    Tensor qkv;    // (N, h (2 d_qk + d_v)): the packed row
    AttentionCoreSaved core;  // the core's stash or log-sum-exp (model/attention_core.h)
    RowParallelLinear::Saved proj_in;  // attention output (N, h d_v)
  };

  LatentAttention(const LayerContext& ctx, const std::string& name, const ModelSpec& spec,
                  double residual_scale);

  // As CausalSelfAttention's.
  Tensor forward(const Tensor& x, TokenShape shape, Saved& saved, MemoryCategory category,
                 Recompute recompute, const Tensor* residual = nullptr);
  Tensor backward(const Tensor& dy, TokenShape shape, const Saved& saved,
                  DeferredWeightGradients* deferred = nullptr);
  void add_costs(CostSheet& sheet) const;

  // Generation (model/generator.h): x (1, C), the token at `position`, -> (1, C). Writes the
  // token's row [c | k_pe] (the normalised latent, r_kv, and the rotated rotary key, d_r) into
  // row `position` of `cache` (1, seq_len, r_kv + d_r), the same on every tensor rank (the
  // down-projections are whole there), and attends to rows [0, position] without expanding
  // them into keys and values: DeepSeek-V2's absorption (arXiv 2405.04434, section 2.1.2).
  // Head h's query meets the cache as [q_nope_h W_UK_h | q_rot_h] . [c | k_pe] (W_UK_h: kv_b's
  // k_nope rows of head h, (d_n, r_kv)), which is q_h . k_h of the expanded keys re-associated;
  // the softmax-weighted sum of the latents o_h (r_kv) gives the head's output o_h W_UV_h^T
  // (W_UV_h: kv_b's value rows of head h, (d_v, r_kv)), equal to the expanded values' sum.
  // Never sequence-parallel (TensorParallel::without_sequence).
  Tensor decode(const Tensor& x, Tensor& cache, int64_t position);
  // The width of a cache row: kv_lora_rank + qk_rope_head_dim (DeepSeek-V3: 576).
  int64_t cache_width() const { return kv_rank_ + rope_; }

  // The latent norms' eps (HF DeepseekV3RMSNorm's default).
  static constexpr double kLatentNormEps = 1e-6;

 private:
  // Steps 1-2: the down-projections and their norms, entered into the tensor region; returns
  // k_pe (N, d_r), not yet rotated, and fills saved.q_in (with q_lora_rank) and saved.kv_in.
  Tensor enter_latents(const Tensor& x, Saved& saved, MemoryCategory category);
  // The local heads' widths, as mla_pack takes them.
  MlaHeads heads() const { return {local_heads_, nope_, rope_, value_}; }
  // The rotary part of every local query head of q (N, h d_qk), in place; at one position
  // (generation's one row).
  Backend::RotaryHeads query_tails() const;
  void rotate_query_tails(Tensor& q, TokenShape shape, bool forward);
  void rotate_query_tails_at(Tensor& q, int64_t position);
  // decode's steps: the token's cache row, its query heads [q_nope W_UK | q_rot] (h, r_kv + d_r),
  // and the heads' outputs (1, h d_v) from their latent sums (h, r_kv + d_r).
  void write_cache_row(const Tensor& x, Tensor& cache, int64_t position);
  Tensor absorbed_queries(const Tensor& x, int64_t position, const TensorParallel& tp);
  Tensor expand_values(const Tensor& latent_sums);
  // Steps 1-2 backward from the region's gradients of q_lat (or of x through q), c and k_pe.
  Tensor leave_latents(const Tensor& dq_lat, const Tensor& dc, const Tensor& dk_pe,
                       const Tensor& dx_q, const Saved& saved, DeferredWeightGradients* deferred);

  LayerContext ctx_;
  int64_t heads_, local_heads_, nope_, rope_, value_, q_rank_, kv_rank_;
  std::optional<ReplicatedLinear> q_a_;
  std::optional<RmsNorm> q_a_norm_;
  std::optional<ColumnParallelLinear> q_b_;  // q_lora_rank > 0
  std::optional<ColumnParallelLinear> q_;    // q_lora_rank 0
  ReplicatedLinear kv_a_;
  RmsNorm kv_a_norm_;
  ColumnParallelLinear kv_b_;
  RowParallelLinear proj_;
  RotaryPositions rotary_;
  AttentionDims dims_;  // the core's: h query and key/value heads, d_qk and d_v wide
};

}  // namespace meshtrain
