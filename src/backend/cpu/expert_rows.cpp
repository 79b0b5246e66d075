// Token rows to their experts and back (backend.h, gather_rows and gathered_row_dots), the CPU
// kernels. Every output row is written by one thread, from its own K index entries, so the
// result has the same bits whatever the thread count; nothing is scattered, so no two threads
// ever add into one row.
//
// gather_rows sums a row's kept terms in index order j, starting from the first kept term (not
// from zero: 0 + -0 is +0, and dispatch, K = 1 without weights, must copy a row exactly).
// The terms are the outer loop and the channels the vectorised inner one, each channel's sum
// kept in Acc<A> until the row is stored: every channel sees the same scalar sequence of adds.

#include <algorithm>
#include <vector>

#include "kernels.h"

namespace meshtrain::cpu {

int64_t gather_index_outside(const int32_t* index, int64_t n, int64_t M) {
  for (int64_t i = 0; i < n; ++i)
    if (index[i] < -1 || index[i] >= M) return i;
  return -1;
}

template <class A>
void gather_rows(A* out, const A* src, const int32_t* index, const Acc<A>* weights, int64_t R,
                 int64_t C, int64_t K) {
  using T = Acc<A>;
#pragma omp parallel
  {
    std::vector<T> acc(static_cast<size_t>(C));  // this thread's row sum, in Acc<A>
    T* sum = acc.data();
#pragma omp for schedule(static)
    for (int64_t r = 0; r < R; ++r) {
      bool first = true;
      for (int64_t j = 0; j < K; ++j) {
        const int32_t m = index[r * K + j];
        if (m < 0) continue;
        const A* x = src + m * C;
        const T w = weights == nullptr ? T(1) : weights[r * K + j];
        if (first) {
#pragma omp simd
          for (int64_t c = 0; c < C; ++c) sum[c] = w * widen(x[c]);
        } else {
#pragma omp simd
          for (int64_t c = 0; c < C; ++c) sum[c] += w * widen(x[c]);
        }
        first = false;
      }
      if (first) std::fill(sum, sum + C, T(0));  // every term skipped
      A* y = out + r * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) y[c] = narrow<A>(sum[c]);
    }
  }
}

template <class A>
void gathered_row_dots(Acc<A>* out, const A* a, const A* b, const int32_t* index, int64_t R,
                       int64_t C, int64_t K) {
  using T = Acc<A>;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t r = 0; r < R; ++r)
    for (int64_t j = 0; j < K; ++j) {
      const int32_t m = index[r * K + j];
      if (m < 0) {
        out[r * K + j] = T(0);
        continue;
      }
      const A* x = a + r * C;
      const A* y = b + m * C;
      // A vectorised sum: its order is fixed by the code, not by the threads.
      T s = 0;
#pragma omp simd reduction(+ : s)
      for (int64_t c = 0; c < C; ++c) s += widen(x[c]) * widen(y[c]);
      out[r * K + j] = s;
    }
}

#define INSTANTIATE(A)                                                                         \
  template void gather_rows<A>(A*, const A*, const int32_t*, const Acc<A>*, int64_t, int64_t, \
                               int64_t);                                                       \
  template void gathered_row_dots<A>(Acc<A>*, const A*, const A*, const int32_t*, int64_t,    \
                                     int64_t, int64_t);
INSTANTIATE(float)
INSTANTIATE(double)
INSTANTIATE(bf16)
#undef INSTANTIATE

}  // namespace meshtrain::cpu
