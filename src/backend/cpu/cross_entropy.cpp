// Softmax cross-entropy over a (possibly vocabulary-parallel) slice of the logits. The full
// logits are never gathered: a rank holding vocabulary [v0, v0 + V) computes its row max and
// sum of exponentials; the caller all-reduces max (MAX) and re-based sums (SUM) over the tensor
// group, then
//   loss_i    = log(sumexp_i) + max_i - logit_i[target_i]
//   dlogit_ij = (exp(logit_ij - max_i) / sumexp_i - [j == target_i]) * dloss
// as in Megatron's vocab-parallel cross-entropy (Shoeybi et al., arXiv 1909.08053).

#include <algorithm>
#include <cmath>

#include "kernels.h"
#include "vector_math.h"

namespace meshtrain::cpu {

template <class T> void crossentropy_stats(T* row_max, T* row_sumexp, const T* logits, int64_t N, int64_t V) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const T* l = logits + i * V;
    T m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < V; ++j) m = std::max(m, l[j]);
    T s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < V; ++j) s += vexp<T>(l[j] - m);
    row_max[i] = m;
    row_sumexp[i] = s;
  }
}

template <class T> void crossentropy_rebase(T* row_sumexp, const T* local_max, const T* global_max, int64_t N) {
  for (int64_t i = 0; i < N; ++i) row_sumexp[i] *= std::exp(local_max[i] - global_max[i]);
}

template <class T>
void crossentropy_target_logit(T* target_logit, const T* logits, const int32_t* targets,
                               int64_t vocab_begin, int64_t N, int64_t V) {
  for (int64_t i = 0; i < N; ++i) {
    const int64_t j = static_cast<int64_t>(targets[i]) - vocab_begin;
    target_logit[i] = (j >= 0 && j < V) ? logits[i * V + j] : T(0);
  }
}

template <class T>
void crossentropy_losses(T* losses, const T* row_max, const T* row_sumexp, const T* target_logit,
                         int64_t N) {
  for (int64_t i = 0; i < N; ++i)
    losses[i] = std::log(row_sumexp[i]) + row_max[i] - target_logit[i];
}

template <class T>
void crossentropy_backward(T* dlogits, const T* logits, const T* row_max, const T* row_sumexp,
                           const int32_t* targets, int64_t vocab_begin, T dloss, int64_t N,
                           int64_t V) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const T* l = logits + i * V;
    T* d = dlogits + i * V;
    const T m = row_max[i], scale = dloss / row_sumexp[i];
#pragma omp simd
    for (int64_t j = 0; j < V; ++j) d[j] = vexp<T>(l[j] - m) * scale;
    const int64_t t = static_cast<int64_t>(targets[i]) - vocab_begin;
    if (t >= 0 && t < V) d[t] -= dloss;
  }
}

#define INSTANTIATE(T)                                                                          \
  template void crossentropy_stats<T>(T*, T*, const T*, int64_t, int64_t);                      \
  template void crossentropy_rebase<T>(T*, const T*, const T*, int64_t);                        \
  template void crossentropy_target_logit<T>(T*, const T*, const int32_t*, int64_t, int64_t,    \
                                             int64_t);                                          \
  template void crossentropy_losses<T>(T*, const T*, const T*, const T*, int64_t);              \
  template void crossentropy_backward<T>(T*, const T*, const T*, const T*, const int32_t*,      \
                                         int64_t, T, int64_t, int64_t);
INSTANTIATE(float)
INSTANTIATE(double)
#undef INSTANTIATE

}  // namespace meshtrain::cpu
