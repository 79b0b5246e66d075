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

#include "cpu_checks.h"
#include "kernels.h"
#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/backend/kernel_profile.h"

namespace meshtrain {
namespace cpu {

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

}  // namespace cpu

// The CpuBackend's hooks for RMSNorm's forward and backward: the dtype dispatch (cpu_checks.h)
// onto the kernels above, for calls the Backend front has checked (rmsnorm_front.cpp).

void CpuBackend::do_rmsnorm_forward(Tensor& out, Tensor& rstd, const Tensor& inp,
                                    const Tensor& weight, double eps) {
  const char* op = "rmsnorm_forward";
  KernelProfile::Scope timed(profile_, op);
  const int64_t N = cpu::rows_of(inp), C = cpu::cols_of(inp);
  cpu::dispatch(planning_, op, inp.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using W = cpu::Acc<T>;
    cpu::rmsnorm_forward<T>(cpu::ptr<T>(out), cpu::ptr<W>(rstd), cpu::ptr<T>(inp),
                            cpu::ptr<T>(weight), eps, N, C);
  });
}

// The residual, if any, added to each row of dinp as the kernel writes it, not by a pass of its
// own.
void CpuBackend::do_rmsnorm_backward(Tensor& dinp, Tensor& dweight, const Tensor& dout,
                                     const Tensor& inp, const Tensor& weight, const Tensor& rstd,
                                     const Tensor* residual) {
  const char* op = residual ? "rmsnorm_backward_add" : "rmsnorm_backward";
  KernelProfile::Scope timed(profile_, op);
  const int64_t N = cpu::rows_of(inp), C = cpu::cols_of(inp);
  const DType a = inp.dtype();
  Tensor scratch = empty({int64_t{threads()} * C}, cpu::wide(a), MemoryCategory::Workspace);
  cpu::dispatch(planning_, op, a, [&](auto tag) {
    using T = decltype(tag);
    using W = cpu::Acc<T>;
    cpu::rmsnorm_backward<T>(cpu::ptr<T>(dinp), cpu::ptr<W>(dweight), cpu::ptr<T>(dout),
                             cpu::ptr<T>(inp), cpu::ptr<T>(weight), cpu::ptr<W>(rstd), N, C,
                             cpu::ptr<W>(scratch), residual ? cpu::ptr<T>(*residual) : nullptr);
  });
}

}  // namespace meshtrain
