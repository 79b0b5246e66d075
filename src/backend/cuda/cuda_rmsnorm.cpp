// CudaBackend: the Llama-family layers (RMSNorm, SwiGLU, rotary embeddings), dispatched onto the
// launchers of llama_kernels.cu for calls the Backend front has checked (llama_layer_front.cpp).

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
                                      const Tensor& inp, const Tensor& weight, const Tensor& rstd) {
  rmsnorm_backward_with(dinp, dweight, dout, inp, weight, rstd, nullptr);
}

void CudaBackend::do_rmsnorm_backward_add(Tensor& dinp, Tensor& dweight, const Tensor& dout,
                                          const Tensor& inp, const Tensor& weight,
                                          const Tensor& rstd, const Tensor& residual) {
  rmsnorm_backward_with(dinp, dweight, dout, inp, weight, rstd, &residual);
}

void CudaBackend::rmsnorm_backward_with(Tensor& dinp, Tensor& dweight, const Tensor& dout,
                                        const Tensor& inp, const Tensor& weight,
                                        const Tensor& rstd, const Tensor* residual) {
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

void CudaBackend::do_rotary(Tensor& x, const Tensor& positions, const Tensor& cos,
                            const Tensor& sin, const RotaryHeads& where, Rotation rotation) {
  const bool backward = rotation == Rotation::ByMinusAngle;
  const char* op = backward ? "rotary_backward" : "rotary_forward";
  cuda::TimedOp timed(profile_, stream_, op);
  const int64_t N = positions.numel();
  if (N == 0) return;
  cuda::dispatch(op, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cuda::rotary(ptr<T>(op, x), ptr<int32_t>(op, positions), ptr<float>(op, cos),
                 ptr<float>(op, sin), N, x.numel() / N, where.column, where.heads, where.head_dim,
                 cos.dim(0), backward, stream_);
  });
}

}  // namespace meshtrain
