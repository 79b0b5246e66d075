// Linear layers through Gemm (gemm.h: oneDNN or OpenBLAS by shape). Weights are (OC, C) as in
// PyTorch, activations row-major (N, C):
//   forward   out (N, OC)   = inp (N, C) @ W^T + b     GEMM N,T   (bias and residual fused)
//   backward  dinp (N, C)   = dout (N, OC) @ W         GEMM N,N
//             dW (OC, C)   += dout^T @ inp             GEMM T,N   (Accumulate::Add)
//             db (OC)      += column sums of dout
// bf16 mixed precision: bf16 operands, fp32 accumulation; out and dinp are rounded to bf16 once,
// dW and db stay fp32.

#include <algorithm>
#include <type_traits>
#include <vector>

#include "kernels.h"
#include "meshtrain/backend/cpu/gemm.h"

namespace meshtrain::cpu {

namespace {
constexpr int64_t kColumnBlock = 128;

const uint16_t* bits(const bf16* p) { return reinterpret_cast<const uint16_t*>(p); }
uint16_t* bits(bf16* p) { return reinterpret_cast<uint16_t*>(p); }
}  // namespace

// bf16: the GEMM takes an fp32 bias (the bf16 bias widened, exactly) and rounds its fp32 sum
// (residual included) once into the bf16 output.
template <class A>
void matmul_forward(Gemm& gemm, A* out, const A* inp, const A* weight, const A* bias, int64_t N,
                    int64_t C, int64_t OC, const A* residual) {
  const GemmShape s = GemmShape::dense(Trans::No, Trans::Yes, N, OC, C);
  const GemmOptions o{Accumulate::Assign, Epilogue::None, residual};
  if constexpr (std::is_same_v<A, bf16>) {
    std::vector<float> wide_bias;
    if (bias) {
      wide_bias.resize(static_cast<size_t>(OC));
      bf16_to_float(wide_bias.data(), bits(bias), OC);
    }
    gemm.run_bf16(s, bits(inp), bits(weight), bias ? wide_bias.data() : nullptr, bits(out), o);
  } else {
    gemm.run(s, inp, weight, bias, out, o);
  }
}

// bf16: dinp rounds once from fp32; dW accumulates in fp32 straight from the bf16 operands.
template <class A>
void matmul_backward(Gemm& gemm, A* dinp, Acc<A>* dweight, Acc<A>* dbias, const A* dout,
                     const A* inp, const A* weight, int64_t N, int64_t C, int64_t OC,
                     Accumulate dweight_acc) {
  const GemmShape ds = GemmShape::dense(Trans::No, Trans::No, N, C, OC);
  const GemmShape ws = GemmShape::dense(Trans::Yes, Trans::No, OC, C, N);
  const GemmOptions add{dweight_acc, Epilogue::None};
  if constexpr (std::is_same_v<A, bf16>) {
    if (dinp) gemm.run_bf16(ds, bits(dout), bits(weight), nullptr, bits(dinp));
    if (dweight) gemm.run_bf16(ws, bits(dout), bits(inp), nullptr, dweight, add);
  } else {
    if (dinp) gemm.run(ds, dout, weight, nullptr, dinp);
    if (dweight) gemm.run(ws, dout, inp, nullptr, dweight, add);
  }
  if (dbias) bias_backward(dbias, dout, N, OC);
}

template <class A> void bias_forward(A* out, const A* bias, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    A* o = out + i * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) o[c] = narrow<A>(widen(o[c]) + widen(bias[c]));
  }
}

// Column sums in blocks of kColumnBlock columns, rows in order: no races, fixed summation order.
template <class A> void bias_backward(Acc<A>* dbias, const A* dout, int64_t N, int64_t C) {
  using T = Acc<A>;
  const int64_t blocks = (C + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t c0 = blk * kColumnBlock, c1 = std::min(C, c0 + kColumnBlock);
    T acc[kColumnBlock] = {};
    for (int64_t i = 0; i < N; ++i) {
      const A* g = dout + i * C;
#pragma omp simd
      for (int64_t c = c0; c < c1; ++c) acc[c - c0] += widen(g[c]);
    }
    for (int64_t c = c0; c < c1; ++c) dbias[c] += acc[c - c0];
  }
}

#define INSTANTIATE(A)                                                                        \
  template void bias_forward<A>(A*, const A*, int64_t, int64_t);                              \
  template void bias_backward<A>(Acc<A>*, const A*, int64_t, int64_t);                        \
  template void matmul_forward<A>(Gemm&, A*, const A*, const A*, const A*, int64_t, int64_t,   \
                                  int64_t, const A*);                                         \
  template void matmul_backward<A>(Gemm&, A*, Acc<A>*, Acc<A>*, const A*, const A*, const A*,  \
                                   int64_t, int64_t, int64_t, Accumulate);
INSTANTIATE(float)
INSTANTIATE(double)
INSTANTIATE(bf16)
#undef INSTANTIATE

}  // namespace meshtrain::cpu
