// Causal multi-head self-attention on strided views of qkv rows of (NH + 2 KVH) heads (query
// head h reads key/value head h / (NH / KVH)) — no transposed or repeated copies of Q, K or V:
//
//   S = scale Q K^T (masked j > i),  P = softmax_rows(S),  O = P V,       scale = 1/sqrt(HS)
//   dP = dO V^T,  dV = P^T dO,  dS = P * (dP - rowsum(P * dP)) * scale,  dQ = dS K,  dK = dS^T Q
//
// fp32 and bf16 run each product for all (batch, head) pairs as one batched oneDNN matmul
// (attention_batched.cpp); fp64, and fp32 when OpenBLAS is forced, run here: one (batch, head)
// pair per OpenMP task forward, one (batch, key/value head) group backward, its GEMMs
// single-threaded OpenBLAS calls in causal row tiles.

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "attention_rows.h"
#include "blas.h"
#include "kernels.h"
#include "meshtrain/backend/cpu/gemm.h"

namespace meshtrain::cpu {

namespace {
constexpr int64_t kBlock = kAttentionBlock;

// Row strides of one call: Q, K and V heads inside a qkv row of (NH + 2 KVH) * HS, and O's.
struct HeadView {
  int64_t ld_qkv;  // row stride of Q, K, V inside qkv
  int64_t ld_out;  // row stride of O: NH * HS
  int64_t k_col;   // column of key head 0: NH * HS (value head 0 is KVH * HS further)
  int64_t kv_cols;  // KVH * HS
};
HeadView head_view(int64_t NH, int64_t KVH, int64_t HS) {
  return {(NH + 2 * KVH) * HS, NH * HS, NH * HS, KVH * HS};
}

template <class T>
void per_head_forward(T* out, T* probs, const T* qkv, int64_t B, int64_t T_, int64_t NH,
                      int64_t KVH, int64_t HS, const int32_t* starts) {
  const HeadView v = head_view(NH, KVH, HS);
  const int64_t group = NH / KVH;
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(HS)));
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t bh = 0; bh < B * NH; ++bh) {
    const int64_t b = bh / NH, h = bh % NH;
    const T* row0 = qkv + b * T_ * v.ld_qkv;
    const T* q = row0 + h * HS;
    const T* k = row0 + v.k_col + (h / group) * HS;  // the group's key/value head
    const T* val = k + v.kv_cols;
    T* P = probs + bh * T_ * T_;
    T* o = out + b * T_ * v.ld_out + h * HS;
    for (int64_t r0 = 0; r0 < T_; r0 += kBlock) {
      const int64_t rows = std::min(kBlock, T_ - r0), keys = r0 + rows;
      gemm(CblasNoTrans, CblasTrans, rows, keys, HS, scale, q + r0 * v.ld_qkv, v.ld_qkv, k,
           v.ld_qkv, T(0), P + r0 * T_, T_);
    }
    for (int64_t i = 0; i < T_; ++i)
      causal_softmax_row(P + i * T_, P + i * T_, first_key(starts, b, T_, i), i, T_);
    for (int64_t r0 = 0; r0 < T_; r0 += kBlock) {
      const int64_t rows = std::min(kBlock, T_ - r0), keys = r0 + rows;
      gemm(CblasNoTrans, CblasNoTrans, rows, HS, keys, T(1), P + r0 * T_, T_, val, v.ld_qkv, T(0),
           o + r0 * v.ld_out, v.ld_out);
    }
  }
}

// One (batch, key/value head) group per task: its query heads in order, the first assigning dK
// and dV and the others adding to them, so that the sums are the same whatever the threads.
template <class T>
void per_head_backward(T* dqkv, const T* dout, const T* qkv, const T* probs, int64_t B,
                       int64_t T_, int64_t NH, int64_t KVH, int64_t HS, T* scratch,
                       const int32_t* starts) {
  const HeadView v = head_view(NH, KVH, HS);
  const int64_t group = NH / KVH;
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(HS)));
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t bg = 0; bg < B * KVH; ++bg) {
    const int64_t b = bg / KVH, g = bg % KVH;
    const T* k = qkv + b * T_ * v.ld_qkv + v.k_col + g * HS;
    const T* val = k + v.kv_cols;
    T* dk = dqkv + b * T_ * v.ld_qkv + v.k_col + g * HS;
    T* dv = dk + v.kv_cols;
    T* dS = scratch + static_cast<int64_t>(omp_get_thread_num()) * T_ * T_;
    for (int64_t h = g * group; h < (g + 1) * group; ++h) {
      const T kv_beta = h == g * group ? T(0) : T(1);
      const T* q = qkv + b * T_ * v.ld_qkv + h * HS;
      T* dq = dqkv + b * T_ * v.ld_qkv + h * HS;
      const T* P = probs + (b * NH + h) * T_ * T_;
      const T* dO = dout + b * T_ * v.ld_out + h * HS;

      for (int64_t r0 = 0; r0 < T_; r0 += kBlock) {  // dP = dO V^T (lower blocks only)
        const int64_t rows = std::min(kBlock, T_ - r0), keys = r0 + rows;
        gemm(CblasNoTrans, CblasTrans, rows, keys, HS, T(1), dO + r0 * v.ld_out, v.ld_out, val,
             v.ld_qkv, T(0), dS + r0 * T_, T_);
      }
      for (int64_t c0 = 0; c0 < T_; c0 += kBlock) {  // dV[c] (+)= P[c:, c]^T dO[c:]
        const int64_t cols = std::min(kBlock, T_ - c0), rows = T_ - c0;
        gemm(CblasTrans, CblasNoTrans, cols, HS, rows, T(1), P + c0 * T_ + c0, T_,
             dO + c0 * v.ld_out, v.ld_out, kv_beta, dv + c0 * v.ld_qkv, v.ld_qkv);
      }
      for (int64_t i = 0; i < T_; ++i) {  // softmax backward, in place over dP
        const int64_t block_end = std::min(T_, (i / kBlock + 1) * kBlock);
        causal_softmax_backward_row(dS + i * T_, P + i * T_, dS + i * T_,
                                    first_key(starts, b, T_, i), i, block_end, scale);
      }
      for (int64_t r0 = 0; r0 < T_; r0 += kBlock) {  // dQ[r] = dS[r, :keys] K[:keys]
        const int64_t rows = std::min(kBlock, T_ - r0), keys = r0 + rows;
        gemm(CblasNoTrans, CblasNoTrans, rows, HS, keys, T(1), dS + r0 * T_, T_, k, v.ld_qkv,
             T(0), dq + r0 * v.ld_qkv, v.ld_qkv);
      }
      for (int64_t c0 = 0; c0 < T_; c0 += kBlock) {  // dK[c] (+)= dS[c:, c]^T Q[c:]
        const int64_t cols = std::min(kBlock, T_ - c0), rows = T_ - c0;
        gemm(CblasTrans, CblasNoTrans, cols, HS, rows, T(1), dS + c0 * T_ + c0, T_,
             q + c0 * v.ld_qkv, v.ld_qkv, kv_beta, dk + c0 * v.ld_qkv, v.ld_qkv);
      }
    }
  }
}

}  // namespace

void check_document_starts(const char* op, const int32_t* starts, int64_t B, int64_t T_) {
  if (starts == nullptr) return;
  for (int64_t r = 0; r < B * T_; ++r)
    if (starts[r] < 0 || starts[r] > r % T_)
      throw std::invalid_argument(
          std::string("backend 'cpu': ") + op + ": document_starts[" + std::to_string(r) +
          "] = " + std::to_string(starts[r]) + " lies outside [0, " + std::to_string(r % T_) +
          "] (a token's document starts at or before it)");
}

AttentionPath attention_path(const Gemm& gemm, bool fp64) {
  return fp64 || gemm.library() == GemmLibrary::OpenBlas ? AttentionPath::PerHead
                                                         : AttentionPath::Batched;
}

template <class A>
int64_t attention_forward_scratch(const Gemm&, int64_t B, int64_t T_, int64_t NH) {
  return std::is_same_v<A, bf16> ? B * NH * T_ * T_ : 0;
}

template <class A>
int64_t attention_backward_scratch(const Gemm& gemm, int64_t B, int64_t T_, int64_t NH,
                                   int64_t KVH, int64_t HS, int threads) {
  const int64_t pairs = B * NH * T_ * T_;
  // fp32 dP, then bf16 dS, then (groups only) the fp32 sums of dK or dV (B, T, KVH, HS)
  const int64_t kv_sums = KVH < NH ? B * T_ * KVH * HS : 0;
  if (std::is_same_v<A, bf16>) return pairs + (pairs + 1) / 2 + kv_sums;
  if (attention_path(gemm, std::is_same_v<A, double>) == AttentionPath::Batched) return pairs;
  return int64_t{threads} * T_ * T_;
}

namespace {
void refuse_per_head_bf16() {
  throw std::invalid_argument("backend 'cpu': bf16 attention runs as oneDNN batched matmuls; "
                              "this OpenBLAS has no bf16 GEMM (use GemmLibrary::Auto or OneDnn)");
}
}  // namespace

template <class A>
void attention_forward(Gemm& gemm, A* out, A* probs, const A* qkv, int64_t B, int64_t T_,
                       int64_t NH, int64_t KVH, int64_t HS, Acc<A>* scratch,
                       const int32_t* starts) {
  if constexpr (std::is_same_v<A, double>) {
    per_head_forward(out, probs, qkv, B, T_, NH, KVH, HS, starts);
  } else if (attention_path(gemm, false) == AttentionPath::Batched) {
    attention_forward_batched(gemm, out, probs, qkv, B, T_, NH, KVH, HS, scratch, starts);
  } else if constexpr (std::is_same_v<A, float>) {
    per_head_forward(out, probs, qkv, B, T_, NH, KVH, HS, starts);
  } else {
    refuse_per_head_bf16();
  }
}

template <class A>
void attention_backward(Gemm& gemm, A* dqkv, const A* dout, const A* qkv, const A* probs,
                        int64_t B, int64_t T_, int64_t NH, int64_t KVH, int64_t HS,
                        Acc<A>* scratch, const int32_t* starts) {
  if constexpr (std::is_same_v<A, double>) {
    per_head_backward(dqkv, dout, qkv, probs, B, T_, NH, KVH, HS, scratch, starts);
  } else if (attention_path(gemm, false) == AttentionPath::Batched) {
    attention_backward_batched(gemm, dqkv, dout, qkv, probs, B, T_, NH, KVH, HS, scratch, starts);
  } else if constexpr (std::is_same_v<A, float>) {
    per_head_backward(dqkv, dout, qkv, probs, B, T_, NH, KVH, HS, scratch, starts);
  } else {
    refuse_per_head_bf16();
  }
}

#define INSTANTIATE(A)                                                                        \
  template int64_t attention_forward_scratch<A>(const Gemm&, int64_t, int64_t, int64_t);      \
  template int64_t attention_backward_scratch<A>(const Gemm&, int64_t, int64_t, int64_t,      \
                                                 int64_t, int64_t, int);                      \
  template void attention_forward<A>(Gemm&, A*, A*, const A*, int64_t, int64_t, int64_t,      \
                                     int64_t, int64_t, Acc<A>*, const int32_t*);              \
  template void attention_backward<A>(Gemm&, A*, const A*, const A*, const A*, int64_t,       \
                                      int64_t, int64_t, int64_t, int64_t, Acc<A>*,            \
                                      const int32_t*);
INSTANTIATE(float)
INSTANTIATE(double)
INSTANTIATE(bf16)
#undef INSTANTIATE

}  // namespace meshtrain::cpu
