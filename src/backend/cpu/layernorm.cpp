// LayerNorm (Ba et al., arXiv 1607.06450) over the last dimension, eps = 1e-5:
//   mean = sum_c x_c / C,  rstd = 1 / sqrt(sum_c (x_c - mean)^2 / C + eps)
//   y_c  = (x_c - mean) * rstd * w_c + b_c
// Backward, with n_c = (x_c - mean) * rstd and g_c = dy_c * w_c:
//   dx_c = rstd * (g_c - mean(g) - n_c * mean(g * n)),  dw_c += dy_c n_c,  db_c += dy_c
// dw/db are summed per thread over a fixed row partition and then combined in thread order.

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "kernels.h"

namespace meshtrain::cpu {

namespace {
constexpr double kEps = 1e-5;
}

template <class A>
void layernorm_forward(A* out, Acc<A>* mean, Acc<A>* rstd, const A* inp, const A* weight,
                       const A* bias, int64_t N, int64_t C) {
  using T = Acc<A>;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const A* x = inp + i * C;
    T s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < C; ++c) s += widen(x[c]);
    const T m = s / static_cast<T>(C);
    T v = 0;
#pragma omp simd reduction(+ : v)
    for (int64_t c = 0; c < C; ++c) v += (widen(x[c]) - m) * (widen(x[c]) - m);
    const T r = static_cast<T>(1.0 / std::sqrt(static_cast<double>(v / static_cast<T>(C)) + kEps));
    A* y = out + i * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c)
      y[c] = narrow<A>((widen(x[c]) - m) * r * widen(weight[c]) + widen(bias[c]));
    mean[i] = m;
    rstd[i] = r;
  }
}

template <class A>
void layernorm_backward(A* dinp, Acc<A>* dweight, Acc<A>* dbias, const A* dout, const A* inp,
                        const A* weight, const Acc<A>* mean, const Acc<A>* rstd, int64_t N,
                        int64_t C, Acc<A>* scratch, const A* residual) {
  using T = Acc<A>;
  const int threads = kernel_threads();
  std::fill(scratch, scratch + static_cast<int64_t>(threads) * 2 * C, T(0));
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    T* dw = scratch + static_cast<int64_t>(t) * 2 * C;
    T* db = dw + C;
    const int64_t begin = N * t / nt, end = N * (t + 1) / nt;
    for (int64_t i = begin; i < end; ++i) {
      const A* x = inp + i * C;
      const A* dy = dout + i * C;
      const T m = mean[i], r = rstd[i];
      T g_mean = 0, gn_mean = 0;
#pragma omp simd reduction(+ : g_mean, gn_mean)
      for (int64_t c = 0; c < C; ++c) {
        const T n = (widen(x[c]) - m) * r;
        const T g = widen(dy[c]) * widen(weight[c]);
        g_mean += g;
        gn_mean += g * n;
      }
      g_mean /= static_cast<T>(C);
      gn_mean /= static_cast<T>(C);
      A* dx = dinp + i * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        const T n = (widen(x[c]) - m) * r;
        const T g = widen(dy[c]);
        dx[c] = narrow<A>(r * (g * widen(weight[c]) - g_mean - n * gn_mean));
        dw[c] += g * n;
        db[c] += g;
      }
      if (residual) add_row(dx, residual + i * C, C);
    }
  }
  for (int t = 0; t < threads; ++t) {
    const T* dw = scratch + static_cast<int64_t>(t) * 2 * C;
    const T* db = dw + C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) {
      dweight[c] += dw[c];
      dbias[c] += db[c];
    }
  }
}

#define INSTANTIATE(A)                                                                        \
  template void layernorm_forward<A>(A*, Acc<A>*, Acc<A>*, const A*, const A*, const A*,      \
                                     int64_t, int64_t);                                       \
  template void layernorm_backward<A>(A*, Acc<A>*, Acc<A>*, const A*, const A*, const A*,     \
                                      const Acc<A>*, const Acc<A>*, int64_t, int64_t, Acc<A>*, \
                                      const A*);
INSTANTIATE(float)
INSTANTIATE(double)
INSTANTIATE(bf16)
#undef INSTANTIATE

}  // namespace meshtrain::cpu
