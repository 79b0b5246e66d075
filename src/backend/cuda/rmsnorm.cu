// The Llama-family kernels, FP32 math on float or bf16 storage (the CPU backend's rmsnorm.cpp,
// swiglu.cpp and rotary.cpp state the formulas):
//   RMSNorm: a warp per row for the forward pass and the input gradient (with the residual path's
//     gradient added as its own rounding step, as LayerNorm's); dweight by row chunks, a thread
//     per channel, then the chunks in a fixed order: no atomics, bitwise repeatable.
//   SwiGLU: elementwise, packed where aligned (rows and the RMSNorm input gradient too).
//   Rotary: a thread per channel pair, in place; a position outside the table writes NaN into
//     its row's heads (backend.h), since the device cannot refuse it without the host waiting.

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

__device__ __forceinline__ float sigmoid(float g) { return 1.f / (1.f + expf(-g)); }

template <class T>
__global__ void swiglu_forward_kernel(T* out, const T* gate, const T* up, int64_t n,
                                      int64_t packs) {
  MESHTRAIN_GRID_LOOP(p, packs) {
    const Pack<T> g = load_pack(gate, p), u = load_pack(up, p);
    Pack<T> y;
#pragma unroll
    for (int k = 0; k < kPack; ++k) {
      const float gk = to_float(g.v[k]);
      y.v[k] = from_float<T>(gk * sigmoid(gk) * to_float(u.v[k]));
    }
    store_pack(out, p, y);
  }
  MESHTRAIN_GRID_LOOP(i, n - packs * kPack) {
    const int64_t j = packs * kPack + i;
    const float g = to_float(gate[j]);
    out[j] = from_float<T>(g * sigmoid(g) * to_float(up[j]));
  }
}

// dgate and dup of one element.
__device__ __forceinline__ void swiglu_grads(float& dgate, float& dup, float dy, float g, float u) {
  const float s = sigmoid(g);
  dgate = dy * u * (s * (1.f + g * (1.f - s)));
  dup = dy * (g * s);
}

template <class T>
__global__ void swiglu_backward_kernel(T* dgate, T* dup, const T* dout, const T* gate, const T* up,
                                       int64_t n, int64_t packs) {
  MESHTRAIN_GRID_LOOP(p, packs) {
    const Pack<T> dy = load_pack(dout, p), g = load_pack(gate, p), u = load_pack(up, p);
    Pack<T> dg, du;
#pragma unroll
    for (int k = 0; k < kPack; ++k) {
      float a, b;
      swiglu_grads(a, b, to_float(dy.v[k]), to_float(g.v[k]), to_float(u.v[k]));
      dg.v[k] = from_float<T>(a);
      du.v[k] = from_float<T>(b);
    }
    store_pack(dgate, p, dg);
    store_pack(dup, p, du);
  }
  MESHTRAIN_GRID_LOOP(i, n - packs * kPack) {
    const int64_t j = packs * kPack + i;
    float a, b;
    swiglu_grads(a, b, to_float(dout[j]), to_float(gate[j]), to_float(up[j]));
    dgate[j] = from_float<T>(a);
    dup[j] = from_float<T>(b);
  }
}

template <class T>
__global__ void rotary_kernel(T* x, const int32_t* positions, const float* cos, const float* sin,
                              int64_t N, int64_t W, int64_t column, int64_t heads, int64_t half,
                              int64_t P, float sign) {
  MESHTRAIN_GRID_LOOP(k, N * heads * half) {
    const int64_t i = k % half, h = (k / half) % heads, n = k / (half * heads);
    T* head = x + n * W + column + h * 2 * half;
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

template <class T> void swiglu_forward(T* out, const T* gate, const T* up, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  const int64_t packs = pack_count(n, out, gate, up);
  swiglu_forward_kernel<<<grid_for(packs > 0 ? packs : n), kThreads, 0, s>>>(out, gate, up, n,
                                                                             packs);
  check_launch("swiglu_forward");
}

template <class T>
void swiglu_backward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t n,
                     cudaStream_t s) {
  if (n == 0) return;
  const int64_t packs = pack_count(n, dgate, dup, dout, gate, up);
  swiglu_backward_kernel<<<grid_for(packs > 0 ? packs : n), kThreads, 0, s>>>(dgate, dup, dout,
                                                                               gate, up, n, packs);
  check_launch("swiglu_backward");
}

template <class T>
void rotary(T* x, const int32_t* positions, const float* cos, const float* sin, int64_t N,
            int64_t W, int64_t column, int64_t heads, int64_t head_dim, int64_t P,
            bool by_minus_angle, cudaStream_t s) {
  const int64_t pairs = N * heads * (head_dim / 2);
  if (pairs == 0) return;
  rotary_kernel<<<grid_for(pairs), kThreads, 0, s>>>(x, positions, cos, sin, N, W, column, heads,
                                                     head_dim / 2, P, by_minus_angle ? -1.f : 1.f);
  check_launch(by_minus_angle ? "rotary_backward" : "rotary_forward");
}

#define INSTANTIATE(T)                                                                          \
  template void rmsnorm_forward<T>(T*, float*, const T*, const T*, double, int64_t, int64_t,    \
                                   cudaStream_t);                                               \
  template void rmsnorm_backward<T>(T*, float*, const T*, const T*, const T*, const T*,         \
                                    const float*, int64_t, int64_t, float*, cudaStream_t);      \
  template void swiglu_forward<T>(T*, const T*, const T*, int64_t, cudaStream_t);               \
  template void swiglu_backward<T>(T*, T*, const T*, const T*, const T*, int64_t, cudaStream_t); \
  template void rotary<T>(T*, const int32_t*, const float*, const float*, int64_t, int64_t,     \
                          int64_t, int64_t, int64_t, int64_t, bool, cudaStream_t);
INSTANTIATE(float)
INSTANTIATE(bf16)
#undef INSTANTIATE

}  // namespace meshtrain::cuda
