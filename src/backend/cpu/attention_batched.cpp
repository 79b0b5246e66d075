// Causal attention in fp32 as batched oneDNN matmuls (the math is in attention.cpp): each row
// (or column) tile of kAttentionBlock queries is one matmul over all B x NH (batch, head) pairs,
// its operands strided views of qkv (B, T, 3, NH, HS), out and dout (B, T, NH, HS), probs and dS
// (B, NH, T, T); a transpose is a swap of the last two strides. oneDNN threads each matmul over
// the pairs, where the per-head path runs 48 small single-threaded OpenBLAS calls per tile.
// Measured against that path on the development machine (2 threads, loaded, GPT-2 shapes,
// A/B in one process): S = Q K^T 1.9x, O = P V 2.8x faster.

#include <algorithm>
#include <cmath>

#include "attention_rows.h"
#include "kernels.h"
#include "meshtrain/backend/cpu/gemm.h"

namespace meshtrain::cpu {

namespace {

using Strides = BatchedGemmShape::Strides;

// The strided views of one attention call, in elements.
struct Views {
  int64_t B, T, NH, HS;
  Strides q() const { return {T * 3 * NH * HS, HS, 3 * NH * HS, 1}; }   // Q, K or V: (T, HS) per pair
  Strides qt() const { return {T * 3 * NH * HS, HS, 1, 3 * NH * HS}; }  // their transpose (HS, T)
  Strides o() const { return {T * NH * HS, HS, NH * HS, 1}; }           // out, dout: (T, HS)
  Strides p() const { return {NH * T * T, T * T, T, 1}; }               // probs, dS: (T, T)
  Strides pt() const { return {NH * T * T, T * T, 1, T}; }              // their transpose
  int64_t ld_qkv() const { return 3 * NH * HS; }
  int64_t ld_o() const { return NH * HS; }
};

BatchedGemmShape tile(const Views& v, int64_t M, int64_t N, int64_t K, Strides a, Strides b,
                      Strides c, float alpha = 1.0f) {
  return BatchedGemmShape{v.B, v.NH, M, N, K, a, b, c, alpha};
}

}  // namespace

void attention_forward_batched(Gemm& gemm, float* out, float* probs, const float* qkv, int64_t B,
                               int64_t T, int64_t NH, int64_t HS) {
  const Views v{B, T, NH, HS};
  const int64_t C = NH * HS;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(HS)));
  for (int64_t r0 = 0; r0 < T; r0 += kAttentionBlock) {  // S[r] = scale Q[r] K[:keys]^T
    const int64_t rows = std::min(kAttentionBlock, T - r0), keys = r0 + rows;
    gemm.run_batched(tile(v, rows, keys, HS, v.q(), v.qt(), v.p(), scale), qkv + r0 * v.ld_qkv(),
                     qkv + C, probs + r0 * T);
  }
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < B * NH * T; ++row) causal_softmax_row(probs + row * T, row % T, T);
  for (int64_t r0 = 0; r0 < T; r0 += kAttentionBlock) {  // O[r] = P[r, :keys] V[:keys]
    const int64_t rows = std::min(kAttentionBlock, T - r0), keys = r0 + rows;
    gemm.run_batched(tile(v, rows, HS, keys, v.p(), v.q(), v.o()), probs + r0 * T, qkv + 2 * C,
                     out + r0 * v.ld_o());
  }
}

void attention_backward_batched(Gemm& gemm, float* dqkv, const float* dout, const float* qkv,
                                const float* probs, int64_t B, int64_t T, int64_t NH, int64_t HS,
                                float* dS) {
  const Views v{B, T, NH, HS};
  const int64_t C = NH * HS;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(HS)));
  const float* q = qkv;
  const float* k = qkv + C;
  const float* val = qkv + 2 * C;
  float* dq = dqkv;
  float* dk = dqkv + C;
  float* dv = dqkv + 2 * C;
  for (int64_t r0 = 0; r0 < T; r0 += kAttentionBlock) {  // dP[r] = dO[r] V[:keys]^T
    const int64_t rows = std::min(kAttentionBlock, T - r0), keys = r0 + rows;
    gemm.run_batched(tile(v, rows, keys, HS, v.o(), v.qt(), v.p()), dout + r0 * v.ld_o(), val,
                     dS + r0 * T);
  }
  for (int64_t c0 = 0; c0 < T; c0 += kAttentionBlock) {  // dV[c] = P[c:, c]^T dO[c:]
    const int64_t cols = std::min(kAttentionBlock, T - c0), rows = T - c0;
    gemm.run_batched(tile(v, cols, HS, rows, v.pt(), v.o(), v.q()), probs + c0 * T + c0,
                     dout + c0 * v.ld_o(), dv + c0 * v.ld_qkv());
  }
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < B * NH * T; ++row)  // softmax backward, in place over dP
    causal_softmax_backward_row(dS + row * T, probs + row * T, row % T, T, scale);
  for (int64_t r0 = 0; r0 < T; r0 += kAttentionBlock) {  // dQ[r] = dS[r, :keys] K[:keys]
    const int64_t rows = std::min(kAttentionBlock, T - r0), keys = r0 + rows;
    gemm.run_batched(tile(v, rows, HS, keys, v.p(), v.q(), v.q()), dS + r0 * T, k,
                     dq + r0 * v.ld_qkv());
  }
  for (int64_t c0 = 0; c0 < T; c0 += kAttentionBlock) {  // dK[c] = dS[c:, c]^T Q[c:]
    const int64_t cols = std::min(kAttentionBlock, T - c0), rows = T - c0;
    gemm.run_batched(tile(v, cols, HS, rows, v.pt(), v.q(), v.q()), dS + c0 * T + c0,
                     q + c0 * v.ld_qkv(), dk + c0 * v.ld_qkv());
  }
}

}  // namespace meshtrain::cpu
