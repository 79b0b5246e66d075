#pragma once
// Causal self-attention, multi-head or grouped-query (kv_heads key/value heads, each shared by
// heads / kv_heads query heads), tensor-parallel over heads: the QKV projection
// (model/qkv_projection.h) is column-parallel so each rank owns whole query and key/value heads,
// the core runs on the local heads, and the output projection is row-parallel. Under context parallelism the core is ring
// attention (model/ring_attention.h), which keeps no softmax: only its rows' log-sum-exp.

#include <algorithm>
#include <optional>
#include <string>

#include "meshtrain/model/attention_core.h"
#include "meshtrain/model/layer.h"
#include "meshtrain/model/linear.h"
#include "meshtrain/model/model_spec.h"
#include "meshtrain/model/qkv_projection.h"
#include "meshtrain/model/rotary_positions.h"

namespace meshtrain {

class CausalSelfAttention {
 public:
  struct Saved {
    QkvProjection::Saved qkv_in;
    Tensor qkv;    // (N, (NH + 2 KVH) HS / tp): NH / tp query heads, KVH / tp key and value heads
    AttentionCoreSaved core;  // the core's stash or log-sum-exp (model/attention_core.h)
    RowParallelLinear::Saved proj_in;  // attention output (N, NH * HS / tp)
  };

  // spec.heads heads of spec.head_dim() channels, from and back to spec.d_model; residual_scale
  // multiplies the output projection's init std (GPT-2: 1/sqrt(2 * layers)); block `layer`'s
  // sliding window (spec.window) bounds the keys each query sees, and its index is the one under
  // which it records its heads' largest logits (ctx.qk_log, model/qk_clip.h).
  CausalSelfAttention(const LayerContext& ctx, const std::string& name, const ModelSpec& spec,
                      int layer, double residual_scale);

  // x (N_local, C) -> (N_local, C), plus `residual` where given (RowParallelLinear::forward).
  Tensor forward(const Tensor& x, TokenShape shape, Saved& saved, MemoryCategory category,
                 Recompute recompute, const Tensor* residual = nullptr);
  Tensor backward(const Tensor& dy, TokenShape shape, const Saved& saved,
                  DeferredWeightGradients* deferred = nullptr);
  // Generation (model/generator.h): x (1, C), the token at `position`, -> (1, C). Writes its key
  // and value into row `position` of k_cache and v_cache (KVH / tp, rows, HS) and attends to
  // rows [0, position]; under a window the cache holds cache_rows(seq_len) = window rows, a
  // ring (row position % window) of the last window keys, which is all a query sees (the
  // rotation is in the keys already, so their order does not matter). Never sequence-parallel
  // (TensorParallel::without_sequence).
  Tensor decode(const Tensor& x, Tensor& k_cache, Tensor& v_cache, int64_t position);
  int64_t local_heads() const { return local_heads_; }
  int64_t local_kv_heads() const { return qkv_.local_kv_heads(); }
  int64_t head_size() const { return head_size_; }
  // QK-clip of this rank's heads by the job's factors (layers, heads), heads globally numbered:
  // the rows of its query and key projections to scale (model/qk_clip.h).
  void add_qk_clip_scales(const std::vector<double>& job_gammas, std::vector<RowScale>& out);
  int64_t window() const { return window_; }
  // The cache rows generation keeps for a context of seq_len: the window's, where it is smaller.
  int64_t cache_rows(int64_t seq_len) const {
    return window_ > 0 ? std::min(window_, seq_len) : seq_len;
  }
  // Its projections, the split of q, k and v, and the attention core (model/cost_sheet.h).
  void add_costs(CostSheet& sheet) const;

 private:
  // The core's sizes: the local query and key/value heads of head_size_ (model/attention_core.h).
  AttentionDims dims() const {
    return {local_heads_, qkv_.local_kv_heads(), head_size_, 0, 0.0, window_};
  }

  LayerContext ctx_;
  int layer_;
  int64_t local_heads_, head_size_;
  int64_t window_;  // 0: full attention
  QkvProjection qkv_;
  std::optional<RotaryPositions> rotary_;  // positions = "rotary"
  RowParallelLinear proj_;
};

}  // namespace meshtrain
