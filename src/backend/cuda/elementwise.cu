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

// The loops below share one shape: whole packs first (pack index p), then the tail elements
// from packs * kPack on.
template <class D, class S>
__global__ void add_kernel(D* dst, const S* src, int64_t n, int64_t packs) {
  MESHTRAIN_GRID_LOOP(p, packs) {
    Pack<D> d = load_pack(dst, p);
    const Pack<S> x = load_pack(src, p);
#pragma unroll
    for (int k = 0; k < kPack; ++k) d.v[k] = from_float<D>(to_float(d.v[k]) + to_float(x.v[k]));
    store_pack(dst, p, d);
  }
  MESHTRAIN_GRID_LOOP(i, n - packs * kPack) {
    const int64_t j = packs * kPack + i;
    dst[j] = from_float<D>(to_float(dst[j]) + to_float(src[j]));
  }
}

template <class T> __global__ void scale_kernel(T* t, float factor, int64_t n, int64_t packs) {
  MESHTRAIN_GRID_LOOP(p, packs) {
    Pack<T> x = load_pack(t, p);
#pragma unroll
    for (int k = 0; k < kPack; ++k) x.v[k] = from_float<T>(to_float(x.v[k]) * factor);
    store_pack(t, p, x);
  }
  MESHTRAIN_GRID_LOOP(i, n - packs * kPack) {
    const int64_t j = packs * kPack + i;
    t[j] = from_float<T>(to_float(t[j]) * factor);
  }
}

template <class T>
__global__ void residual_kernel(T* out, const T* a, const T* b, int64_t n, int64_t packs) {
  MESHTRAIN_GRID_LOOP(p, packs) {
    const Pack<T> x = load_pack(a, p), y = load_pack(b, p);
    Pack<T> o;
#pragma unroll
    for (int k = 0; k < kPack; ++k) o.v[k] = from_float<T>(to_float(x.v[k]) + to_float(y.v[k]));
    store_pack(out, p, o);
  }
  MESHTRAIN_GRID_LOOP(i, n - packs * kPack) {
    const int64_t j = packs * kPack + i;
    out[j] = from_float<T>(to_float(a[j]) + to_float(b[j]));
  }
}

template <class D, class S>
__global__ void convert_kernel(D* out, const S* in, int64_t n, int64_t packs) {
  MESHTRAIN_GRID_LOOP(p, packs) {
    const Pack<S> x = load_pack(in, p);
    Pack<D> o;
#pragma unroll
    for (int k = 0; k < kPack; ++k) o.v[k] = from_float<D>(to_float(x.v[k]));
    store_pack(out, p, o);
  }
  MESHTRAIN_GRID_LOOP(i, n - packs * kPack) {
    const int64_t j = packs * kPack + i;
    out[j] = from_float<D>(to_float(in[j]));
  }
}

// Flat over (N, C): consecutive threads take consecutive channels, so bias reads coalesce. Packs
// (C a multiple of kPack) never straddle two rows.
template <class T>
__global__ void bias_forward_kernel(T* out, const T* bias, int64_t N, int64_t C, int64_t packs) {
  MESHTRAIN_GRID_LOOP(p, packs) {
    Pack<T> o = load_pack(out, p);
    const Pack<T> b = load_pack(bias, p % (C / kPack));
#pragma unroll
    for (int k = 0; k < kPack; ++k) o.v[k] = from_float<T>(to_float(o.v[k]) + to_float(b.v[k]));
    store_pack(out, p, o);
  }
  if (packs > 0) return;
  MESHTRAIN_GRID_LOOP(i, N * C) out[i] = from_float<T>(to_float(out[i]) + to_float(bias[i % C]));
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
  const int64_t packs = pack_count(n, dst, src);
  add_kernel<<<grid_for(packs > 0 ? packs : n), kThreads, 0, s>>>(dst, src, n, packs);
  check_launch("add_inplace");
}

template <class T> void scale_inplace(T* t, float factor, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  const int64_t packs = pack_count(n, t);
  scale_kernel<<<grid_for(packs > 0 ? packs : n), kThreads, 0, s>>>(t, factor, n, packs);
  check_launch("scale_inplace");
}

template <class T> void residual_forward(T* out, const T* a, const T* b, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  const int64_t packs = pack_count(n, out, a, b);
  residual_kernel<<<grid_for(packs > 0 ? packs : n), kThreads, 0, s>>>(out, a, b, n, packs);
  check_launch("residual_forward");
}

template <class D, class S> void convert(D* out, const S* in, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  const int64_t packs = pack_count(n, out, in);
  convert_kernel<<<grid_for(packs > 0 ? packs : n), kThreads, 0, s>>>(out, in, n, packs);
  check_launch("cast");
}

template <class T> void bias_forward(T* out, const T* bias, int64_t N, int64_t C, cudaStream_t s) {
  if (N * C == 0) return;
  const int64_t packs = C % kPack == 0 ? pack_count(N * C, out, bias) : 0;
  bias_forward_kernel<<<grid_for(packs > 0 ? packs : N * C), kThreads, 0, s>>>(out, bias, N, C,
                                                                                 packs);
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
