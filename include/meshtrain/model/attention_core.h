#pragma once
// The attention core both attention variants share (model/attention.h, model/latent_attention.h):
// the heads' outputs from the packed rows (backend.h's layout, of AttentionDims' sizes), by the
// backend's kernel with its stash or, under context parallelism, by ring attention over the
// context group (model/ring_attention.h); and back. A variant differs in how it builds the rows
// and what it does with their gradient, never here.

#include <vector>

#include "meshtrain/backend/backend.h"
#include "meshtrain/model/layer.h"
#include "meshtrain/model/recompute.h"
#include "meshtrain/model/token_shape.h"

namespace meshtrain {

struct AttentionCoreSaved {
  Tensor stash;  // the backend's attention stash (backend.h, attention_stash) for the local
                 // heads; empty under selective recomputation (backward rebuilds it from the
                 // saved rows, the same bits) and under context parallelism
  Tensor lse;    // under context parallelism: (B, NH, T), the rows' log-sum-exp
};

// att (N, NH * HV) from qkv (N, NH * HS + KVH * (HS + HV)). head_max, when given: the NH
// local heads' largest scaled logits over the rows (QK-clip, model/qk_clip.h; the CPU backend's
// kernel without context parallelism only, as config/ requires).
void attention_core_forward(const LayerContext& ctx, Tensor& att, const Tensor& qkv,
                            TokenShape shape, const AttentionDims& dims, AttentionCoreSaved& saved,
                            MemoryCategory category, Recompute recompute,
                            std::vector<double>* head_max = nullptr);
// dqkv (qkv's shape) from datt and forward's `out` (att's bits; a recomputation writes the same).
Tensor attention_core_backward(const LayerContext& ctx, const Tensor& datt, const Tensor& qkv,
                               const Tensor& out, TokenShape shape, const AttentionDims& dims,
                               const AttentionCoreSaved& saved);

}  // namespace meshtrain
