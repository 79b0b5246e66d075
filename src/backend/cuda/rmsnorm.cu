// RMSNorm, FP32 math on float or bf16 storage (the CPU backend's rmsnorm.cpp states the
// formulas): a warp per row for the forward pass and the input gradient (with the residual
// path's gradient added as its own rounding step, as LayerNorm's), packed where rows are
// aligned; dweight by row chunks, a thread per channel, then the chunks in a fixed order: no
// atomics, bitwise repeatable.

#include "cuda_check.h"
#include "device_common.cuh"
#include "kernels.h"

namespace meshtrain::cuda {

namespace {

constexpr int kRowsPerBlock = kThreads / 32;
// Row chunks of the dweight partials: enough chunks (blocks of the partials kernel along y) to
// fill the device for C of a few hundred columns, few enough that the final pass over
// (chunks, C) stays small beside the (N, C) reads.
constexpr int64_t kMaxRowChunks = 1024;

unsigned row_blocks(int64_t N) {
  return static_cast<unsigned>((N + kRowsPerBlock - 1) / kRowsPerBlock);
}
int64_t rows_per_chunk(int64_t N) {
  return std::max<int64_t>(32, (N + kMaxRowChunks - 1) / kMaxRowChunks);
}

template <class T>
__global__ void rmsnorm_forward_kernel(T* out, float* rstd, const T* inp, const T* weight,
                                       double eps, int64_t N, int64_t C, bool packed) {
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.x / 32;
  if (row >= N) return;
  const T* x = inp + row * C;
  float s = 0.f;
  for_lane_channels(x, C, packed, lane, [&](int64_t, float v) { s += v * v; });
  // The root in double, rounded once, as the CPU backend takes it: one per row costs nothing.
  const float r = static_cast<float>(
      1.0 / sqrt(static_cast<double>(warp_sum(s) / static_cast<float>(C)) + eps));
  T* y = out + row * C;
  if (packed) {
    for (int64_t p = lane; p < C / kPack; p += 32) {
      const Pack<T> xp = load_pack(x, p), w = load_pack(weight, p);
      Pack<T> yp;
#pragma unroll
      for (int k = 0; k < kPack; ++k) yp.v[k] = from_float<T>(to_float(xp.v[k]) * r * to_float(w.v[k]));
      store_pack(y, p, yp);
    }
  } else {
    for (int64_t c = lane; c < C; c += 32) y[c] = from_float<T>(to_float(x[c]) * r * to_float(weight[c]));
  }
  if (lane == 0) rstd[row] = r;
}

template <class T>
__global__ void rmsnorm_dinp_kernel(T* dinp, const T* dout, const T* inp, const T* weight,
                                    const T* residual, const float* rstd, int64_t N, int64_t C,
                                    bool packed) {
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.x / 32;
  if (row >= N) return;
  const T* x = inp + row * C;
  const T* dy = dout + row * C;
  T* dx = dinp + row * C;
  const float r = rstd[row];
  float gn_sum = 0.f;
  if (packed) {
    for (int64_t p = lane; p < C / kPack; p += 32) {
      const Pack<T> xp = load_pack(x, p), dyp = load_pack(dy, p), w = load_pack(weight, p);
#pragma unroll
      for (int k = 0; k < kPack; ++k)
        gn_sum += to_float(dyp.v[k]) * to_float(w.v[k]) * (to_float(xp.v[k]) * r);
    }
  } else {
    for (int64_t c = lane; c < C; c += 32)
      gn_sum += to_float(dy[c]) * to_float(weight[c]) * (to_float(x[c]) * r);
  }
  const float gn_mean = warp_sum(gn_sum) / static_cast<float>(C);
  if (packed) {
    for (int64_t p = lane; p < C / kPack; p += 32) {
      const Pack<T> xp = load_pack(x, p), dyp = load_pack(dy, p), w = load_pack(weight, p);
      Pack<T> dxp;
#pragma unroll
      for (int k = 0; k < kPack; ++k) {
        const float n = to_float(xp.v[k]) * r;
        dxp.v[k] = dx_value(r * (to_float(dyp.v[k]) * to_float(w.v[k]) - n * gn_mean), residual,
                            row * C + p * kPack + k);
      }
      store_pack(dx, p, dxp);
    }
  } else {
    for (int64_t c = lane; c < C; c += 32) {
      const float n = to_float(x[c]) * r;
      dx[c] = dx_value(r * (to_float(dy[c]) * to_float(weight[c]) - n * gn_mean), residual,
                       row * C + c);
    }
  }
}

// partials (chunks, C): per row chunk, sum over its rows of dy * x * rstd for each channel.
template <class T>
__global__ void rmsnorm_dweight_partials_kernel(float* partials, const T* dout, const T* inp,
                                                const float* rstd, int64_t N, int64_t C,
                                                int64_t rows) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= C) return;
  const int64_t r0 = blockIdx.y * rows;
  const int64_t r1 = r0 + rows < N ? r0 + rows : N;
  float dw = 0.f;
  for (int64_t r = r0; r < r1; ++r) dw += to_float(dout[r * C + c]) * (to_float(inp[r * C + c]) * rstd[r]);
  partials[blockIdx.y * C + c] = dw;
}

__global__ void rmsnorm_dweight_final_kernel(float* dweight, const float* partials, int64_t chunks,
                                             int64_t C) {
  __shared__ float shared[kSlices][kSliceColumns + 1];
  const int64_t c = blockIdx.x * int64_t{kSliceColumns} + threadIdx.x;
  const bool active = c < C;
  const float dw = sliced_column_sum(partials + (active ? c : 0), C, chunks, active, shared);
  if (active && threadIdx.y == 0) dweight[c] += dw;
}

}  // namespace

template <class T>
void rmsnorm_forward(T* out, float* rstd, const T* inp, const T* weight, double eps, int64_t N,
                     int64_t C, cudaStream_t s) {
  if (N == 0) return;
  const bool packed = C % kPack == 0 && pack_count(C, out, inp, weight) > 0;
  rmsnorm_forward_kernel<<<row_blocks(N), kThreads, 0, s>>>(out, rstd, inp, weight, eps, N, C,
                                                            packed);
  check_launch("rmsnorm_forward");
}

int64_t rmsnorm_backward_scratch(int64_t N, int64_t C) {
  const int64_t rows = rows_per_chunk(N);
  return std::max<int64_t>(1, (N + rows - 1) / rows * C);
}

template <class T>
void rmsnorm_backward(T* dinp, float* dweight, const T* dout, const T* inp, const T* weight,
                      const T* residual, const float* rstd, int64_t N, int64_t C, float* scratch,
                      cudaStream_t s) {
  if (N == 0 || C == 0) return;
  const bool packed = C % kPack == 0 && pack_count(C, dinp, dout, inp, weight) > 0 &&
                      (residual == nullptr || pack_count(C, residual) > 0);
  rmsnorm_dinp_kernel<<<row_blocks(N), kThreads, 0, s>>>(dinp, dout, inp, weight, residual, rstd,
                                                         N, C, packed);
  check_launch("rmsnorm_backward");
  const int64_t rows = rows_per_chunk(N);
  const int64_t chunks = (N + rows - 1) / rows;
  const unsigned col_blocks = static_cast<unsigned>((C + kThreads - 1) / kThreads);
  rmsnorm_dweight_partials_kernel<<<dim3(col_blocks, static_cast<unsigned>(chunks)), kThreads, 0,
                                    s>>>(scratch, dout, inp, rstd, N, C, rows);
  check_launch("rmsnorm_backward");
  rmsnorm_dweight_final_kernel<<<static_cast<unsigned>((C + kSliceColumns - 1) / kSliceColumns),
                                 dim3(kSliceColumns, kSlices), 0, s>>>(dweight, scratch, chunks, C);
  check_launch("rmsnorm_backward");
}

#define INSTANTIATE(T)                                                                          \
  template void rmsnorm_forward<T>(T*, float*, const T*, const T*, double, int64_t, int64_t,    \
                                   cudaStream_t);                                               \
  template void rmsnorm_backward<T>(T*, float*, const T*, const T*, const T*, const T*,         \
                                    const float*, int64_t, int64_t, float*, cudaStream_t);
INSTANTIATE(float)
INSTANTIATE(bf16)
#undef INSTANTIATE

}  // namespace meshtrain::cuda
