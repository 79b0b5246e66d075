// SwiGLU (Shazeer, arXiv 2002.05202), the feed-forward activation of Llama and Qwen:
//   out = silu(g) * u,  silu(g) = g * s,  s = sigmoid(g) = 1 / (1 + e^-g)
//   dg  = dout * u * s * (1 + g * (1 - s)),  du = dout * silu(g)
// The float exponential is vector_math.h's: it clamps its argument, so a gate of -100 gives a
// sigmoid of ~1e-38 rather than an overflow, and silu stays finite everywhere.

#include "kernels.h"
#include "vector_math.h"

namespace meshtrain::cpu {

namespace {
template <class T> inline T sigmoid(T g) { return T(1) / (T(1) + vexp<T>(-g)); }
}  // namespace

template <class A> void swiglu_forward(A* out, const A* gate, const A* up, int64_t n) {
  using T = Acc<A>;
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const T g = widen(gate[i]);
    out[i] = narrow<A>(g * sigmoid(g) * widen(up[i]));
  }
}

template <class A>
void swiglu_backward(A* dgate, A* dup, const A* dout, const A* gate, const A* up, int64_t n) {
  using T = Acc<A>;
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const T g = widen(gate[i]), u = widen(up[i]), dy = widen(dout[i]);
    const T s = sigmoid(g);
    dgate[i] = narrow<A>(dy * u * (s * (T(1) + g * (T(1) - s))));
    dup[i] = narrow<A>(dy * (g * s));
  }
}

#define INSTANTIATE(A)                                                          \
  template void swiglu_forward<A>(A*, const A*, const A*, int64_t);             \
  template void swiglu_backward<A>(A*, A*, const A*, const A*, const A*, int64_t);
INSTANTIATE(float)
INSTANTIATE(double)
INSTANTIATE(bf16)
#undef INSTANTIATE

}  // namespace meshtrain::cpu
