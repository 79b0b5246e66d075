// CudaBackend: rotary position embeddings, dispatched onto the launcher of rotary.cu for calls the
// Backend front has checked (rotary_front.cpp).

#include "backend_util.h"

namespace meshtrain {

using cuda::ptr;

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
                 where.head_stride(), cos.dim(0), backward, stream_);
  });
}

}  // namespace meshtrain
