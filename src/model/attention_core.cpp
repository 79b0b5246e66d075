#include "meshtrain/model/attention_core.h"

#include <algorithm>
#include <limits>
#include <stdexcept>

#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/backend/host_doubles.h"
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

// The kernel's forward, also reducing its rows' largest logits (B, NH, T) to one per head.
void forward_recording_max(Backend& be, Tensor& att, Tensor& stash, const Tensor& qkv,
                           TokenShape shape, const AttentionDims& dims,
                           std::vector<double>& head_max) {
  auto* cpu = dynamic_cast<CpuBackend*>(&be);
  if (cpu == nullptr)
    throw std::logic_error("QK-clip's logit maxima need the CPU backend's attention (config "
                           "refuses " + be.name() + ")");
  Tensor row_max = be.empty(stash.shape(), stash.dtype(), MemoryCategory::Workspace);
  cpu->attention_forward_recording_max(att, stash, row_max, qkv, shape.B, shape.T, dims,
                                       shape.document_mask());
  head_max.assign(static_cast<size_t>(dims.NH), -std::numeric_limits<double>::infinity());
  if (be.planning()) return;
  const std::vector<double> rows = to_host_doubles(be, row_max, "QK-clip's logit maxima");
  const size_t T = static_cast<size_t>(shape.T), NH = head_max.size();
  for (size_t r = 0; r < rows.size(); ++r) {  // (B, NH, T)
    double& m = head_max[(r / T) % NH];
    m = std::max(m, rows[r]);
  }
}
}  // namespace

void attention_core_forward(const LayerContext& ctx, Tensor& att, const Tensor& qkv,
                            TokenShape shape, const AttentionDims& dims, AttentionCoreSaved& saved,
                            MemoryCategory category, Recompute recompute,
                            std::vector<double>* head_max) {
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
  if (head_max)
    forward_recording_max(be, att, stash, qkv, shape, dims, *head_max);
  else
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
