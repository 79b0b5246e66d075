#pragma once
// The row-wise parts of causal attention, shared by the per-head (OpenBLAS) and batched (oneDNN)
// kernels: softmax of row i over keys 0..i (from its document's start under document
// masking), and its backward.

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "element.h"
#include "vector_math.h"

namespace meshtrain::cpu {

// Row tiles of the causal GEMMs: row tile r only multiplies against the first (r + 1) * kBlock
// keys, so the GEMMs do about half the work of the full T x T product.
constexpr int64_t kAttentionBlock = 64;

// Document masking (backend.h, attention_forward): the first key query row i of sequence b
// sees, its document's start; 0 without the mask (starts null).
inline int64_t first_key(const int32_t* starts, int64_t b, int64_t T, int64_t i) {
  return starts ? starts[b * T + i] : 0;
}

// s (T) holds the scores of row i for keys lo..i (lo its document's start, 0 when causal):
// p = their softmax, zeros elsewhere, computed in E (s is left holding the exponentials). In
// place when P is E and p is s; bf16 probabilities (P = bf16) come from fp32 scores and are
// rounded once. With lo = 0 the sums run as they did before document masking (same bits).
template <class P, class E>
void causal_softmax_row(P* p, E* s, int64_t lo, int64_t i, int64_t T) {
  E m = s[lo];
#pragma omp simd reduction(max : m)
  for (int64_t j = lo + 1; j <= i; ++j) m = std::max(m, s[j]);
  E sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = lo; j <= i; ++j) {
    s[j] = vexp<E>(s[j] - m);
    sum += s[j];
  }
  const E inv = E(1) / sum;
#pragma omp simd
  for (int64_t j = lo; j <= i; ++j) p[j] = narrow<P>(s[j] * inv);
  if (lo > 0) std::memset(p, 0, static_cast<size_t>(lo) * sizeof(P));
  std::memset(p + i + 1, 0, static_cast<size_t>(T - i - 1) * sizeof(P));  // +0 in every type
}

// dp (T) holds dP of row i for keys lo..i, p the softmax: ds = p * (dp - <p, dp>) * scale, in
// E; entries before lo are zeroed, and above the diagonal up to zero_end (the GEMMs that follow
// read them): the end of the row's tile for tiled GEMMs, T for full ones. In place when D is E
// and ds is dp; under bf16 (P = D = bf16) dp is fp32 and ds is rounded once.
template <class D, class P, class E>
void causal_softmax_backward_row(D* ds, const P* p, const E* dp, int64_t lo, int64_t i,
                                 int64_t zero_end, E scale) {
  E dot = 0;
#pragma omp simd reduction(+ : dot)
  for (int64_t j = lo; j <= i; ++j) dot += widen(p[j]) * dp[j];
#pragma omp simd
  for (int64_t j = lo; j <= i; ++j) ds[j] = narrow<D>(widen(p[j]) * (dp[j] - dot) * scale);
  if (lo > 0) std::memset(ds, 0, static_cast<size_t>(lo) * sizeof(D));
  if (zero_end > i + 1) std::memset(ds + i + 1, 0, static_cast<size_t>(zero_end - i - 1) * sizeof(D));
}

}  // namespace meshtrain::cpu
