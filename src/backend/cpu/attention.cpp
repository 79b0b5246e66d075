// Causal multi-head self-attention on strided views of qkv (B, T, 3, NH, HS) — no transposed
// copies of Q, K or V:
//
//   S = scale Q K^T (masked j > i),  P = softmax_rows(S),  O = P V,       scale = 1/sqrt(HS)
//   dP = dO V^T,  dV = P^T dO,  dS = P * (dP - rowsum(P * dP)) * scale,  dQ = dS K,  dK = dS^T Q
//
// fp32 runs each product for all (batch, head) pairs as one batched oneDNN matmul
// (attention_batched.cpp); fp64, and fp32 when OpenBLAS is forced, run here: one (batch, head)
// pair per OpenMP task, its GEMMs single-threaded OpenBLAS calls in causal row tiles.

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "attention_rows.h"
#include "blas.h"
#include "kernels.h"
#include "meshtrain/backend/cpu/gemm.h"

namespace meshtrain::cpu {

namespace {
constexpr int64_t kBlock = kAttentionBlock;

struct HeadView {
  int64_t ld_qkv;  // row stride of Q, K, V inside qkv: 3 * NH * HS
  int64_t ld_out;  // row stride of O: NH * HS
};
template <class T>
void per_head_forward(T* out, T* probs, const T* qkv, int64_t B, int64_t T_, int64_t NH,
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
    for (int64_t i = 0; i < T_; ++i) causal_softmax_row(P + i * T_, i, T_);
    for (int64_t r0 = 0; r0 < T_; r0 += kBlock) {
      const int64_t rows = std::min(kBlock, T_ - r0), keys = r0 + rows;
      gemm(CblasNoTrans, CblasNoTrans, rows, HS, keys, T(1), P + r0 * T_, T_, val, v.ld_qkv, T(0),
           o + r0 * v.ld_out, v.ld_out);
    }
  }
}

template <class T>
void per_head_backward(T* dqkv, const T* dout, const T* qkv, const T* probs, int64_t B,
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
      const int64_t block_end = std::min(T_, (i / kBlock + 1) * kBlock);
      causal_softmax_backward_row(dS + i * T_, P + i * T_, i, block_end, scale);
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

}  // namespace

bool attention_batched(const Gemm& gemm, bool fp32) {
  return fp32 && gemm.library() != GemmLibrary::OpenBlas;
}

int64_t attention_backward_scratch(const Gemm& gemm, bool fp32, int64_t B, int64_t T_,
                                   int64_t NH, int threads) {
  return attention_batched(gemm, fp32) ? B * NH * T_ * T_ : int64_t{threads} * T_ * T_;
}

template <class T>
void attention_forward(Gemm& gemm, T* out, T* probs, const T* qkv, int64_t B, int64_t T_,
                       int64_t NH, int64_t HS) {
  if constexpr (std::is_same_v<T, float>)
    if (attention_batched(gemm, true))
      return attention_forward_batched(gemm, out, probs, qkv, B, T_, NH, HS);
  per_head_forward(out, probs, qkv, B, T_, NH, HS);
}

template <class T>
void attention_backward(Gemm& gemm, T* dqkv, const T* dout, const T* qkv, const T* probs,
                        int64_t B, int64_t T_, int64_t NH, int64_t HS, T* scratch) {
  if constexpr (std::is_same_v<T, float>)
    if (attention_batched(gemm, true))
      return attention_backward_batched(gemm, dqkv, dout, qkv, probs, B, T_, NH, HS, scratch);
  per_head_backward(dqkv, dout, qkv, probs, B, T_, NH, HS, scratch);
}

#define INSTANTIATE(T)                                                                          \
  template void attention_forward<T>(Gemm&, T*, T*, const T*, int64_t, int64_t, int64_t,        \
                                     int64_t);                                                  \
  template void attention_backward<T>(Gemm&, T*, const T*, const T*, const T*, int64_t, int64_t, \
                                      int64_t, int64_t, T*);
INSTANTIATE(float)
INSTANTIATE(double)
#undef INSTANTIATE

}  // namespace meshtrain::cpu
