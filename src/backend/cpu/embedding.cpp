// Token and position embeddings. Backward kernels parallelise over channel blocks rather than
// rows: two rows with the same token (or position) add into the same gradient row, and
// splitting by channels makes that race-free and the summation order fixed.

#include <algorithm>
#include <cstring>

#include "kernels.h"

namespace meshtrain::cpu {

namespace {
constexpr int64_t kChannelBlock = 64;
}

template <class A>
void embedding_forward(A* out, const int32_t* tokens, const A* table, int64_t vocab_begin,
                       int64_t vocab_size, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const int64_t row = static_cast<int64_t>(tokens[i]) - vocab_begin;
    A* o = out + i * C;
    if (row >= 0 && row < vocab_size)
      std::memcpy(o, table + row * C, static_cast<size_t>(C) * sizeof(A));
    else
      std::fill(o, o + C, narrow<A>(0));
  }
}

template <class A>
void embedding_backward(Acc<A>* dtable, const A* dout, const int32_t* tokens, int64_t vocab_begin,
                        int64_t vocab_size, int64_t N, int64_t C) {
  const int64_t blocks = (C + kChannelBlock - 1) / kChannelBlock;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t c0 = blk * kChannelBlock, c1 = std::min(C, c0 + kChannelBlock);
    for (int64_t i = 0; i < N; ++i) {
      const int64_t row = static_cast<int64_t>(tokens[i]) - vocab_begin;
      if (row < 0 || row >= vocab_size) continue;
      Acc<A>* d = dtable + row * C;
      const A* g = dout + i * C;
#pragma omp simd
      for (int64_t c = c0; c < c1; ++c) d[c] += widen(g[c]);
    }
  }
}

template <class A>
void position_forward(A* out, const A* table, int64_t token_begin, int64_t T_, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const A* p = table + ((token_begin + i) % T_) * C;
    A* o = out + i * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) o[c] = narrow<A>(widen(o[c]) + widen(p[c]));
  }
}

template <class A>
void position_backward(Acc<A>* dtable, const A* dout, int64_t token_begin, int64_t T_, int64_t N,
                       int64_t C) {
  const int64_t blocks = (C + kChannelBlock - 1) / kChannelBlock;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t c0 = blk * kChannelBlock, c1 = std::min(C, c0 + kChannelBlock);
    for (int64_t i = 0; i < N; ++i) {
      Acc<A>* d = dtable + ((token_begin + i) % T_) * C;
      const A* g = dout + i * C;
#pragma omp simd
      for (int64_t c = c0; c < c1; ++c) d[c] += widen(g[c]);
    }
  }
}

#define INSTANTIATE(A)                                                                        \
  template void embedding_forward<A>(A*, const int32_t*, const A*, int64_t, int64_t, int64_t, \
                                     int64_t);                                                \
  template void embedding_backward<A>(Acc<A>*, const A*, const int32_t*, int64_t, int64_t,    \
                                      int64_t, int64_t);                                      \
  template void position_forward<A>(A*, const A*, int64_t, int64_t, int64_t, int64_t);        \
  template void position_backward<A>(Acc<A>*, const A*, int64_t, int64_t, int64_t, int64_t);
INSTANTIATE(float)
INSTANTIATE(double)
INSTANTIATE(bf16)
#undef INSTANTIATE

}  // namespace meshtrain::cpu
