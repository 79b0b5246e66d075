// AdamW with decoupled weight decay (Loshchilov & Hutter, arXiv 1711.05101), bias-corrected:
//   g = grad * grad_scale
//   m = b1 m + (1 - b1) g,   v = b2 v + (1 - b2) g^2
//   p -= lr * ( (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + wd * p )
// One multi-tensor update (every parameter of a flat bucket in one parallel region, as apex's
// multi_tensor_apply and torch's foreach AdamW batch their launches; a single tensor is one
// piece); the build compiles without FP contraction (ISO C++, no -ffast-math), so the bits do not
// depend on which loop or vector width runs the formula.

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <type_traits>

#include "kernels.h"
#include "meshtrain/tensor/bf16.h"

namespace meshtrain::cpu {

namespace {

// The step's constants, rounded to the update's precision once per step.
template <class T>
struct AdamWConstants {
  T b1, b2, c1, c2, lr, eps, gs;
  AdamWConstants(double lr_, double beta1, double beta2, double eps_, int64_t step,
                 double grad_scale)
      : b1(static_cast<T>(beta1)),
        b2(static_cast<T>(beta2)),
        c1(static_cast<T>(1.0 / (1.0 - std::pow(beta1, static_cast<double>(step))))),
        c2(static_cast<T>(1.0 / (1.0 - std::pow(beta2, static_cast<double>(step))))),
        lr(static_cast<T>(lr_)),
        eps(static_cast<T>(eps_)),
        gs(static_cast<T>(grad_scale)) {}
};

// Elements [begin, end) of the four buffers; with kRound, the new parameters are also written to
// `rounded` in bf16 while still in registers (mixed precision: the model's copy of the fp32
// masters), rounded as the backend's cast rounds (tensor/bf16.h), so the bits are the cast's.
template <class T, bool kRound>
inline void adamw_range(T* param, const T* grad, T* exp_avg, T* exp_avg_sq, uint16_t* rounded,
                        int64_t begin, int64_t end, const AdamWConstants<T>& k, T wd) {
#pragma omp simd
  for (int64_t i = begin; i < end; ++i) {
    const T g = grad[i] * k.gs;
    const T m = k.b1 * exp_avg[i] + (T(1) - k.b1) * g;
    const T v = k.b2 * exp_avg_sq[i] + (T(1) - k.b2) * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    const T p = param[i] - k.lr * ((m * k.c1) / (std::sqrt(v * k.c2) + k.eps) + wd * param[i]);
    param[i] = p;
    if constexpr (kRound) rounded[i] = float_to_bf16_bits(p);
  }
}

// [begin, end) of this thread's equal share of `total` elements.
inline void thread_share(int64_t total, int64_t& begin, int64_t& end) {
  const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
  begin = total * t / nt;
  end = total * (t + 1) / nt;
}

}  // namespace

// One parallel region for every piece: the pieces laid end to end and cut into one equal share
// per thread, so a bucket of many small tensors (biases, norms) costs one fork and join, not one
// per tensor, and no thread idles behind a large one.
template <class T>
void adamw_update_pieces(T* param, const T* grad, T* exp_avg, T* exp_avg_sq, uint16_t* rounded,
                         const AdamWPiece* pieces, int64_t piece_count, double lr, double beta1,
                         double beta2, double eps, int64_t step, double grad_scale) {
  if (rounded && !std::is_same_v<T, float>)
    throw std::invalid_argument("adamw_update_pieces: bf16 parameters are rounded from fp32 "
                                "masters only (hint: fp64 runs keep no bf16 copy)");
  const AdamWConstants<T> k(lr, beta1, beta2, eps, step, grad_scale);
  int64_t total = 0;
  for (int64_t p = 0; p < piece_count; ++p) total += pieces[p].count;
#pragma omp parallel
  {
    int64_t begin = 0, end = 0;
    thread_share(total, begin, end);
    int64_t first = 0;  // the position of pieces[p]'s first element in the laid-out order
    for (int64_t p = 0; p < piece_count && first < end; ++p) {
      const AdamWPiece& piece = pieces[p];
      const int64_t lo = std::max(begin, first), hi = std::min(end, first + piece.count);
      if (lo < hi) {
        const int64_t shift = piece.offset - first;
        const T wd = static_cast<T>(piece.weight_decay);
        if (!rounded)
          adamw_range<T, false>(param, grad, exp_avg, exp_avg_sq, nullptr, lo + shift,
                                hi + shift, k, wd);
        else if constexpr (std::is_same_v<T, float>)  // fp64 with `rounded` was refused above
          adamw_range<T, true>(param, grad, exp_avg, exp_avg_sq, rounded, lo + shift, hi + shift,
                               k, wd);
      }
      first += piece.count;
    }
  }
}

#define INSTANTIATE(T)                                                                          \
  template void adamw_update_pieces<T>(T*, const T*, T*, T*, uint16_t*, const AdamWPiece*,      \
                                       int64_t, double, double, double, double, int64_t, double);
INSTANTIATE(float)
INSTANTIATE(double)
#undef INSTANTIATE

}  // namespace meshtrain::cpu
