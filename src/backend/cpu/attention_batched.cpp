// Causal attention in fp32 and bf16 as batched oneDNN matmuls (the math is in attention.cpp):
// each of the six products is one matmul over all B x NH (batch, head) pairs (with grouped-query
// heads, one matmul per member of a group over the B x KVH (batch, key/value head) pairs: Views),
// on strided views of qkv rows of NH + 2 KVH heads, out and dout (B, T, NH, HS), probs and dS
// (B, NH, T, T); a transpose is a swap of the last two strides. The products are full T x T
// ones: the zeros above the diagonal of P and dS make them causal, at twice the causal FLOPs,
// because oneDNN runs these batches far faster whole than in 64-query tiles. Measured on the
// development machine (2 threads, GPT-2 124M's B 4, T 256, 12 heads of 64; a quiet moment): the
// six products 2.3 ms forward and 5.2 ms backward (280-380 GFLOP/s counting the full products),
// against 12 and 16 ms for the per-head OpenBLAS path with its tiles, softmax included; 64-query
// tiles as batched matmuls ran at 3-25 GFLOP/s.

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "attention_rows.h"
#include "kernels.h"
#include "meshtrain/backend/cpu/gemm.h"

namespace meshtrain::cpu {

namespace {

using Strides = BatchedGemmShape::Strides;

// The strided views of one attention call, in elements. The two batch dimensions are (batch,
// key/value head g); with groups of G = NH / KVH query heads a product runs once per member j of
// the group, on query head g G + j: its Q, O and P views step G heads per batch1 and start j
// heads in, while K and V step one head. G == 1 is a single product over (batch, head).
struct Views {
  int64_t B, T, NH, KVH, HS;
  int64_t G() const { return NH / KVH; }
  int64_t W() const { return (NH + 2 * KVH) * HS; }  // a qkv row
  Strides q() const { return {T * W(), G() * HS, W(), 1}; }   // Q, dQ: (T, HS) per pair
  Strides qt() const { return {T * W(), G() * HS, 1, W()}; }  // Q^T (HS, T)
  Strides kv() const { return {T * W(), HS, W(), 1}; }        // K, V, dK, dV: (T, HS)
  Strides kvt() const { return {T * W(), HS, 1, W()}; }       // K^T, V^T (HS, T)
  Strides o() const { return {T * NH * HS, G() * HS, NH * HS, 1}; }  // out, dout: (T, HS)
  Strides p() const { return {NH * T * T, G() * T * T, T, 1}; }      // probs, dS: (T, T)
  Strides pt() const { return {NH * T * T, G() * T * T, 1, T}; }     // their transpose
  // Offsets of member j's query head in qkv (or out) and in probs; of K and V in qkv.
  int64_t q_at(int64_t j) const { return j * HS; }
  int64_t p_at(int64_t j) const { return j * T * T; }
  int64_t k_at() const { return NH * HS; }
  int64_t v_at() const { return (NH + KVH) * HS; }

  // One product over every (batch, key/value head): (M, N) = alpha (M, K) @ (K, N).
  BatchedGemmShape product(int64_t M, int64_t N, int64_t K, Strides a, Strides b, Strides c,
                           float alpha = 1.0f) const {
    return BatchedGemmShape{B, KVH, M, N, K, a, b, c, alpha};
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
                               int64_t NH, int64_t KVH, int64_t HS, float* scores,
                               const int32_t* starts) {
  const Views v{B, T, NH, KVH, HS};
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(HS)));
  float* s = nullptr;
  if constexpr (std::is_same_v<A, float>) s = probs;
  else s = scores;
  for (int64_t j = 0; j < v.G(); ++j)  // S = scale Q K^T
    product(gemm, v.product(T, T, HS, v.q(), v.kvt(), v.p(), scale), qkv + v.q_at(j),
            qkv + v.k_at(), s + v.p_at(j));
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < B * NH * T; ++row) {
    const int64_t i = row % T;
    causal_softmax_row(probs + row * T, s + row * T, first_key(starts, row / (NH * T), T, i), i,
                       T);
  }
  for (int64_t j = 0; j < v.G(); ++j)  // O = P V
    product(gemm, v.product(T, HS, T, v.p(), v.kv(), v.o()), probs + v.p_at(j), qkv + v.v_at(),
            out + v.q_at(j));
}

namespace {
// dX (T, HS per (batch, key/value head), inside dqkv) = sum over the group's members j, in
// order, of a (j) @ b (j), where `member(j)` gives the product's operands. fp32 adds each product
// onto dX; bf16 sums in fp32 `wide` (B, T, KVH, HS) and rounds once into dX. G == 1 writes dX
// directly, as one product.
template <class A, class Member>
void group_sum(Gemm& gemm, const Views& v, const BatchedGemmShape& s, A* dX, float* wide,
               Member member) {
  if (v.G() == 1) {
    const auto [a, b] = member(0);
    return product(gemm, s, a, b, dX);
  }
  BatchedGemmShape sum = s;
  if constexpr (std::is_same_v<A, bf16>) sum.c = {v.T * v.KVH * v.HS, v.HS, v.KVH * v.HS, 1};
  for (int64_t j = 0; j < v.G(); ++j) {
    const auto [a, b] = member(j);
    const Accumulate acc = j == 0 ? Accumulate::Assign : Accumulate::Add;
    if constexpr (std::is_same_v<A, float>) {
      gemm.run_batched(sum, a, b, dX, acc);
    } else {
      gemm.run_batched_bf16(sum, reinterpret_cast<const uint16_t*>(a),
                            reinterpret_cast<const uint16_t*>(b), wide, acc);
    }
  }
  if constexpr (std::is_same_v<A, bf16>) {
    const int64_t rows = v.B * v.T, cols = v.KVH * v.HS;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) dX[r * v.W() + c] = narrow<bf16>(wide[r * cols + c]);
  }
}
}  // namespace

// fp32: dS overwrites dP in `scratch`; bf16: dP (fp32) fills the first B * NH * T * T floats
// of `scratch`, dS (bf16, the operand of the next two GEMMs) follows it, and with groups the
// fp32 sums of dV, then of dK, follow dS.
template <class A>
void attention_backward_batched(Gemm& gemm, A* dqkv, const A* dout, const A* qkv, const A* probs,
                                int64_t B, int64_t T, int64_t NH, int64_t KVH, int64_t HS,
                                float* scratch, const int32_t* starts) {
  const Views v{B, T, NH, KVH, HS};
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(HS)));
  const A *q = qkv, *k = qkv + v.k_at(), *val = qkv + v.v_at();
  A *dq = dqkv, *dk = dqkv + v.k_at(), *dv = dqkv + v.v_at();
  const int64_t pairs = B * NH * T * T;
  float* dP = scratch;
  A* dS = nullptr;
  float* wide = nullptr;
  if constexpr (std::is_same_v<A, float>) {
    dS = scratch;
  } else {
    dS = reinterpret_cast<A*>(scratch + pairs);
    wide = scratch + pairs + (pairs + 1) / 2;
  }
  for (int64_t j = 0; j < v.G(); ++j)  // dP = dO V^T
    product(gemm, v.product(T, T, HS, v.o(), v.kvt(), v.p()), dout + v.q_at(j), val,
            dP + v.p_at(j));
  group_sum(gemm, v, v.product(T, HS, T, v.pt(), v.o(), v.kv()), dv, wide, [&](int64_t j) {
    return std::pair{probs + v.p_at(j), dout + v.q_at(j)};  // dV = sum_j P_j^T dO_j
  });
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < B * NH * T; ++row) {  // softmax backward; dS = 0 where masked
    const int64_t i = row % T;
    causal_softmax_backward_row(dS + row * T, probs + row * T, dP + row * T,
                                first_key(starts, row / (NH * T), T, i), i, T, scale);
  }
  for (int64_t j = 0; j < v.G(); ++j)  // dQ = dS K
    product(gemm, v.product(T, HS, T, v.p(), v.kv(), v.q()), dS + v.p_at(j), k, dq + v.q_at(j));
  group_sum(gemm, v, v.product(T, HS, T, v.pt(), v.q(), v.kv()), dk, wide, [&](int64_t j) {
    return std::pair{static_cast<const A*>(dS + v.p_at(j)), q + v.q_at(j)};  // dK = sum dS^T Q
  });
}

#define INSTANTIATE(A)                                                                        \
  template void attention_forward_batched<A>(Gemm&, A*, A*, const A*, int64_t, int64_t,       \
                                             int64_t, int64_t, int64_t, float*,               \
                                             const int32_t*);                                 \
  template void attention_backward_batched<A>(Gemm&, A*, const A*, const A*, const A*,        \
                                              int64_t, int64_t, int64_t, int64_t, int64_t,    \
                                              float*, const int32_t*);
INSTANTIATE(float)
INSTANTIATE(bf16)
#undef INSTANTIATE

}  // namespace meshtrain::cpu
