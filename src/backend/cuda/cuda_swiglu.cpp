// CudaBackend: SwiGLU, dispatched onto the launchers of swiglu.cu for calls the Backend front has
// checked (swiglu_front.cpp). The packed forms are the Backend's defaults (backend.cpp).

#include "backend_util.h"

namespace meshtrain {

using cuda::ptr;

void CudaBackend::do_swiglu_forward(Tensor& out, const Tensor& gate, const Tensor& up) {
  cuda::TimedOp timed(profile_, stream_, "swiglu_forward");
  const char* op = "swiglu_forward";
  cuda::dispatch(op, gate.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cuda::swiglu_forward(ptr<T>(op, out), ptr<T>(op, gate), ptr<T>(op, up), gate.numel(),
                         stream_);
  });
}

void CudaBackend::do_swiglu_backward(Tensor& dgate, Tensor& dup, const Tensor& dout,
                                     const Tensor& gate, const Tensor& up) {
  cuda::TimedOp timed(profile_, stream_, "swiglu_backward");
  const char* op = "swiglu_backward";
  cuda::dispatch(op, gate.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cuda::swiglu_backward(ptr<T>(op, dgate), ptr<T>(op, dup), ptr<T>(op, dout), ptr<T>(op, gate),
                          ptr<T>(op, up), gate.numel(), stream_);
  });
}

}  // namespace meshtrain
