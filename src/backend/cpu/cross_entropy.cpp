// Softmax cross-entropy over a (possibly vocabulary-parallel) slice of the logits. The full
// logits are never gathered: a rank holding vocabulary [v0, v0 + V) computes its row max and
// sum of exponentials; the caller all-reduces max (MAX) and re-based sums (SUM) over the tensor
// group, then
//   loss_i    = log(sumexp_i) + max_i - logit_i[target_i]
//   dlogit_ij = (exp(logit_ij - max_i) / sumexp_i - [j == target_i]) * dloss
// as in Megatron's vocab-parallel cross-entropy (Shoeybi et al., arXiv 1909.08053).

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "kernels.h"
#include "vector_math.h"

namespace meshtrain::cpu {

// Statistics in Acc<A> (fp32 for bf16 logits): the row max is exact, the sum of exponentials
// is the value the loss needs in full precision.
template <class A>
void crossentropy_stats(Acc<A>* row_max, Acc<A>* row_sumexp, const A* logits, int64_t N,
                        int64_t V) {
  using T = Acc<A>;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const A* l = logits + i * V;
    T m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < V; ++j) m = vmax(m, widen(l[j]));
    T s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < V; ++j) s += vexp<T>(widen(l[j]) - m);
    row_max[i] = m;
    row_sumexp[i] = s;
  }
}

template <class S>
void crossentropy_rebase(S* row_sumexp, const S* local_max, const S* global_max, int64_t N) {
  for (int64_t i = 0; i < N; ++i) row_sumexp[i] *= std::exp(local_max[i] - global_max[i]);
}

template <class A>
void crossentropy_target_logit(Acc<A>* target_logit, const A* logits, const int32_t* targets,
                               int64_t vocab_begin, int64_t N, int64_t V) {
  for (int64_t i = 0; i < N; ++i) {
    const int64_t j = static_cast<int64_t>(targets[i]) - vocab_begin;
    target_logit[i] = (j >= 0 && j < V) ? widen(logits[i * V + j]) : Acc<A>(0);
  }
}

template <class S>
void crossentropy_losses(S* losses, const S* row_max, const S* row_sumexp, const S* target_logit,
                         int64_t N) {
  for (int64_t i = 0; i < N; ++i)
    losses[i] = std::log(row_sumexp[i]) + row_max[i] - target_logit[i];
}

// The gradient is computed in Acc<A> and rounded once (the target's -dloss included).
template <class A>
void crossentropy_backward(A* dlogits, const A* logits, const Acc<A>* row_max,
                           const Acc<A>* row_sumexp, const int32_t* targets, int64_t vocab_begin,
                           Acc<A> dloss, int64_t N, int64_t V) {
  using T = Acc<A>;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const A* l = logits + i * V;
    A* d = dlogits + i * V;
    const T m = row_max[i], scale = dloss / row_sumexp[i];
    const int64_t t = static_cast<int64_t>(targets[i]) - vocab_begin;
    const T target = (t >= 0 && t < V) ? vexp<T>(widen(l[t]) - m) * scale - dloss : T(0);
#pragma omp simd
    for (int64_t j = 0; j < V; ++j) d[j] = narrow<A>(vexp<T>(widen(l[j]) - m) * scale);
    if (t >= 0 && t < V) d[t] = narrow<A>(target);
  }
}

// The whole vocabulary on this rank (no tensor parallelism, vocab_begin 0), as the CUDA path's
// fused kernel does it: per row, its max (the one read of the row from memory), the exponentials
// into this thread's scratch row with their sum (a second read, from cache: a row of GPT-2's
// 50257 fp32 logits is 200 KB), then loss and gradient from the scratch row. The unfused calls
// read each row from memory twice and compute every exponential twice. The formulas, and the
// order of each row's sums, are those of stats, target_logit, losses and backward.
template <class A>
void crossentropy_loss_and_backward(A* dlogits, Acc<A>* losses, const A* logits,
                                    const int32_t* targets, Acc<A> dloss, int64_t N, int64_t V,
                                    Acc<A>* scratch) {
  using T = Acc<A>;
#pragma omp parallel
  {
    T* e = scratch + static_cast<int64_t>(omp_get_thread_num()) * V;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < N; ++i) {
      const A* l = logits + i * V;
      A* d = dlogits + i * V;  // may be l: each row's logits are read before it is written
      T m = -INFINITY;
#pragma omp simd reduction(max : m)
      for (int64_t j = 0; j < V; ++j) m = vmax(m, widen(l[j]));
      T s = 0;
#pragma omp simd reduction(+ : s)
      for (int64_t j = 0; j < V; ++j) {
        const T x = vexp<T>(widen(l[j]) - m);
        e[j] = x;
        s += x;
      }
      const int64_t t = targets[i];
      const bool here = t >= 0 && t < V;
      losses[i] = std::log(s) + m - (here ? widen(l[t]) : T(0));
      const T scale = dloss / s;
#pragma omp simd
      for (int64_t j = 0; j < V; ++j) d[j] = narrow<A>(e[j] * scale);
      if (here) d[t] = narrow<A>(e[t] * scale - dloss);
    }
  }
}

#define INSTANTIATE(A)                                                                        \
  template void crossentropy_stats<A>(Acc<A>*, Acc<A>*, const A*, int64_t, int64_t);          \
  template void crossentropy_target_logit<A>(Acc<A>*, const A*, const int32_t*, int64_t,      \
                                             int64_t, int64_t);                               \
  template void crossentropy_backward<A>(A*, const A*, const Acc<A>*, const Acc<A>*,          \
                                         const int32_t*, int64_t, Acc<A>, int64_t, int64_t); \
  template void crossentropy_loss_and_backward<A>(A*, Acc<A>*, const A*, const int32_t*,      \
                                                  Acc<A>, int64_t, int64_t, Acc<A>*);
INSTANTIATE(float)
INSTANTIATE(double)
INSTANTIATE(bf16)
#undef INSTANTIATE
template void crossentropy_rebase<float>(float*, const float*, const float*, int64_t);
template void crossentropy_rebase<double>(double*, const double*, const double*, int64_t);
template void crossentropy_losses<float>(float*, const float*, const float*, const float*, int64_t);
template void crossentropy_losses<double>(double*, const double*, const double*, const double*,
                                          int64_t);

}  // namespace meshtrain::cpu
