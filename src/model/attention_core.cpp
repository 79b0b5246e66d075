#include "meshtrain/model/attention_core.h"

#include "meshtrain/model/ring_attention.h"

namespace meshtrain {

namespace {
// What the backend keeps from forward to backward (backend.h, attention_stash): the CPU's row
// log-sum-exp, the CUDA backend's (B, NH, T, T).
Tensor empty_stash(Backend& be, TokenShape shape, const AttentionDims& dims, DType activations,
                   MemoryCategory category) {
  const Backend::AttentionStash s = be.attention_stash(shape.B, shape.T, dims, activations);
  return be.empty(s.shape, s.dtype, category);
}
}  // namespace

void attention_core_forward(const LayerContext& ctx, Tensor& att, const Tensor& qkv,
                            TokenShape shape, const AttentionDims& dims, AttentionCoreSaved& saved,
                            MemoryCategory category, Recompute recompute) {
  Backend& be = *ctx.backend;
  if (ctx.cp.on()) {
    saved.lse = be.empty({shape.B, dims.NH, shape.T}, stats_dtype(qkv.dtype()), category);
    ring_attention_forward(be, ctx.cp, att, saved.lse, qkv, shape.B, shape.T, dims, nullptr,
                           shape.document_mask());
    return;
  }
  const MemoryCategory stash_category =
      recompute == Recompute::Selective ? MemoryCategory::Workspace : category;
  Tensor stash = empty_stash(be, shape, dims, qkv.dtype(), stash_category);
  be.attention_forward(att, stash, qkv, shape.B, shape.T, dims, shape.document_mask());
  if (recompute != Recompute::Selective) saved.stash = stash;
}

Tensor attention_core_backward(const LayerContext& ctx, const Tensor& datt, const Tensor& qkv,
                               const Tensor& out, TokenShape shape, const AttentionDims& dims,
                               const AttentionCoreSaved& saved) {
  Backend& be = *ctx.backend;
  Tensor dqkv = be.empty(qkv.shape(), datt.dtype(), MemoryCategory::Workspace);
  if (ctx.cp.on()) {
    ring_attention_backward(be, ctx.cp, dqkv, datt, qkv, out, saved.lse, shape.B, shape.T, dims,
                            nullptr, shape.document_mask());
    return dqkv;
  }
  Tensor stash = saved.stash;
  if (!stash.defined()) {  // selective recomputation: rebuild the stash from the saved rows
    stash = empty_stash(be, shape, dims, datt.dtype(), MemoryCategory::Workspace);
    Tensor att = be.empty(out.shape(), datt.dtype(), MemoryCategory::Workspace);
    be.attention_forward(att, stash, qkv, shape.B, shape.T, dims, shape.document_mask());
  }
  be.attention_backward(dqkv, datt, qkv, out, stash, shape.B, shape.T, dims,
                        shape.document_mask());
  return dqkv;
}

}  // namespace meshtrain
