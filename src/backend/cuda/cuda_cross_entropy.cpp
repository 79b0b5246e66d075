// Softmax cross-entropy on the device: the vocabulary-parallel pieces (statistics, rebase onto
// the global max, target logits, losses, gradient), and all of it in one pass over the logits
// where this rank holds the whole vocabulary.

#include <string>

#include "backend_util.h"
#include "cuda_check.h"

namespace meshtrain {

using cuda::cols_of;
using cuda::ptr;
using cuda::rows_of;

void CudaBackend::do_crossentropy_stats(Tensor& row_max, Tensor& row_sumexp, const Tensor& logits) {
  cuda::TimedOp timed(profile_, stream_, "crossentropy_stats");
  const char* op = "crossentropy_stats";
  const int64_t N = rows_of(logits), V = cols_of(logits);
  cuda::dispatch(op, logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cuda::crossentropy_stats(ptr<float>(op, row_max), ptr<float>(op, row_sumexp),
                             ptr<T>(op, logits), N, V, stream_);
  });
}

void CudaBackend::do_crossentropy_rebase(Tensor& row_sumexp, const Tensor& local_max,
                                         const Tensor& global_max) {
  cuda::TimedOp timed(profile_, stream_, "crossentropy_rebase");
  const char* op = "crossentropy_rebase";
  cuda::crossentropy_rebase(ptr<float>(op, row_sumexp), ptr<float>(op, local_max),
                            ptr<float>(op, global_max), row_sumexp.numel(), stream_);
}

void CudaBackend::do_crossentropy_target_logit(Tensor& target_logit, const Tensor& logits,
                                               const Tensor& targets, int64_t vocab_begin) {
  cuda::TimedOp timed(profile_, stream_, "crossentropy_target_logit");
  const char* op = "crossentropy_target_logit";
  const int64_t N = rows_of(logits), V = cols_of(logits);
  cuda::dispatch(op, logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cuda::crossentropy_target_logit(ptr<float>(op, target_logit), ptr<T>(op, logits),
                                    ptr<int32_t>(op, targets), vocab_begin, N, V, stream_);
  });
}

void CudaBackend::do_crossentropy_losses(Tensor& losses, const Tensor& row_max,
                                         const Tensor& row_sumexp, const Tensor& target_logit) {
  cuda::TimedOp timed(profile_, stream_, "crossentropy_losses");
  const char* op = "crossentropy_losses";
  const int64_t N = losses.numel();
  cuda::crossentropy_losses(ptr<float>(op, losses), ptr<float>(op, row_max),
                            ptr<float>(op, row_sumexp), ptr<float>(op, target_logit), N, stream_);
}

void CudaBackend::do_crossentropy_backward(Tensor& dlogits, const Tensor& logits,
                                           const Tensor& row_max, const Tensor& row_sumexp,
                                           const Tensor& targets, int64_t vocab_begin,
                                           double dloss) {
  cuda::TimedOp timed(profile_, stream_, "crossentropy_backward");
  const char* op = "crossentropy_backward";
  const int64_t N = rows_of(logits), V = cols_of(logits);
  cuda::dispatch(op, logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cuda::crossentropy_backward(ptr<T>(op, dlogits), ptr<T>(op, logits), ptr<float>(op, row_max),
                                ptr<float>(op, row_sumexp), ptr<int32_t>(op, targets),
                                vocab_begin, static_cast<float>(dloss), N, V, stream_);
  });
}

void CudaBackend::do_crossentropy_loss_and_backward(Tensor& dlogits, Tensor& losses,
                                                    const Tensor& logits, const Tensor& targets,
                                                    double dloss) {
  cuda::TimedOp timed(profile_, stream_, "crossentropy_loss_and_backward");
  const char* op = "crossentropy_loss_and_backward";
  const int64_t N = rows_of(logits), V = cols_of(logits);
  cuda::dispatch(op, logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cuda::crossentropy_loss_and_backward(ptr<T>(op, dlogits), ptr<float>(op, losses),
                                         ptr<T>(op, logits), ptr<int32_t>(op, targets),
                                         static_cast<float>(dloss), N, V, stream_);
  });
}

}  // namespace meshtrain
