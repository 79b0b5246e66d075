// GELU, tanh approximation (Hendrycks & Gimpel, arXiv 1606.08415), as GPT-2 uses it, FP32 math:
//   gelu(x) = 0.5 x (1 + tanh(u)),  u = k (x + 0.044715 x^3),  k = sqrt(2 / pi)
//   d/dx    = 0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) k (1 + 3 * 0.044715 x^2)

#include "cuda_check.h"
#include "device_common.cuh"
#include "kernels.h"

namespace meshtrain::cuda {

namespace {

constexpr float kScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kCube = 0.044715f;

__device__ __forceinline__ float gelu(float x) {
  return 0.5f * x * (1.f + tanhf(kScale * (x + kCube * x * x * x)));
}

__device__ __forceinline__ float gelu_slope(float x) {
  const float t = tanhf(kScale * (x + kCube * x * x * x));
  return 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * kScale * (1.f + 3.f * kCube * x * x);
}

template <class T>
__global__ void gelu_forward_kernel(T* out, const T* inp, int64_t n, int64_t packs) {
  MESHTRAIN_GRID_LOOP(p, packs) {
    const Pack<T> x = load_pack(inp, p);
    Pack<T> y;
#pragma unroll
    for (int k = 0; k < kPack; ++k) y.v[k] = from_float<T>(gelu(to_float(x.v[k])));
    store_pack(out, p, y);
  }
  MESHTRAIN_GRID_LOOP(i, n - packs * kPack) {
    const int64_t j = packs * kPack + i;
    out[j] = from_float<T>(gelu(to_float(inp[j])));
  }
}

template <class T>
__global__ void gelu_backward_kernel(T* dinp, const T* inp, const T* dout, int64_t n,
                                     int64_t packs) {
  MESHTRAIN_GRID_LOOP(p, packs) {
    const Pack<T> x = load_pack(inp, p), dy = load_pack(dout, p);
    Pack<T> dx;
#pragma unroll
    for (int k = 0; k < kPack; ++k)
      dx.v[k] = from_float<T>(gelu_slope(to_float(x.v[k])) * to_float(dy.v[k]));
    store_pack(dinp, p, dx);
  }
  MESHTRAIN_GRID_LOOP(i, n - packs * kPack) {
    const int64_t j = packs * kPack + i;
    dinp[j] = from_float<T>(gelu_slope(to_float(inp[j])) * to_float(dout[j]));
  }
}

}  // namespace

template <class T> void gelu_forward(T* out, const T* inp, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  const int64_t packs = pack_count(n, out, inp);
  gelu_forward_kernel<<<grid_for(packs > 0 ? packs : n), kThreads, 0, s>>>(out, inp, n, packs);
  check_launch("gelu_forward");
}

template <class T>
void gelu_backward(T* dinp, const T* inp, const T* dout, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  const int64_t packs = pack_count(n, dinp, inp, dout);
  gelu_backward_kernel<<<grid_for(packs > 0 ? packs : n), kThreads, 0, s>>>(dinp, inp, dout, n,
                                                                             packs);
  check_launch("gelu_backward");
}

template void gelu_forward<float>(float*, const float*, int64_t, cudaStream_t);
template void gelu_forward<bf16>(bf16*, const bf16*, int64_t, cudaStream_t);
template void gelu_backward<float>(float*, const float*, const float*, int64_t, cudaStream_t);
template void gelu_backward<bf16>(bf16*, const bf16*, const bf16*, int64_t, cudaStream_t);

}  // namespace meshtrain::cuda
