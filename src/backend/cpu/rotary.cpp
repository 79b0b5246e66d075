// Rotary position embedding in the rotate-half layout (Hugging Face's apply_rotary_pos_emb): in
// each head, channel i < D/2 pairs with i + D/2 and the pair turns by the angle of the row's
// position,
//   x'_i = x_i cos - x_{i+D/2} sin,   x'_{i+D/2} = x_{i+D/2} cos + x_i sin,
// cos and sin read from the table (rotary_table.h) at row `position`. The backward pass is the
// transpose, the same turn with sin negated. In place, in Acc<A>, each value rounded once.

#include <stdexcept>
#include <string>

#include "cpu_checks.h"
#include "kernels.h"
#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/backend/kernel_profile.h"

namespace meshtrain {
namespace cpu {

int64_t rotary_row_outside(const int32_t* positions, int64_t N, int64_t P) {
  for (int64_t n = 0; n < N; ++n)
    if (positions[n] < 0 || positions[n] >= P) return n;
  return -1;
}

template <class A>
void rotary(A* x, const int32_t* positions, const Acc<A>* cos, const Acc<A>* sin, int64_t N,
            int64_t W, int64_t column, int64_t heads, int64_t head_dim, int64_t stride,
            bool by_minus_angle) {
  using T = Acc<A>;
  const int64_t half = head_dim / 2;
  const T sign = by_minus_angle ? T(-1) : T(1);
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < heads; ++h) {
      A* head = x + n * W + column + h * stride;
      const T* c = cos + positions[n] * half;
      const T* s = sin + positions[n] * half;
#pragma omp simd
      for (int64_t i = 0; i < half; ++i) {
        const T a = widen(head[i]), b = widen(head[i + half]), sn = sign * s[i];
        head[i] = narrow<A>(a * c[i] - b * sn);
        head[i + half] = narrow<A>(b * c[i] + a * sn);
      }
    }
}

#define INSTANTIATE(A)                                                                       \
  template void rotary<A>(A*, const int32_t*, const Acc<A>*, const Acc<A>*, int64_t, int64_t, \
                          int64_t, int64_t, int64_t, int64_t, bool);
INSTANTIATE(float)
INSTANTIATE(double)
INSTANTIATE(bf16)
#undef INSTANTIATE

}  // namespace cpu

// The CpuBackend's hook for the rotation by the angle or by minus it: the dtype dispatch
// (cpu_checks.h) onto the kernel above, for calls the Backend front has checked
// (rotary_front.cpp).

void CpuBackend::do_rotary(Tensor& x, const Tensor& positions, const Tensor& cos,
                           const Tensor& sin, const RotaryHeads& where, Rotation rotation) {
  const bool backward = rotation == Rotation::ByMinusAngle;
  const char* op = backward ? "rotary_backward" : "rotary_forward";
  KernelProfile::Scope timed(profile_, op);
  const int64_t N = positions.numel(), P = cos.dim(0);
  if (N == 0) return;
  cpu::dispatch(planning_, op, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using W = cpu::Acc<T>;
    // The positions are host memory here: a position past the table is refused rather than read
    // out of bounds (a GPU cannot check without waiting; backend.h).
    const int32_t* pos = cpu::ptr<int32_t>(positions);
    if (const int64_t n = cpu::rotary_row_outside(pos, N, P); n >= 0)
      throw std::invalid_argument(
          std::string("backend 'cpu': ") + op + ": position " + std::to_string(pos[n]) +
          " of row " + std::to_string(n) + " is outside the rotary table's " + std::to_string(P) +
          " positions (build the table for the longest sequence the model runs)");
    cpu::rotary<T>(cpu::ptr<T>(x), pos, cpu::ptr<W>(cos), cpu::ptr<W>(sin), N, x.numel() / N,
                   where.column, where.heads, where.head_dim, where.head_stride(), backward);
  });
}

}  // namespace meshtrain
