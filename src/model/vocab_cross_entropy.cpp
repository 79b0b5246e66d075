#include "meshtrain/model/vocab_cross_entropy.h"

namespace meshtrain {

namespace {
// From d(loss)/d(logits) (freed on return) to d(loss)/d(hin); the weight's gradient accumulates.
Tensor backward_from_logits(Backend& be, Parameter& weight, Tensor& dlogits, const Tensor& hin) {
  Tensor dh = be.empty(hin.shape(), hin.dtype(), MemoryCategory::Workspace);
  be.matmul_backward(&dh, &weight.grad, nullptr, dlogits, hin, weight.value, weight.take_grad_write());
  dlogits = Tensor{};
  return dh;
}
}  // namespace

Tensor vocab_cross_entropy(const LayerContext& ctx, Parameter& weight, const Tensor& hin,
                           const Tensor& targets, double dloss, bool train, LossAccumulator& loss) {
  Backend& be = *ctx.backend;
  Communicator& tp = *ctx.tp.comm;
  const int64_t N = hin.dim(0), V = weight.shape[0];
  const DType dt = hin.dtype();
  const MemoryCategory ws = MemoryCategory::Workspace;
  Tensor logits = be.empty({N, V}, dt, ws);
  be.matmul_forward(logits, hin, weight.value, nullptr);

  const DType st = stats_dtype(dt);
  if (train && tp.size() == 1) {  // the whole vocabulary here: loss and gradient in one pass
    Tensor losses = be.empty({N}, st, ws);
    be.crossentropy_loss_and_backward(logits, losses, logits, targets, dloss);
    loss.add(losses);
    return backward_from_logits(be, weight, logits, hin);
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
  be.crossentropy_target_logit(target_logit, logits, targets, weight.split_begin);
  tp.all_reduce(target_logit).wait();
  Tensor losses = be.empty({N}, st, ws);
  be.crossentropy_losses(losses, row_max, row_sumexp, target_logit);
  loss.add(losses);
  if (!train) return {};

  be.crossentropy_backward(logits, logits, row_max, row_sumexp, targets, weight.split_begin, dloss);
  return backward_from_logits(be, weight, logits, hin);
}

}  // namespace meshtrain
