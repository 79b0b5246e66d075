// Elementwise kernels and deterministic reductions.

#include <omp.h>

#include <algorithm>
#include <vector>

#include "kernels.h"
#include "meshtrain/tensor/bf16.h"

namespace meshtrain::cpu {

namespace {
// Below this many elements a parallel region costs more than it saves.
constexpr int64_t kParallelThreshold = 1 << 15;
// Reductions sum fixed-size chunks, then the chunk sums in order: the result does not depend
// on the number of threads.
constexpr int64_t kReduceChunk = 1 << 14;

template <class T, class F>
double chunked_reduce(const T* x, int64_t n, F term) {
  const int64_t chunks = (n + kReduceChunk - 1) / kReduceChunk;
  std::vector<double> partial(static_cast<size_t>(chunks));
#pragma omp parallel for schedule(static) if (n > kParallelThreshold)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = c * kReduceChunk, end = std::min(n, begin + kReduceChunk);
    double acc = 0.0;
#pragma omp simd reduction(+ : acc)
    for (int64_t i = begin; i < end; ++i) acc += term(static_cast<double>(widen(x[i])));
    partial[static_cast<size_t>(c)] = acc;
  }
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}
}  // namespace

int kernel_threads() { return omp_get_max_threads(); }

template <class T> void fill(T* out, T value, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > kParallelThreshold)
  for (int64_t i = 0; i < n; ++i) out[i] = value;
}

// Mixed dtypes add in the destination's arithmetic: a bf16 source widens exactly into an fp32
// accumulator; bf16 + bf16 adds in fp32 and rounds once.
template <class D, class S> void add_inplace(D* dst, const S* src, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > kParallelThreshold)
  for (int64_t i = 0; i < n; ++i) dst[i] = narrow<D>(widen(dst[i]) + widen(src[i]));
}

template <class T> void scale_inplace(T* t, Acc<T> factor, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > kParallelThreshold)
  for (int64_t i = 0; i < n; ++i) t[i] = narrow<T>(widen(t[i]) * factor);
}

template <class T> void residual_forward(T* out, const T* a, const T* b, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > kParallelThreshold)
  for (int64_t i = 0; i < n; ++i) out[i] = narrow<T>(widen(a[i]) + widen(b[i]));
}

template <class T> double sum_squares(const T* x, int64_t n) {
  return chunked_reduce(x, n, [](double v) { return v * v; });
}

template <class T> double sum(const T* x, int64_t n) {
  return chunked_reduce(x, n, [](double v) { return v; });
}

void convert(double* out, const float* in, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > kParallelThreshold)
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<double>(in[i]);
}

void convert(float* out, const double* in, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > kParallelThreshold)
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(in[i]);  // round to nearest even
}

void float_to_bf16(uint16_t* out, const float* in, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > kParallelThreshold)
  for (int64_t i = 0; i < n; ++i) out[i] = float_to_bf16_bits(in[i]);
}

void bf16_to_float(float* out, const uint16_t* in, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > kParallelThreshold)
  for (int64_t i = 0; i < n; ++i) out[i] = bf16_bits_to_float(in[i]);
}

#define INSTANTIATE(T)                                                    \
  template void fill<T>(T*, T, int64_t);                                  \
  template void add_inplace<T, T>(T*, const T*, int64_t);                 \
  template void scale_inplace<T>(T*, Acc<T>, int64_t);                    \
  template void residual_forward<T>(T*, const T*, const T*, int64_t);     \
  template double sum_squares<T>(const T*, int64_t);                      \
  template double sum<T>(const T*, int64_t);
INSTANTIATE(float)
INSTANTIATE(double)
INSTANTIATE(bf16)
#undef INSTANTIATE
template void add_inplace<float, bf16>(float*, const bf16*, int64_t);

}  // namespace meshtrain::cpu
