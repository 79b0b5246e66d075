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

template <class T> __global__ void gelu_forward_kernel(T* out, const T* inp, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float x = to_float(inp[i]);
    out[i] = from_float<T>(0.5f * x * (1.f + tanhf(kScale * (x + kCube * x * x * x))));
  }
}

template <class T>
__global__ void gelu_backward_kernel(T* dinp, const T* inp, const T* dout, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float x = to_float(inp[i]);
    const float t = tanhf(kScale * (x + kCube * x * x * x));
    const float local =
        0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * kScale * (1.f + 3.f * kCube * x * x);
    dinp[i] = from_float<T>(local * to_float(dout[i]));
  }
}

}  // namespace

template <class T> void gelu_forward(T* out, const T* inp, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  gelu_forward_kernel<<<grid_for(n), kThreads, 0, s>>>(out, inp, n);
  check_launch("gelu_forward");
}

template <class T>
void gelu_backward(T* dinp, const T* inp, const T* dout, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  gelu_backward_kernel<<<grid_for(n), kThreads, 0, s>>>(dinp, inp, dout, n);
  check_launch("gelu_backward");
}

template void gelu_forward<float>(float*, const float*, int64_t, cudaStream_t);
template void gelu_forward<bf16>(bf16*, const bf16*, int64_t, cudaStream_t);
template void gelu_backward<float>(float*, const float*, const float*, int64_t, cudaStream_t);
template void gelu_backward<bf16>(bf16*, const bf16*, const bf16*, int64_t, cudaStream_t);

}  // namespace meshtrain::cuda
