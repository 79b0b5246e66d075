// Rotary position embedding, FP32 math on float or bf16 storage (the CPU backend's rotary.cpp
// states the formulas): a thread per channel pair, in place; a position outside the table writes
// NaN into its row's heads (backend.h), since the device cannot refuse it without the host
// waiting.

#include "cuda_check.h"
#include "device_common.cuh"
#include "kernels.h"

namespace meshtrain::cuda {

namespace {

template <class T>
__global__ void rotary_kernel(T* x, const int32_t* positions, const float* cos, const float* sin,
                              int64_t N, int64_t W, int64_t column, int64_t heads, int64_t half,
                              int64_t stride, int64_t P, float sign) {
  MESHTRAIN_GRID_LOOP(k, N * heads * half) {
    const int64_t i = k % half, h = (k / half) % heads, n = k / (half * heads);
    T* head = x + n * W + column + h * stride;
    const int64_t p = positions[n];
    if (p < 0 || p >= P) {
      head[i] = head[i + half] = from_float<T>(__int_as_float(0x7fc00000));  // quiet NaN
      continue;
    }
    const float a = to_float(head[i]), b = to_float(head[i + half]);
    const float c = cos[p * half + i], s = sign * sin[p * half + i];
    head[i] = from_float<T>(a * c - b * s);
    head[i + half] = from_float<T>(b * c + a * s);
  }
}

}  // namespace

template <class T>
void rotary(T* x, const int32_t* positions, const float* cos, const float* sin, int64_t N,
            int64_t W, int64_t column, int64_t heads, int64_t head_dim, int64_t stride, int64_t P,
            bool by_minus_angle, cudaStream_t s) {
  const int64_t pairs = N * heads * (head_dim / 2);
  if (pairs == 0) return;
  rotary_kernel<<<grid_for(pairs), kThreads, 0, s>>>(x, positions, cos, sin, N, W, column, heads,
                                                     head_dim / 2, stride, P,
                                                     by_minus_angle ? -1.f : 1.f);
  check_launch(by_minus_angle ? "rotary_backward" : "rotary_forward");
}

#define INSTANTIATE(T)                                                                          \
  template void rotary<T>(T*, const int32_t*, const float*, const float*, int64_t, int64_t,     \
                          int64_t, int64_t, int64_t, int64_t, int64_t, bool, cudaStream_t);
INSTANTIATE(float)
INSTANTIATE(bf16)
#undef INSTANTIATE

}  // namespace meshtrain::cuda
