#pragma once
// Device-side helpers shared by the backend's .cu files: conversions between the activation
// type and float, warp reductions, and launch-size arithmetic. Included only by .cu files.

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace meshtrain::cuda {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <class T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

template <class V> __device__ __forceinline__ V warp_sum(V v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Sum over a block of blockDim.x threads (a multiple of 32, at most 1024) in a fixed order;
// every thread gets the result. `shared` holds at least 32 values.
template <class V> __device__ V block_sum(V v, V* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_sum(v);
  __syncthreads();  // `shared` may still be read from a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : V(0);
  return warp_sum(v);
}

constexpr int kThreads = 256;

// Column sums of chunk partials (bias and LayerNorm parameter gradients), by blocks of
// (kSliceColumns, kSlices) threads: thread (x, y) sums rows y, y + kSlices, ... of its column in
// order, then thread (x, 0) sums the slices in order. A fixed order, so the bits repeat; and
// every column's rows are read by many threads at once, where one thread a column reading a
// thousand rows one after another waited on each load in turn.
constexpr int kSliceColumns = 32, kSlices = 32;
// The sum over k in [0, rows) of column[k * stride], valid in the threads with threadIdx.y == 0.
// Every thread of the block calls it (it synchronizes); `active`: this thread has a column.
__device__ __forceinline__ float sliced_column_sum(const float* column, int64_t stride,
                                                   int64_t rows, bool active,
                                                   float (*shared)[kSliceColumns + 1]) {
  float acc = 0.f;
  if (active)
    for (int64_t k = threadIdx.y; k < rows; k += kSlices) acc += column[k * stride];
  shared[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  float total = 0.f;
  if (threadIdx.y == 0)
    for (int y = 0; y < kSlices; ++y) total += shared[y][threadIdx.x];
  __syncthreads();  // `shared` may be reused by the next call
  return total;
}

// Memory-bound kernels reach the device's bandwidth only with wide accesses: kPack consecutive
// elements move as one 16-byte access (bf16) or two (float). A kernel takes the packed path
// where its pointers are pack-aligned (pack_count) and finishes any tail element by element.
constexpr int kPack = 8;
template <class T> struct alignas(kPack * sizeof(T)) Pack {
  T v[kPack];
};
template <class T> __device__ __forceinline__ Pack<T> load_pack(const T* p, int64_t pack) {
  return reinterpret_cast<const Pack<T>*>(p)[pack];
}
template <class T> __device__ __forceinline__ void store_pack(T* p, int64_t pack, const Pack<T>& x) {
  reinterpret_cast<Pack<T>*>(p)[pack] = x;
}
template <class T> inline bool pack_aligned(const T* p) {
  return reinterpret_cast<uintptr_t>(p) % sizeof(Pack<T>) == 0;
}
// f(c, x_c) for lane `lane`'s share of a row's channels, read as whole packs (packed: C a
// multiple of kPack, every pointer pack-aligned) or one by one: the norms' kernels of a warp per
// row (LayerNorm, RMSNorm).
template <class T, class F>
__device__ __forceinline__ void for_lane_channels(const T* row, int64_t C, bool packed, int lane,
                                                  F&& f) {
  if (packed) {
    for (int64_t p = lane; p < C / kPack; p += 32) {
      const Pack<T> x = load_pack(row, p);
#pragma unroll
      for (int k = 0; k < kPack; ++k) f(p * kPack + k, to_float(x.v[k]));
    }
  } else {
    for (int64_t c = lane; c < C; c += 32) f(c, to_float(row[c]));
  }
}

// The norms' input gradient as stored (LayerNorm, RMSNorm): the layer's own gradient, then (where the caller passes one) the residual
// path's gradient added as a separate rounding step, so the bits are those of storing dx and
// adding the residual afterwards (add_inplace), with no contraction into one fma.
template <class T>
__device__ __forceinline__ T dx_plus(float dx, float residual) {
  return from_float<T>(__fadd_rn(to_float(from_float<T>(dx)), residual));
}

template <class T>
__device__ __forceinline__ T dx_value(float dx, const T* residual, int64_t i) {
  return residual == nullptr ? from_float<T>(dx) : dx_plus<T>(dx, to_float(residual[i]));
}

// A grid-stride loop of i over [0, n).
#define MESHTRAIN_GRID_LOOP(i, n)                                                 \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (n); \
       i += int64_t{gridDim.x} * blockDim.x)

// Whole packs in n elements when every pointer is pack-aligned, else 0 (all element by element).
template <class... Ts> inline int64_t pack_count(int64_t n, const Ts*... pointers) {
  return (pack_aligned(pointers) && ...) ? n / kPack : 0;
}

// Blocks for a grid-stride loop over n elements: enough to fill the device several times over,
// never more than the elements need.
inline unsigned grid_for(int64_t n, int threads = kThreads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(blocks, 65536)));
}

}  // namespace meshtrain::cuda
