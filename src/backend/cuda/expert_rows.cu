// Token rows to their experts and back (backend.h, gather_rows and gathered_row_dots): FP32 math
// on float or bf16 storage, as the CPU backend's expert_rows.cpp.
//   gather_rows: a warp per output row, its lanes across the channels (whole packs where
//     aligned); each channel's sum runs over the row's K terms in order j, each product and sum
//     rounded on its own (no fma), the CPU's arithmetic, so fp32 rows match the CPU bit for bit.
//     Nothing is scattered: no atomics, the same bits on every run.
//   gathered_row_dots: a warp per (row, term), lanes striding the channels, then the warp's
//     fixed reduction tree.
// An index outside [-1, M) cannot be refused without the host waiting: its term is left out
// (backend.h).

#include "cuda_check.h"
#include "device_common.cuh"
#include "kernels.h"

namespace meshtrain::cuda {

namespace {

constexpr int kWarpsPerBlock = kThreads / 32;

unsigned warp_blocks(int64_t warps) {
  return static_cast<unsigned>((warps + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

__device__ __forceinline__ bool kept(int32_t m, int64_t M) { return m >= 0 && m < M; }

// acc = v for the first kept term, acc + v after it: starting from the first term rather than
// from zero keeps a copied -0 negative (dispatch copies rows exactly).
__device__ __forceinline__ float add_term(float acc, float v, bool first) {
  return first ? v : __fadd_rn(acc, v);
}

template <class T>
__global__ void gather_rows_kernel(T* out, const T* src, const int32_t* index,
                                   const float* weights, int64_t R, int64_t C, int64_t K,
                                   int64_t M, bool packed) {
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * int64_t{kWarpsPerBlock} + threadIdx.x / 32;
  if (row >= R) return;
  const int32_t* terms = index + row * K;
  const float* w = weights == nullptr ? nullptr : weights + row * K;
  T* y = out + row * C;
  if (packed) {
    for (int64_t p = lane; p < C / kPack; p += 32) {
      float acc[kPack];
#pragma unroll
      for (int k = 0; k < kPack; ++k) acc[k] = 0.f;
      bool first = true;
      for (int64_t j = 0; j < K; ++j) {
        const int32_t m = terms[j];
        if (!kept(m, M)) continue;
        const float wj = w == nullptr ? 1.f : w[j];
        const Pack<T> x = load_pack(src + m * C, p);
#pragma unroll
        for (int k = 0; k < kPack; ++k)
          acc[k] = add_term(acc[k], __fmul_rn(wj, to_float(x.v[k])), first);
        first = false;
      }
      Pack<T> yp;
#pragma unroll
      for (int k = 0; k < kPack; ++k) yp.v[k] = from_float<T>(acc[k]);
      store_pack(y, p, yp);
    }
  } else {
    for (int64_t c = lane; c < C; c += 32) {
      float acc = 0.f;
      bool first = true;
      for (int64_t j = 0; j < K; ++j) {
        const int32_t m = terms[j];
        if (!kept(m, M)) continue;
        const float wj = w == nullptr ? 1.f : w[j];
        acc = add_term(acc, __fmul_rn(wj, to_float(src[m * C + c])), first);
        first = false;
      }
      y[c] = from_float<T>(acc);
    }
  }
}

template <class T>
__global__ void gathered_row_dots_kernel(float* out, const T* a, const T* b, const int32_t* index,
                                         int64_t R, int64_t C, int64_t K, int64_t M,
                                         bool packed) {
  const int lane = threadIdx.x % 32;
  const int64_t pair = blockIdx.x * int64_t{kWarpsPerBlock} + threadIdx.x / 32;
  if (pair >= R * K) return;
  const int32_t m = index[pair];
  if (!kept(m, M)) {
    if (lane == 0) out[pair] = 0.f;
    return;
  }
  const T* x = a + (pair / K) * C;
  const T* y = b + m * C;
  float s = 0.f;
  if (packed) {
    for (int64_t p = lane; p < C / kPack; p += 32) {
      const Pack<T> xp = load_pack(x, p), yp = load_pack(y, p);
#pragma unroll
      for (int k = 0; k < kPack; ++k) s += to_float(xp.v[k]) * to_float(yp.v[k]);
    }
  } else {
    for (int64_t c = lane; c < C; c += 32) s += to_float(x[c]) * to_float(y[c]);
  }
  s = warp_sum(s);
  if (lane == 0) out[pair] = s;
}

}  // namespace

template <class T>
void gather_rows(T* out, const T* src, const int32_t* index, const float* weights, int64_t R,
                 int64_t C, int64_t K, int64_t M, cudaStream_t s) {
  if (R == 0 || C == 0) return;
  // Every source row is pack-aligned when the base is and C is whole packs.
  const bool packed = C % kPack == 0 && pack_count(C, out, src) > 0;
  gather_rows_kernel<<<warp_blocks(R), kThreads, 0, s>>>(out, src, index, weights, R, C, K, M,
                                                         packed);
  check_launch("gather_rows");
}

template <class T>
void gathered_row_dots(float* out, const T* a, const T* b, const int32_t* index, int64_t R,
                       int64_t C, int64_t K, int64_t M, cudaStream_t s) {
  if (R == 0) return;
  const bool packed = C % kPack == 0 && pack_count(C, a, b) > 0;
  gathered_row_dots_kernel<<<warp_blocks(R * K), kThreads, 0, s>>>(out, a, b, index, R, C, K, M,
                                                                   packed);
  check_launch("gathered_row_dots");
}

#define INSTANTIATE(T)                                                                        \
  template void gather_rows<T>(T*, const T*, const int32_t*, const float*, int64_t, int64_t,  \
                               int64_t, int64_t, cudaStream_t);                               \
  template void gathered_row_dots<T>(float*, const T*, const T*, const int32_t*, int64_t,     \
                                     int64_t, int64_t, int64_t, cudaStream_t);
INSTANTIATE(float)
INSTANTIATE(bf16)
#undef INSTANTIATE

}  // namespace meshtrain::cuda
