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

template <class T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, int64_t vocab_begin,
                       int64_t vocab_size, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const int64_t row = static_cast<int64_t>(tokens[i]) - vocab_begin;
    T* o = out + i * C;
    if (row >= 0 && row < vocab_size)
      std::memcpy(o, wte + row * C, static_cast<size_t>(C) * sizeof(T));
    else
      std::fill(o, o + C, T(0));
  }
}

template <class T>
void embedding_backward(T* dwte, const T* dout, const int32_t* tokens, int64_t vocab_begin,
                        int64_t vocab_size, int64_t N, int64_t C) {
  const int64_t blocks = (C + kChannelBlock - 1) / kChannelBlock;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t c0 = blk * kChannelBlock, c1 = std::min(C, c0 + kChannelBlock);
    for (int64_t i = 0; i < N; ++i) {
      const int64_t row = static_cast<int64_t>(tokens[i]) - vocab_begin;
      if (row < 0 || row >= vocab_size) continue;
      T* d = dwte + row * C;
      const T* g = dout + i * C;
#pragma omp simd
      for (int64_t c = c0; c < c1; ++c) d[c] += g[c];
    }
  }
}

template <class T>
void position_forward(T* out, const T* wpe, int64_t token_begin, int64_t T_, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const T* p = wpe + ((token_begin + i) % T_) * C;
    T* o = out + i * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) o[c] += p[c];
  }
}

template <class T>
void position_backward(T* dwpe, const T* dout, int64_t token_begin, int64_t T_, int64_t N,
                       int64_t C) {
  const int64_t blocks = (C + kChannelBlock - 1) / kChannelBlock;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t c0 = blk * kChannelBlock, c1 = std::min(C, c0 + kChannelBlock);
    for (int64_t i = 0; i < N; ++i) {
      T* d = dwpe + ((token_begin + i) % T_) * C;
      const T* g = dout + i * C;
#pragma omp simd
      for (int64_t c = c0; c < c1; ++c) d[c] += g[c];
    }
  }
}

#define INSTANTIATE(T)                                                                       \
  template void embedding_forward<T>(T*, const int32_t*, const T*, int64_t, int64_t, int64_t, \
                                     int64_t);                                               \
  template void embedding_backward<T>(T*, const T*, const int32_t*, int64_t, int64_t, int64_t, \
                                      int64_t);                                              \
  template void position_forward<T>(T*, const T*, int64_t, int64_t, int64_t, int64_t);       \
  template void position_backward<T>(T*, const T*, int64_t, int64_t, int64_t, int64_t);
INSTANTIATE(float)
INSTANTIATE(double)
#undef INSTANTIATE

}  // namespace meshtrain::cpu
