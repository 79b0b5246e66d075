#pragma once
// The row-wise parts of causal attention, shared by the per-head (OpenBLAS) and batched (oneDNN)
// kernels: softmax of row i over keys 0..i, and its backward, in place.

#include <algorithm>
#include <cstdint>

#include "vector_math.h"

namespace meshtrain::cpu {

// Row tiles of the causal GEMMs: row tile r only multiplies against the first (r + 1) * kBlock
// keys, so the GEMMs do about half the work of the full T x T product.
constexpr int64_t kAttentionBlock = 64;

// row (T) holds scores for keys 0..i: softmax over them, zeros above the diagonal.
template <class E> void causal_softmax_row(E* row, int64_t i, int64_t T) {
  E m = row[0];
  for (int64_t j = 1; j <= i; ++j) m = std::max(m, row[j]);
  E s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t j = 0; j <= i; ++j) {
    row[j] = vexp<E>(row[j] - m);
    s += row[j];
  }
  const E inv = E(1) / s;
#pragma omp simd
  for (int64_t j = 0; j <= i; ++j) row[j] *= inv;
  std::fill(row + i + 1, row + T, E(0));
}

// d (T) holds dP for keys 0..i, p the softmax: d = p * (d - <p, d>) * scale, in place; entries
// above the diagonal are zeroed up to zero_end (the GEMMs that follow read them): the end of the
// row's tile for tiled GEMMs, T for full ones.
template <class E>
void causal_softmax_backward_row(E* d, const E* p, int64_t i, int64_t zero_end, E scale) {
  E dot = 0;
#pragma omp simd reduction(+ : dot)
  for (int64_t j = 0; j <= i; ++j) dot += p[j] * d[j];
#pragma omp simd
  for (int64_t j = 0; j <= i; ++j) d[j] = p[j] * (d[j] - dot) * scale;
  std::fill(d + i + 1, d + zero_end, E(0));
}

}  // namespace meshtrain::cpu
