// CudaBackend: RMSNorm, dispatched onto the launchers of rmsnorm.cu for calls the Backend front has
// checked (rmsnorm_front.cpp).

#include "backend_util.h"

namespace meshtrain {

using cuda::cols_of;
using cuda::ptr;
using cuda::rows_of;

void CudaBackend::do_rmsnorm_forward(Tensor& out, Tensor& rstd, const Tensor& inp,
                                     const Tensor& weight, double eps) {
  cuda::TimedOp timed(profile_, stream_, "rmsnorm_forward");
  const char* op = "rmsnorm_forward";
  const int64_t N = rows_of(inp), C = cols_of(inp);
  cuda::dispatch(op, inp.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cuda::rmsnorm_forward(ptr<T>(op, out), ptr<float>(op, rstd), ptr<T>(op, inp),
                          ptr<T>(op, weight), eps, N, C, stream_);
  });
}

void CudaBackend::do_rmsnorm_backward(Tensor& dinp, Tensor& dweight, const Tensor& dout,
                                      const Tensor& inp, const Tensor& weight, const Tensor& rstd,
                                      const Tensor* residual) {
  cuda::TimedOp timed(profile_, stream_, "rmsnorm_backward");
  const char* op = "rmsnorm_backward";
  const int64_t N = rows_of(inp), C = cols_of(inp);
  Tensor scratch =
      empty({cuda::rmsnorm_backward_scratch(N, C)}, DType::F32, MemoryCategory::Workspace);
  cuda::dispatch(op, inp.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cuda::rmsnorm_backward(ptr<T>(op, dinp), ptr<float>(op, dweight), ptr<T>(op, dout),
                           ptr<T>(op, inp), ptr<T>(op, weight),
                           residual == nullptr ? nullptr : ptr<T>(op, *residual),
                           ptr<float>(op, rstd), N, C, ptr<float>(op, scratch), stream_);
  });
}

}  // namespace meshtrain
