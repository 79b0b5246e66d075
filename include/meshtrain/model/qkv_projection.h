#pragma once
// The projection of a block's input to the row attention reads per token: this tensor rank's
// NH/tp query heads, then KVH/tp key heads, then KVH/tp value heads, HS channels each
// (backend.h's attention layout). Multi-head attention (kv_heads == heads: GPT-2) has one
// weight (3, NH HS, C), split by heads within each of q, k and v. Grouped-query attention has
// three, q (NH HS, C), k and v (KVH HS, C) (Hugging Face's q_proj, k_proj, v_proj), each
// column-parallel by heads (tp beyond KVH: each rank computes the one key/value head its query
// heads read, shared with tp / KVH ranks, from k and v stored whole; model/linear.h), reading the input entered into the tensor region once, and run as
// one product writing the packed rows where their storage is adjacent
// (model/stacked_columns.h). With model.qk_norm (Qwen 3) the projections are separate
// whatever kv_heads is, and each query and key head is RMS-normalised over its head_dim
// channels (q_norm, k_norm: one (head_dim) weight each, shared by every head) before packing,
// while each projection's output is still contiguous, (N x heads, head_dim).

#include <optional>
#include <string>

#include "meshtrain/model/cost_sheet.h"
#include "meshtrain/model/layer.h"
#include "meshtrain/model/linear.h"
#include "meshtrain/model/model_spec.h"
#include "meshtrain/model/qk_clip.h"
#include "meshtrain/model/rmsnorm.h"
#include "meshtrain/model/stacked_columns.h"

namespace meshtrain {

class QkvProjection {
 public:
  struct Saved {
    ColumnParallelLinear::Saved entered;  // the input in the tensor region
    RmsNorm::Saved q_norm, k_norm;        // model.qk_norm: the heads before their norm
  };

  QkvProjection(const LayerContext& ctx, const std::string& name, const ModelSpec& spec);

  // x (N_local, C) -> the packed rows (N, (NH + 2 KVH) HS / tp); `tp` as for
  // ColumnParallelLinear::forward.
  Tensor forward(const Tensor& x, Saved& saved, MemoryCategory category,
                 const TensorParallel* tp = nullptr);
  // The packed rows' gradient -> dx (N_local, C). The key bias's gradient is written exactly
  // zero: the bias adds q_i . b_k to every score of row i, which softmax ignores, and what the
  // GEMMs leave there is rounding noise that Adam would amplify into real updates.
  Tensor backward(const Tensor& dqkv, const Saved& saved, DeferredWeightGradients* deferred);
  int64_t local_kv_heads() const { return local_kv_heads_; }
  int64_t kv_heads() const { return kv_heads_; }  // the model's
  // QK-clip (model/qk_clip.h) of this rank's heads by local_gammas (local_heads): multi-head
  // attention's query and key rows (and biases) by sqrt(gamma), grouped-query attention's query
  // rows by gamma (the shared key heads untouched). Nothing for a head with gamma 1.
  void add_qk_clip_scales(const std::vector<double>& local_gammas, std::vector<RowScale>& out);
  void add_costs(CostSheet& sheet) const;

 private:
  LayerContext ctx_;
  int64_t local_heads_, local_kv_heads_, head_size_;
  int64_t kv_heads_;  // of the model: the most parts k and v split into (tp beyond: shared)
  std::optional<ColumnParallelLinear> fused_;   // multi-head: (3, NH HS, C)
  std::optional<ColumnParallelLinear> q_, k_, v_;  // grouped-query, or with qk_norm
  std::optional<StackedColumns> stacked_;          // q, k and v as one product, without qk_norm
  std::optional<RmsNorm> q_norm_, k_norm_;
  // Whether the key bias adds one amount to every score of a query's row (so that softmax cancels
  // it and its gradient is exactly zero): not after a norm of the keys, nor once rotary positions
  // turn it by each key's position.
  bool key_bias_cancels_ = false;
};

}  // namespace meshtrain
