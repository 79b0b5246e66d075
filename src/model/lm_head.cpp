#include "meshtrain/model/lm_head.h"

namespace meshtrain {

LanguageModelHead::LanguageModelHead(const LayerContext& ctx, int64_t C, const NormSpec& norm,
                                     Parameter& weight)
    : ctx_(ctx), ln_f_(ctx, "ln_f", C, norm), weight_(weight) {}

void LanguageModelHead::forward(const Tensor& x, const Tensor& targets, TokenShape shape,
                                double dloss, Saved* saved, LossAccumulator& loss) {
  Backend& be = *ctx_.backend;
  Communicator& tp = *ctx_.tp.comm;
  const int64_t N = shape.N(), V = weight_.shape[0];
  const DType dt = x.dtype();
  const MemoryCategory ws = MemoryCategory::Workspace;

  Norm::Saved ln;
  Tensor h = ln_f_.forward(x, ln, ws);
  Tensor hin = enter_tp_region_forward(be, ctx_.tp, h, ws);
  Tensor logits = be.empty({N, V}, dt, ws);
  be.matmul_forward(logits, hin, weight_.value, nullptr);

  const DType st = stats_dtype(dt);
  if (saved && tp.size() == 1) {  // the whole vocabulary here: loss and gradient in one pass
    Tensor losses = be.empty({N}, st, ws);
    be.crossentropy_loss_and_backward(logits, losses, logits, targets, dloss);
    loss.add(losses);
    backward_from_logits(logits, hin, ln, saved);
    return;
  }
  Tensor row_max = be.empty({N}, st, ws), row_sumexp = be.empty({N}, st, ws);
  be.crossentropy_stats(row_max, row_sumexp, logits);
  if (tp.size() > 1) {
    Tensor global_max = be.empty({N}, st, ws);
    be.copy(global_max, row_max);
    tp.all_reduce(global_max, ReduceOp::Max).wait();
    be.crossentropy_rebase(row_sumexp, row_max, global_max);
    tp.all_reduce(row_sumexp).wait();
    row_max = global_max;
  }
  Tensor target_logit = be.empty({N}, st, ws);
  be.crossentropy_target_logit(target_logit, logits, targets, weight_.split_begin);
  tp.all_reduce(target_logit).wait();
  Tensor losses = be.empty({N}, st, ws);
  be.crossentropy_losses(losses, row_max, row_sumexp, target_logit);
  loss.add(losses);
  if (!saved) return;

  be.crossentropy_backward(logits, logits, row_max, row_sumexp, targets, weight_.split_begin,
                           dloss);
  backward_from_logits(logits, hin, ln, saved);
}

void LanguageModelHead::backward_from_logits(Tensor& dlogits, const Tensor& hin,
                                             const Norm::Saved& ln, Saved* saved) {
  Backend& be = *ctx_.backend;
  const MemoryCategory ws = MemoryCategory::Workspace;
  Tensor dh = be.empty(hin.shape(), hin.dtype(), ws);
  be.matmul_backward(&dh, &weight_.grad, nullptr, dlogits, hin, weight_.value,
                     weight_.take_grad_write());
  dlogits = Tensor{};
  Tensor dh_local = enter_tp_region_backward(be, ctx_.tp, dh, ws);
  Tensor dx = ln_f_.backward(dh_local, ln);
  // Held until the pipeline's backward reaches this micro-batch: account it as an activation.
  saved->dx = be.empty(dx.shape(), dx.dtype(), MemoryCategory::Activations);
  be.copy(saved->dx, dx);
}

Tensor LanguageModelHead::logits(const Tensor& x) {
  Backend& be = *ctx_.backend;
  const MemoryCategory ws = MemoryCategory::Workspace;
  Norm::Saved ln;
  Tensor h = enter_tp_region_forward(be, ctx_.tp.without_sequence(), ln_f_.forward(x, ln, ws), ws);
  Tensor logits = be.empty({h.dim(0), weight_.shape[0]}, x.dtype(), ws);
  be.matmul_forward(logits, h, weight_.value, nullptr);
  return logits;
}

Tensor LanguageModelHead::backward(Saved& saved) {
  Tensor dx = saved.dx;
  saved = Saved{};
  return dx;
}


CostSheet LanguageModelHead::cost_sheet() const {
  CostSheet sheet;
  ln_f_.add_costs(sheet);
  const Shape& w = weight_.spec.global_shape;  // (V, C): vocabulary-parallel like the embedding
  sheet.linears.push_back({w[1], w[0], TpSplitOf::Outputs});
  ParameterCost weight = parameter_cost(weight_.spec);
  // Tied, the weight is the token embedding (or the last stage's copy of it).
  weight.shared = weight_.spec.role == ParamRole::TokenEmbedding;
  sheet.parameters.push_back(weight);
  // The fp32 logits: three passes in forward (cross-entropy's maximum and sum, then the loss and
  // the gradient written in place), two in backward.
  ElementwiseCost logits;
  logits.width = w[0];
  logits.width_split = true;
  logits.tokens = ElementwiseCost::Tokens::All;
  logits.forward_bytes = logits.backward_bytes = ElementwiseCost::Bytes::Fp32;
  logits.forward_accesses = 3;
  logits.backward_accesses = 2;
  sheet.elementwise.push_back(logits);
  return sheet;
}
}  // namespace meshtrain
