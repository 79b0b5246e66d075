// Causal attention in fp32 and bf16 as batched oneDNN matmuls (the math is in attention.cpp):
// each of the six products is one matmul over all B x NH (batch, head) pairs, on strided views of
// qkv (B, T, 3, NH, HS), out and dout (B, T, NH, HS), probs and dS (B, NH, T, T); a transpose is
// a swap of the last two strides. The products are full T x T ones: the zeros above the diagonal
// of P and dS make them causal, at twice the causal FLOPs, because oneDNN runs these batches far
// faster whole than in 64-query tiles. Measured on the development machine (2 threads, GPT-2
// 124M's B 4, T 256, 12 heads of 64; a quiet moment): the six products 2.3 ms forward and 5.2 ms
// backward (280-380 GFLOP/s counting the full products), against 12 and 16 ms for the per-head
// OpenBLAS path with its tiles, softmax included; 64-query tiles as batched matmuls ran at
// 3-25 GFLOP/s.

#include <cmath>
#include <cstdint>
#include <type_traits>

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

  // One product over every pair: (M, N) = alpha (M, K) @ (K, N).
  BatchedGemmShape product(int64_t M, int64_t N, int64_t K, Strides a, Strides b, Strides c,
                           float alpha = 1.0f) const {
    return BatchedGemmShape{B, NH, M, N, K, a, b, c, alpha};
  }
};

// The GEMMs by element type: fp32 throughout, or bf16 operands with fp32 sums written as fp32
// (scores, dP: the softmax and its backward run on them) or rounded once to bf16 (O, dV, dQ, dK).
void product(Gemm& gemm, const BatchedGemmShape& s, const float* a, const float* b, float* c) {
  gemm.run_batched(s, a, b, c);
}
void product(Gemm& gemm, const BatchedGemmShape& s, const bf16* a, const bf16* b, float* c) {
  gemm.run_batched_bf16(s, reinterpret_cast<const uint16_t*>(a), reinterpret_cast<const uint16_t*>(b), c);
}
void product(Gemm& gemm, const BatchedGemmShape& s, const bf16* a, const bf16* b, bf16* c) {
  gemm.run_batched_bf16(s, reinterpret_cast<const uint16_t*>(a), reinterpret_cast<const uint16_t*>(b),
                        reinterpret_cast<uint16_t*>(c));
}

}  // namespace

// fp32: the scores go into probs and the softmax runs in place; bf16: into `scores` (fp32), and
// the softmax rounds them into probs.
template <class A>
void attention_forward_batched(Gemm& gemm, A* out, A* probs, const A* qkv, int64_t B, int64_t T,
                               int64_t NH, int64_t HS, float* scores) {
  const Views v{B, T, NH, HS};
  const int64_t C = NH * HS;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(HS)));
  float* s = nullptr;
  if constexpr (std::is_same_v<A, float>) s = probs;
  else s = scores;
  product(gemm, v.product(T, T, HS, v.q(), v.qt(), v.p(), scale), qkv, qkv + C, s);  // S
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < B * NH * T; ++row)
    causal_softmax_row(probs + row * T, s + row * T, row % T, T);
  product(gemm, v.product(T, HS, T, v.p(), v.q(), v.o()), probs, qkv + 2 * C, out);  // O = P V
}

// fp32: dS overwrites dP in `scratch`; bf16: dP (fp32) fills the first B * NH * T * T floats
// of `scratch` and dS (bf16, the operand of the next two GEMMs) follows it.
template <class A>
void attention_backward_batched(Gemm& gemm, A* dqkv, const A* dout, const A* qkv, const A* probs,
                                int64_t B, int64_t T, int64_t NH, int64_t HS, float* scratch) {
  const Views v{B, T, NH, HS};
  const int64_t C = NH * HS;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(HS)));
  const A *q = qkv, *k = qkv + C, *val = qkv + 2 * C;
  A *dq = dqkv, *dk = dqkv + C, *dv = dqkv + 2 * C;
  float* dP = scratch;
  A* dS = nullptr;
  if constexpr (std::is_same_v<A, float>) dS = scratch;
  else dS = reinterpret_cast<A*>(scratch + B * NH * T * T);
  product(gemm, v.product(T, T, HS, v.o(), v.qt(), v.p()), dout, val, dP);  // dP = dO V^T
  product(gemm, v.product(T, HS, T, v.pt(), v.o(), v.q()), probs, dout, dv);  // dV = P^T dO
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < B * NH * T; ++row)  // softmax backward; dS = 0 above the diagonal
    causal_softmax_backward_row(dS + row * T, probs + row * T, dP + row * T, row % T, T, scale);
  product(gemm, v.product(T, HS, T, v.p(), v.q(), v.q()), dS, k, dq);   // dQ = dS K
  product(gemm, v.product(T, HS, T, v.pt(), v.q(), v.q()), dS, q, dk);  // dK = dS^T Q
}

#define INSTANTIATE(A)                                                                        \
  template void attention_forward_batched<A>(Gemm&, A*, A*, const A*, int64_t, int64_t,       \
                                             int64_t, int64_t, float*);                       \
  template void attention_backward_batched<A>(Gemm&, A*, const A*, const A*, const A*,        \
                                              int64_t, int64_t, int64_t, int64_t, float*);
INSTANTIATE(float)
INSTANTIATE(bf16)
#undef INSTANTIATE

}  // namespace meshtrain::cpu
