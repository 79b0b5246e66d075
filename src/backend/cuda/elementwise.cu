// Elementwise kernels: fill, add, scale, residual, dtype conversion, bias broadcast. Grid-stride
// loops over the flat index; arithmetic in float, one rounding to the output type.

#include "cuda_check.h"
#include "device_common.cuh"
#include "kernels.h"

namespace meshtrain::cuda {

namespace {

template <class T> __global__ void fill_kernel(T* out, T value, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    out[i] = value;
}

template <class D, class S> __global__ void add_kernel(D* dst, const S* src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    dst[i] = from_float<D>(to_float(dst[i]) + to_float(src[i]));
}

template <class T> __global__ void scale_kernel(T* t, float factor, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    t[i] = from_float<T>(to_float(t[i]) * factor);
}

template <class T> __global__ void residual_kernel(T* out, const T* a, const T* b, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    out[i] = from_float<T>(to_float(a[i]) + to_float(b[i]));
}

template <class D, class S> __global__ void convert_kernel(D* out, const S* in, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    out[i] = from_float<D>(to_float(in[i]));
}

// Flat over (N, C): consecutive threads take consecutive channels, so bias reads coalesce.
template <class T> __global__ void bias_forward_kernel(T* out, const T* bias, int64_t N, int64_t C) {
  const int64_t n = N * C;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    out[i] = from_float<T>(to_float(out[i]) + to_float(bias[i % C]));
}

template <class T> T cast_value(double v) { return static_cast<T>(v); }
template <> bf16 cast_value<bf16>(double v) { return __float2bfloat16_rn(static_cast<float>(v)); }

}  // namespace

template <class T> void fill(T* out, double value, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  fill_kernel<<<grid_for(n), kThreads, 0, s>>>(out, cast_value<T>(value), n);
  check_launch("fill");
}

template <class D, class S> void add_inplace(D* dst, const S* src, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  add_kernel<<<grid_for(n), kThreads, 0, s>>>(dst, src, n);
  check_launch("add_inplace");
}

template <class T> void scale_inplace(T* t, float factor, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  scale_kernel<<<grid_for(n), kThreads, 0, s>>>(t, factor, n);
  check_launch("scale_inplace");
}

template <class T> void residual_forward(T* out, const T* a, const T* b, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  residual_kernel<<<grid_for(n), kThreads, 0, s>>>(out, a, b, n);
  check_launch("residual_forward");
}

template <class D, class S> void convert(D* out, const S* in, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  convert_kernel<<<grid_for(n), kThreads, 0, s>>>(out, in, n);
  check_launch("cast");
}

template <class T> void bias_forward(T* out, const T* bias, int64_t N, int64_t C, cudaStream_t s) {
  if (N * C == 0) return;
  bias_forward_kernel<<<grid_for(N * C), kThreads, 0, s>>>(out, bias, N, C);
  check_launch("bias_forward");
}

template void fill<double>(double*, double, int64_t, cudaStream_t);
template void fill<float>(float*, double, int64_t, cudaStream_t);
template void fill<bf16>(bf16*, double, int64_t, cudaStream_t);
template void fill<int32_t>(int32_t*, double, int64_t, cudaStream_t);
template void add_inplace<float, float>(float*, const float*, int64_t, cudaStream_t);
template void add_inplace<bf16, bf16>(bf16*, const bf16*, int64_t, cudaStream_t);
template void add_inplace<float, bf16>(float*, const bf16*, int64_t, cudaStream_t);
template void scale_inplace<float>(float*, float, int64_t, cudaStream_t);
template void scale_inplace<bf16>(bf16*, float, int64_t, cudaStream_t);
template void residual_forward<float>(float*, const float*, const float*, int64_t, cudaStream_t);
template void residual_forward<bf16>(bf16*, const bf16*, const bf16*, int64_t, cudaStream_t);
template void convert<bf16, float>(bf16*, const float*, int64_t, cudaStream_t);
template void convert<float, bf16>(float*, const bf16*, int64_t, cudaStream_t);
template void bias_forward<float>(float*, const float*, int64_t, int64_t, cudaStream_t);
template void bias_forward<bf16>(bf16*, const bf16*, int64_t, int64_t, cudaStream_t);

}  // namespace meshtrain::cuda
