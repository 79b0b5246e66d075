#include "meshtrain/model/lm_head.h"

#include "meshtrain/model/vocab_cross_entropy.h"

namespace meshtrain {

LanguageModelHead::LanguageModelHead(const LayerContext& ctx, int64_t C, const NormSpec& norm,
                                     Parameter& weight, MultiTokenPrediction* mtp)
    : ctx_(ctx), ln_f_(ctx, "ln_f", C, norm), weight_(weight), mtp_(mtp) {}

void LanguageModelHead::forward(const Tensor& x, const Tensor& targets, TokenShape shape,
                                double dloss, Saved* saved, LossAccumulator& loss) {
  Backend& be = *ctx_.backend;
  const MemoryCategory ws = MemoryCategory::Workspace;

  Norm::Saved ln;
  Tensor h = ln_f_.forward(x, ln, ws);
  Tensor hin = enter_tp_region_forward(be, ctx_.tp, h, ws);
  Tensor dh = vocab_cross_entropy(ctx_, weight_, hin, targets, dloss, saved != nullptr, loss);
  if (!saved) return;
  Tensor dh_local = enter_tp_region_backward(be, ctx_.tp, dh, ws);
  // The multi-token prediction depths read the normed state h and return their gradient of it.
  if (mtp_) be.add_inplace(dh_local, mtp_->forward_backward(h, targets, shape, dloss));
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
  if (mtp_) mtp_->add_costs(sheet);
  return sheet;
}
}  // namespace meshtrain
