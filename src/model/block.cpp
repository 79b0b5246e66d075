#include "meshtrain/model/block.h"

#include <cmath>
#include <stdexcept>

namespace meshtrain {

namespace {

// GPT-2's init: each branch's output projection scaled by 1/sqrt(2 * layers), so that the
// residual stream's variance does not grow with depth.
double residual_scale(const ModelSpec& spec) { return 1.0 / std::sqrt(2.0 * spec.layers); }

}  // namespace

Block::Block(const LayerContext& ctx, int index, const ModelSpec& spec)
    : Block(ctx, "h." + std::to_string(index), index, spec) {}

Block::Block(const LayerContext& ctx, const std::string& prefix, int index, const ModelSpec& spec)
    : ctx_(ctx),
      attention_norm_(ctx, prefix + ".ln_1", spec.d_model, spec.norm),
      attention_(ctx, prefix + ".attn", spec, index, residual_scale(spec)),
      feed_forward_norm_(ctx, prefix + ".ln_2", spec.d_model, spec.norm),
      feed_forward_(ctx, prefix + ".mlp", spec, index, residual_scale(spec)) {}

Tensor Block::forward_all(const Tensor& x, TokenShape shape, Saved& saved, MemoryCategory inner,
                          Recompute recompute, bool recomputing) {
  saved.x = x;
  Tensor a = attention_norm_.forward(x, saved.attention_norm, inner);
  // Each branch's output projection adds the residual stream (in its GEMM where it can).
  Tensor x2 = attention_.forward(a, shape, saved.attention, inner, recompute, &x);
  Tensor b = feed_forward_norm_.forward(x2, saved.feed_forward_norm, inner);
  // The block output outlives the block (it is the next block's saved input): Activations.
  return feed_forward_.forward(b, shape, recomputing, saved.feed_forward, inner,
                               MemoryCategory::Activations, nullptr, &x2);
}

Tensor Block::forward(const Tensor& x, TokenShape shape, Saved& saved, Recompute recompute) {
  if (recompute != Recompute::Full)
    return forward_all(x, shape, saved, MemoryCategory::Activations, recompute, false);
  Saved scratch;
  Tensor out = forward_all(x, shape, scratch, MemoryCategory::Workspace, Recompute::Selective, false);
  saved = Saved{};
  saved.x = x;
  return out;
}

Tensor Block::decode(const Tensor& x, DecodeCache& cache, int64_t position) {
  Backend& be = *ctx_.backend;
  const MemoryCategory ws = MemoryCategory::Workspace;
  Norm::Saved attention_norm, feed_forward_norm;
  FeedForward::Saved feed_forward;
  Tensor x2 = attention_.decode(attention_norm_.forward(x, attention_norm, ws), cache, position);
  be.add_inplace(x2, x);
  const TensorParallel tp = ctx_.tp.without_sequence();
  Tensor out = feed_forward_.forward(feed_forward_norm_.forward(x2, feed_forward_norm, ws),
                                     TokenShape{}, false, feed_forward, ws, ws, &tp);
  be.add_inplace(out, x2);
  return out;
}

Tensor Block::backward(const Tensor& dout, TokenShape shape, Saved& saved, Recompute recompute,
                       DeferredWeightGradients* deferred) {
  if (recompute == Recompute::Full) {
    const Tensor x = saved.x;
    forward_all(x, shape, saved, MemoryCategory::Workspace, Recompute::None, true);
  }
  // dout flows into both the feed-forward branch and the residual path to x2, dx2 into both the
  // attention branch and the residual path to x.
  Tensor dx2 = feed_forward_norm_.backward_add(
      feed_forward_.backward(dout, saved.feed_forward, deferred), saved.feed_forward_norm, dout);
  Tensor dx = attention_norm_.backward_add(
      attention_.backward(dx2, shape, saved.attention, deferred), saved.attention_norm, dx2);
  saved = Saved{};  // frees this micro-batch's activations (but what deferred work holds)
  return dx;
}


CostSheet Block::cost_sheet() const {
  CostSheet sheet;
  attention_norm_.add_costs(sheet);
  attention_.add_costs(sheet);
  feed_forward_norm_.add_costs(sheet);
  feed_forward_.add_costs(sheet);
  // Each residual add reads two streams and writes one, twice over in backward.
  ElementwiseCost residual;
  residual.width = sheet.linears.back().out;
  residual.tokens = ElementwiseCost::Tokens::Region;
  residual.forward_accesses = 3;
  residual.backward_accesses = 6;
  sheet.elementwise.push_back(residual);
  sheet.elementwise.push_back(residual);
  return sheet;
}
}  // namespace meshtrain
