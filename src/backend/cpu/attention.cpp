// Causal multi-head self-attention, one (batch, head) pair per task, GEMMs through OpenBLAS on
// strided views of qkv (B, T, 3, NH, HS) — no transposed copies of Q, K or V.
//
//   S = scale Q K^T (masked j > i),  P = softmax_rows(S),  O = P V,       scale = 1/sqrt(HS)
//   dP = dO V^T,  dV = P^T dO,  dS = P * (dP - rowsum(P * dP)) * scale,  dQ = dS K,  dK = dS^T Q
//
// Causality is exploited in row blocks of kBlock: row block r only multiplies against the
// first (r + 1) * kBlock keys, so the GEMMs do about half the work of the full T x T product.

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "blas.h"
#include "kernels.h"
#include "vector_math.h"

namespace meshtrain::cpu {

namespace {
constexpr int64_t kBlock = 64;

struct HeadView {
  int64_t ld_qkv;  // row stride of Q, K, V inside qkv: 3 * NH * HS
  int64_t ld_out;  // row stride of O: NH * HS
};
}  // namespace

template <class T>
void attention_forward(T* out, T* probs, const T* qkv, int64_t B, int64_t T_, int64_t NH,
                       int64_t HS) {
  const int64_t C = NH * HS;
  const HeadView v{3 * C, C};
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(HS)));
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t bh = 0; bh < B * NH; ++bh) {
    const int64_t b = bh / NH, h = bh % NH;
    const T* q = qkv + b * T_ * v.ld_qkv + h * HS;
    const T* k = q + C;
    const T* val = q + 2 * C;
    T* P = probs + bh * T_ * T_;
    T* o = out + b * T_ * v.ld_out + h * HS;
    for (int64_t r0 = 0; r0 < T_; r0 += kBlock) {
      const int64_t rows = std::min(kBlock, T_ - r0), keys = r0 + rows;
      gemm(CblasNoTrans, CblasTrans, rows, keys, HS, scale, q + r0 * v.ld_qkv, v.ld_qkv, k,
           v.ld_qkv, T(0), P + r0 * T_, T_);
    }
    for (int64_t i = 0; i < T_; ++i) {
      T* row = P + i * T_;
      T m = row[0];
      for (int64_t j = 1; j <= i; ++j) m = std::max(m, row[j]);
      T s = 0;
#pragma omp simd reduction(+ : s)
      for (int64_t j = 0; j <= i; ++j) {
        row[j] = vexp<T>(row[j] - m);
        s += row[j];
      }
      const T inv = T(1) / s;
#pragma omp simd
      for (int64_t j = 0; j <= i; ++j) row[j] *= inv;
      std::fill(row + i + 1, row + T_, T(0));
    }
    for (int64_t r0 = 0; r0 < T_; r0 += kBlock) {
      const int64_t rows = std::min(kBlock, T_ - r0), keys = r0 + rows;
      gemm(CblasNoTrans, CblasNoTrans, rows, HS, keys, T(1), P + r0 * T_, T_, val, v.ld_qkv, T(0),
           o + r0 * v.ld_out, v.ld_out);
    }
  }
}

template <class T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* probs, int64_t B,
                        int64_t T_, int64_t NH, int64_t HS, T* scratch) {
  const int64_t C = NH * HS;
  const HeadView v{3 * C, C};
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(HS)));
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t bh = 0; bh < B * NH; ++bh) {
    const int64_t b = bh / NH, h = bh % NH;
    const T* q = qkv + b * T_ * v.ld_qkv + h * HS;
    const T* k = q + C;
    const T* val = q + 2 * C;
    T* dq = dqkv + b * T_ * v.ld_qkv + h * HS;
    T* dk = dq + C;
    T* dv = dq + 2 * C;
    const T* P = probs + bh * T_ * T_;
    const T* dO = dout + b * T_ * v.ld_out + h * HS;
    T* dS = scratch + static_cast<int64_t>(omp_get_thread_num()) * T_ * T_;

    for (int64_t r0 = 0; r0 < T_; r0 += kBlock) {  // dP = dO V^T (lower blocks only)
      const int64_t rows = std::min(kBlock, T_ - r0), keys = r0 + rows;
      gemm(CblasNoTrans, CblasTrans, rows, keys, HS, T(1), dO + r0 * v.ld_out, v.ld_out, val,
           v.ld_qkv, T(0), dS + r0 * T_, T_);
    }
    for (int64_t c0 = 0; c0 < T_; c0 += kBlock) {  // dV[c] = P[c:, c]^T dO[c:]
      const int64_t cols = std::min(kBlock, T_ - c0), rows = T_ - c0;
      gemm(CblasTrans, CblasNoTrans, cols, HS, rows, T(1), P + c0 * T_ + c0, T_,
           dO + c0 * v.ld_out, v.ld_out, T(0), dv + c0 * v.ld_qkv, v.ld_qkv);
    }
    for (int64_t i = 0; i < T_; ++i) {  // softmax backward, in place over dP
      const T* p = P + i * T_;
      T* d = dS + i * T_;
      T dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int64_t j = 0; j <= i; ++j) dot += p[j] * d[j];
#pragma omp simd
      for (int64_t j = 0; j <= i; ++j) d[j] = p[j] * (d[j] - dot) * scale;
      // Entries above the diagonal inside the row's block feed the block GEMMs below.
      const int64_t block_end = std::min(T_, (i / kBlock + 1) * kBlock);
      std::fill(d + i + 1, d + block_end, T(0));
    }
    for (int64_t r0 = 0; r0 < T_; r0 += kBlock) {  // dQ[r] = dS[r, :keys] K[:keys]
      const int64_t rows = std::min(kBlock, T_ - r0), keys = r0 + rows;
      gemm(CblasNoTrans, CblasNoTrans, rows, HS, keys, T(1), dS + r0 * T_, T_, k, v.ld_qkv, T(0),
           dq + r0 * v.ld_qkv, v.ld_qkv);
    }
    for (int64_t c0 = 0; c0 < T_; c0 += kBlock) {  // dK[c] = dS[c:, c]^T Q[c:]
      const int64_t cols = std::min(kBlock, T_ - c0), rows = T_ - c0;
      gemm(CblasTrans, CblasNoTrans, cols, HS, rows, T(1), dS + c0 * T_ + c0, T_,
           q + c0 * v.ld_qkv, v.ld_qkv, T(0), dk + c0 * v.ld_qkv, v.ld_qkv);
    }
  }
}

template void attention_forward<float>(float*, float*, const float*, int64_t, int64_t, int64_t,
                                       int64_t);
template void attention_forward<double>(double*, double*, const double*, int64_t, int64_t,
                                        int64_t, int64_t);
template void attention_backward<float>(float*, const float*, const float*, const float*, int64_t,
                                        int64_t, int64_t, int64_t, float*);
template void attention_backward<double>(double*, const double*, const double*, const double*,
                                         int64_t, int64_t, int64_t, int64_t, double*);

}  // namespace meshtrain::cpu
