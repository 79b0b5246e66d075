// Softmax cross-entropy on the device: the vocabulary-parallel pieces (statistics, rebase onto
// the global max, target logits, losses, gradient), and all of it in one pass over the logits
// where this rank holds the whole vocabulary.

#include <string>

#include "backend_util.h"
#include "cuda_check.h"

namespace meshtrain {

using cuda::cols_of;
using cuda::fp32_stat;
using cuda::ptr;
using cuda::require;
using cuda::rows_of;
using cuda::same_dtype;

void CudaBackend::crossentropy_stats(Tensor& row_max, Tensor& row_sumexp, const Tensor& logits) {
  cuda::TimedOp timed(profile_, stream_, "crossentropy_stats");
  const char* op = "crossentropy_stats";
  const int64_t N = rows_of(logits), V = cols_of(logits);
  require(row_max.numel() == N && row_sumexp.numel() == N, op, "shape mismatch");
  fp32_stat(op, logits.dtype(), "row_max", row_max);
  fp32_stat(op, logits.dtype(), "row_sumexp", row_sumexp);
  cuda::dispatch(op, logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cuda::crossentropy_stats(ptr<float>(op, row_max), ptr<float>(op, row_sumexp),
                             ptr<T>(op, logits), N, V, stream_);
  });
}

void CudaBackend::crossentropy_rebase(Tensor& row_sumexp, const Tensor& local_max,
                                      const Tensor& global_max) {
  cuda::TimedOp timed(profile_, stream_, "crossentropy_rebase");
  const char* op = "crossentropy_rebase";
  require(local_max.numel() == row_sumexp.numel() && global_max.numel() == row_sumexp.numel(), op,
          "size mismatch");
  cuda::crossentropy_rebase(ptr<float>(op, row_sumexp), ptr<float>(op, local_max),
                            ptr<float>(op, global_max), row_sumexp.numel(), stream_);
}

void CudaBackend::crossentropy_target_logit(Tensor& target_logit, const Tensor& logits,
                                            const Tensor& targets, int64_t vocab_begin) {
  cuda::TimedOp timed(profile_, stream_, "crossentropy_target_logit");
  const char* op = "crossentropy_target_logit";
  const int64_t N = rows_of(logits), V = cols_of(logits);
  require(target_logit.numel() == N && targets.numel() == N, op, "shape mismatch");
  fp32_stat(op, logits.dtype(), "target_logit", target_logit);
  cuda::dispatch(op, logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cuda::crossentropy_target_logit(ptr<float>(op, target_logit), ptr<T>(op, logits),
                                    ptr<int32_t>(op, targets), vocab_begin, N, V, stream_);
  });
}

void CudaBackend::crossentropy_losses(Tensor& losses, const Tensor& row_max,
                                      const Tensor& row_sumexp, const Tensor& target_logit) {
  cuda::TimedOp timed(profile_, stream_, "crossentropy_losses");
  const char* op = "crossentropy_losses";
  const int64_t N = losses.numel();
  require(row_max.numel() == N && row_sumexp.numel() == N && target_logit.numel() == N, op,
          "size mismatch");
  cuda::crossentropy_losses(ptr<float>(op, losses), ptr<float>(op, row_max),
                            ptr<float>(op, row_sumexp), ptr<float>(op, target_logit), N, stream_);
}

void CudaBackend::crossentropy_backward(Tensor& dlogits, const Tensor& logits,
                                        const Tensor& row_max, const Tensor& row_sumexp,
                                        const Tensor& targets, int64_t vocab_begin, double dloss) {
  cuda::TimedOp timed(profile_, stream_, "crossentropy_backward");
  const char* op = "crossentropy_backward";
  const int64_t N = rows_of(logits), V = cols_of(logits);
  require(dlogits.numel() == logits.numel() && row_max.numel() == N && row_sumexp.numel() == N &&
              targets.numel() == N,
          op, "shape mismatch");
  same_dtype(op, logits.dtype(), "dlogits", dlogits);
  fp32_stat(op, logits.dtype(), "row_max", row_max);
  fp32_stat(op, logits.dtype(), "row_sumexp", row_sumexp);
  cuda::dispatch(op, logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cuda::crossentropy_backward(ptr<T>(op, dlogits), ptr<T>(op, logits), ptr<float>(op, row_max),
                                ptr<float>(op, row_sumexp), ptr<int32_t>(op, targets),
                                vocab_begin, static_cast<float>(dloss), N, V, stream_);
  });
}

void CudaBackend::crossentropy_loss_and_backward(Tensor& dlogits, Tensor& losses,
                                                 const Tensor& logits, const Tensor& targets,
                                                 double dloss) {
  cuda::TimedOp timed(profile_, stream_, "crossentropy_loss_and_backward");
  const char* op = "crossentropy_loss_and_backward";
  const int64_t N = rows_of(logits), V = cols_of(logits);
  require(dlogits.numel() == logits.numel() && losses.numel() == N && targets.numel() == N, op,
          "shape mismatch");
  same_dtype(op, logits.dtype(), "dlogits", dlogits);
  fp32_stat(op, logits.dtype(), "losses", losses);
  cuda::dispatch(op, logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cuda::crossentropy_loss_and_backward(ptr<T>(op, dlogits), ptr<float>(op, losses),
                                         ptr<T>(op, logits), ptr<int32_t>(op, targets),
                                         static_cast<float>(dloss), N, V, stream_);
  });
}

}  // namespace meshtrain
