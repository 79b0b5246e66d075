// Linear layers through Gemm (gemm.h: oneDNN or OpenBLAS by shape). Weights are (OC, C) as in
// PyTorch, activations row-major (N, C):
//   forward   out (N, OC)   = inp (N, C) @ W^T + b     GEMM N,T   (bias fused)
//   backward  dinp (N, C)   = dout (N, OC) @ W         GEMM N,N
//             dW (OC, C)   += dout^T @ inp             GEMM T,N   (Accumulate::Add)
//             db (OC)      += column sums of dout

#include <algorithm>

#include "kernels.h"
#include "meshtrain/backend/cpu/gemm.h"

namespace meshtrain::cpu {

namespace {
constexpr int64_t kColumnBlock = 128;
}  // namespace

template <class T>
void matmul_forward(Gemm& gemm, T* out, const T* inp, const T* weight, const T* bias, int64_t N,
                    int64_t C, int64_t OC) {
  gemm.run(GemmShape::dense(Trans::No, Trans::Yes, N, OC, C), inp, weight, bias, out);
}

template <class T>
void matmul_backward(Gemm& gemm, T* dinp, T* dweight, T* dbias, const T* dout, const T* inp,
                     const T* weight, int64_t N, int64_t C, int64_t OC) {
  if (dinp) gemm.run(GemmShape::dense(Trans::No, Trans::No, N, C, OC), dout, weight, nullptr, dinp);
  gemm.run(GemmShape::dense(Trans::Yes, Trans::No, OC, C, N), dout, inp, nullptr, dweight,
           {Accumulate::Add, Epilogue::None});
  if (dbias) bias_backward(dbias, dout, N, OC);
}

template <class T> void bias_forward(T* out, const T* bias, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    T* o = out + i * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) o[c] += bias[c];
  }
}

// Column sums in blocks of kColumnBlock columns, rows in order: no races, fixed summation order.
template <class T> void bias_backward(T* dbias, const T* dout, int64_t N, int64_t C) {
  const int64_t blocks = (C + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t c0 = blk * kColumnBlock, c1 = std::min(C, c0 + kColumnBlock);
    T acc[kColumnBlock] = {};
    for (int64_t i = 0; i < N; ++i) {
      const T* g = dout + i * C;
#pragma omp simd
      for (int64_t c = c0; c < c1; ++c) acc[c - c0] += g[c];
    }
    for (int64_t c = c0; c < c1; ++c) dbias[c] += acc[c - c0];
  }
}

#define INSTANTIATE(T)                                                                          \
  template void bias_forward<T>(T*, const T*, int64_t, int64_t);                                \
  template void bias_backward<T>(T*, const T*, int64_t, int64_t);                               \
  template void matmul_forward<T>(Gemm&, T*, const T*, const T*, const T*, int64_t, int64_t,     \
                                  int64_t);                                                     \
  template void matmul_backward<T>(Gemm&, T*, T*, T*, const T*, const T*, const T*, int64_t,     \
                                   int64_t, int64_t);
INSTANTIATE(float)
INSTANTIATE(double)
#undef INSTANTIATE

}  // namespace meshtrain::cpu
