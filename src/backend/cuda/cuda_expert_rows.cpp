// CudaBackend: the mixture-of-experts row operations (gather_rows, gathered_row_dots), dispatched
// onto the launchers of expert_rows.cu for calls the Backend front has checked
// (expert_rows_front.cpp). The index stays on the device: an entry outside [-1, M) is left out
// by the kernels rather than refused (backend.h).

#include "backend_util.h"

namespace meshtrain {

using cuda::ptr;

void CudaBackend::do_gather_rows(Tensor& out, const Tensor& src, const Tensor& index,
                                 const Tensor* weights) {
  const char* op = "gather_rows";
  cuda::TimedOp timed(profile_, stream_, op);
  cuda::dispatch(op, src.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cuda::gather_rows(ptr<T>(op, out), ptr<T>(op, src), ptr<int32_t>(op, index),
                      weights == nullptr ? nullptr : ptr<float>(op, *weights), out.dim(0),
                      out.dim(1), index.dim(1), src.dim(0), stream_);
  });
}

void CudaBackend::do_gathered_row_dots(Tensor& out, const Tensor& a, const Tensor& b,
                                       const Tensor& index) {
  const char* op = "gathered_row_dots";
  cuda::TimedOp timed(profile_, stream_, op);
  cuda::dispatch(op, a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cuda::gathered_row_dots(ptr<float>(op, out), ptr<T>(op, a), ptr<T>(op, b),
                            ptr<int32_t>(op, index), a.dim(0), a.dim(1), index.dim(1), b.dim(0),
                            stream_);
  });
}

}  // namespace meshtrain
