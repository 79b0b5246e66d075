// GELU, tanh approximation (Hendrycks & Gimpel, arXiv 1606.08415), as GPT-2 uses it:
//   gelu(x) = 0.5 x (1 + tanh(u)),  u = k (x + 0.044715 x^3),  k = sqrt(2 / pi)
//   d/dx    = 0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) k (1 + 3 * 0.044715 x^2)

#include <cmath>

#include "kernels.h"
#include "vector_math.h"

namespace meshtrain::cpu {

namespace {
constexpr double kScale = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kCube = 0.044715;
}  // namespace

template <class A> void gelu_forward(A* out, const A* inp, int64_t n) {
  using T = Acc<A>;
  const T k = static_cast<T>(kScale), a = static_cast<T>(kCube);
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const T x = widen(inp[i]);
    out[i] = narrow<A>(T(0.5) * x * (T(1) + vtanh<T>(k * (x + a * x * x * x))));
  }
}

template <class A> void gelu_backward(A* dinp, const A* inp, const A* dout, int64_t n) {
  using T = Acc<A>;
  const T k = static_cast<T>(kScale), a = static_cast<T>(kCube);
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const T x = widen(inp[i]);
    const T t = vtanh<T>(k * (x + a * x * x * x));
    const T local = T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * k * (T(1) + T(3) * a * x * x);
    dinp[i] = narrow<A>(local * widen(dout[i]));
  }
}

#define INSTANTIATE(A)                                                  \
  template void gelu_forward<A>(A*, const A*, int64_t);                 \
  template void gelu_backward<A>(A*, const A*, const A*, int64_t);
INSTANTIATE(float)
INSTANTIATE(double)
INSTANTIATE(bf16)
#undef INSTANTIATE

}  // namespace meshtrain::cpu
