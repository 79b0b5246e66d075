// Rotary position embedding in the rotate-half layout (Hugging Face's apply_rotary_pos_emb): in
// each head, channel i < D/2 pairs with i + D/2 and the pair turns by the angle of the row's
// position,
//   x'_i = x_i cos - x_{i+D/2} sin,   x'_{i+D/2} = x_{i+D/2} cos + x_i sin,
// cos and sin read from the table (rotary_table.h) at row `position`. The backward pass is the
// transpose, the same turn with sin negated. In place, in Acc<A>, each value rounded once.

#include "kernels.h"

namespace meshtrain::cpu {

int64_t rotary_row_outside(const int32_t* positions, int64_t N, int64_t P) {
  for (int64_t n = 0; n < N; ++n)
    if (positions[n] < 0 || positions[n] >= P) return n;
  return -1;
}

template <class A>
void rotary(A* x, const int32_t* positions, const Acc<A>* cos, const Acc<A>* sin, int64_t N,
            int64_t W, int64_t column, int64_t heads, int64_t head_dim, bool by_minus_angle) {
  using T = Acc<A>;
  const int64_t half = head_dim / 2;
  const T sign = by_minus_angle ? T(-1) : T(1);
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < heads; ++h) {
      A* head = x + n * W + column + h * head_dim;
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
                          int64_t, int64_t, int64_t, bool);
INSTANTIATE(float)
INSTANTIATE(double)
INSTANTIATE(bf16)
#undef INSTANTIATE

}  // namespace meshtrain::cpu
