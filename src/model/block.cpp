#include "meshtrain/model/block.h"

#include <cmath>

namespace meshtrain {

Block::Block(const LayerContext& ctx, int index, int64_t C, int64_t heads, int layers)
    : ctx_(ctx),
      ln_1_(ctx, "h." + std::to_string(index) + ".ln_1", C),
      attn_(ctx, "h." + std::to_string(index) + ".attn", C, heads, 1.0 / std::sqrt(2.0 * layers)),
      ln_2_(ctx, "h." + std::to_string(index) + ".ln_2", C),
      mlp_(ctx, "h." + std::to_string(index) + ".mlp", C, 4 * C, 1.0 / std::sqrt(2.0 * layers)) {}

Tensor Block::forward_all(const Tensor& x, TokenShape shape, Saved& saved, MemoryCategory inner,
                          Recompute recompute) {
  saved.x = x;
  Tensor a = ln_1_.forward(x, saved.ln_1, inner);
  // Each branch's output projection adds the residual stream (in its GEMM where it can).
  Tensor x2 = attn_.forward(a, shape, saved.attn, inner, recompute, &x);
  Tensor b = ln_2_.forward(x2, saved.ln_2, inner);
  // The block output outlives the block (it is the next block's saved input): Activations.
  return mlp_.forward(b, saved.mlp, inner, MemoryCategory::Activations, nullptr, &x2);
}

Tensor Block::forward(const Tensor& x, TokenShape shape, Saved& saved, Recompute recompute) {
  if (recompute != Recompute::Full)
    return forward_all(x, shape, saved, MemoryCategory::Activations, recompute);
  Saved scratch;
  Tensor out = forward_all(x, shape, scratch, MemoryCategory::Workspace, Recompute::Selective);
  saved = Saved{};
  saved.x = x;
  return out;
}

Tensor Block::decode(const Tensor& x, Tensor& k_cache, Tensor& v_cache, int64_t position) {
  Backend& be = *ctx_.backend;
  const MemoryCategory ws = MemoryCategory::Workspace;
  LayerNorm::Saved ln_1, ln_2;
  Mlp::Saved mlp;
  Tensor x2 = attn_.decode(ln_1_.forward(x, ln_1, ws), k_cache, v_cache, position);
  be.add_inplace(x2, x);
  const TensorParallel tp = ctx_.tp.without_sequence();
  Tensor out = mlp_.forward(ln_2_.forward(x2, ln_2, ws), mlp, ws, ws, &tp);
  be.add_inplace(out, x2);
  return out;
}

Tensor Block::backward(const Tensor& dout, TokenShape shape, Saved& saved, Recompute recompute,
                       DeferredWeightGradients* deferred) {
  if (recompute == Recompute::Full) {
    const Tensor x = saved.x;
    forward_all(x, shape, saved, MemoryCategory::Workspace, Recompute::None);
  }
  // dout flows into both the MLP branch and the residual path to x2, dx2 into both the
  // attention branch and the residual path to x.
  Tensor dx2 = ln_2_.backward_add(mlp_.backward(dout, saved.mlp, deferred), saved.ln_2, dout);
  Tensor dx = ln_1_.backward_add(attn_.backward(dx2, shape, saved.attn, deferred), saved.ln_1, dx2);
  saved = Saved{};  // frees this micro-batch's activations (but what deferred work holds)
  return dx;
}


CostSheet Block::cost_sheet() const {
  CostSheet sheet;
  ln_1_.add_costs(sheet);
  attn_.add_costs(sheet);
  ln_2_.add_costs(sheet);
  mlp_.add_costs(sheet);
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
