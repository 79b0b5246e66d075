// RMSNorm (Zhang & Sennrich, arXiv 1910.07467) over the last dimension, eps from the caller:
//   rstd = 1 / sqrt(sum_c x_c^2 / C + eps),  n_c = x_c * rstd,  y_c = n_c * w_c
// Backward, with g_c = dy_c * w_c (the mean term of LayerNorm's gradient is absent: RMSNorm does
// not centre):
//   dx_c = rstd * (g_c - n_c * mean(g * n)),  dw_c += dy_c n_c
// dw is summed per thread over a fixed row partition and then combined in thread order, as
// LayerNorm's parameter gradients are.

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "kernels.h"

namespace meshtrain::cpu {

template <class A>
void rmsnorm_forward(A* out, Acc<A>* rstd, const A* inp, const A* weight, double eps, int64_t N,
                     int64_t C) {
  using T = Acc<A>;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const A* x = inp + i * C;
    T s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < C; ++c) s += widen(x[c]) * widen(x[c]);
    // The root in double, rounded once, as LayerNorm's: the same rstd whatever the library's
    // float rsqrt does.
    const T r = static_cast<T>(1.0 / std::sqrt(static_cast<double>(s / static_cast<T>(C)) + eps));
    A* y = out + i * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) y[c] = narrow<A>(widen(x[c]) * r * widen(weight[c]));
    rstd[i] = r;
  }
}

template <class A>
void rmsnorm_backward(A* dinp, Acc<A>* dweight, const A* dout, const A* inp, const A* weight,
                      const Acc<A>* rstd, int64_t N, int64_t C, Acc<A>* scratch,
                      const A* residual) {
  using T = Acc<A>;
  const int threads = kernel_threads();
  std::fill(scratch, scratch + static_cast<int64_t>(threads) * C, T(0));
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    T* dw = scratch + static_cast<int64_t>(t) * C;
    const int64_t begin = N * t / nt, end = N * (t + 1) / nt;
    for (int64_t i = begin; i < end; ++i) {
      const A* x = inp + i * C;
      const A* dy = dout + i * C;
      const T r = rstd[i];
      T gn_mean = 0;
#pragma omp simd reduction(+ : gn_mean)
      for (int64_t c = 0; c < C; ++c) gn_mean += widen(dy[c]) * widen(weight[c]) * (widen(x[c]) * r);
      gn_mean /= static_cast<T>(C);
      A* dx = dinp + i * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        const T n = widen(x[c]) * r;
        const T g = widen(dy[c]);
        dx[c] = narrow<A>(r * (g * widen(weight[c]) - n * gn_mean));
        dw[c] += g * n;
      }
      if (residual) add_row(dx, residual + i * C, C);
    }
  }
  for (int t = 0; t < threads; ++t) {
    const T* dw = scratch + static_cast<int64_t>(t) * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) dweight[c] += dw[c];
  }
}

#define INSTANTIATE(A)                                                                         \
  template void rmsnorm_forward<A>(A*, Acc<A>*, const A*, const A*, double, int64_t, int64_t); \
  template void rmsnorm_backward<A>(A*, Acc<A>*, const A*, const A*, const A*, const Acc<A>*,  \
                                    int64_t, int64_t, Acc<A>*, const A*);
INSTANTIATE(float)
INSTANTIATE(double)
INSTANTIATE(bf16)
#undef INSTANTIATE

}  // namespace meshtrain::cpu
