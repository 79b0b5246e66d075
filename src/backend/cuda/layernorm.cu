// LayerNorm (Ba et al., arXiv 1607.06450) over the last dimension, eps = 1e-5, FP32 math:
//   mean = sum_c x_c / C,  rstd = 1 / sqrt(sum_c (x_c - mean)^2 / C + eps)
//   y_c  = (x_c - mean) * rstd * w_c + b_c
// Backward, with n_c = (x_c - mean) * rstd and g_c = dy_c * w_c:
//   dx_c = rstd * (g_c - mean(g) - n_c * mean(g * n))   (assigned; plus the residual path's
//                                                         gradient where one is passed)
//   dw_c += sum_rows dy_c n_c,  db_c += sum_rows dy_c     (accumulated)
// Forward and dx: one warp per row. dw/db: one thread per channel over fixed row chunks, then
// the chunks in a fixed order (sliced_column_sum) — no atomics, so the gradients are bitwise
// repeatable. Rows of at most 1024 channels take one fused pass (a warp per row chunk) instead
// of the dx and dw/db passes.

#include "cuda_check.h"
#include "device_common.cuh"
#include "kernels.h"

namespace meshtrain::cuda {

namespace {

constexpr float kEps = 1e-5f;
constexpr int kRowsPerBlock = kThreads / 32;
// Row chunks for the parameter gradients: enough work for the one-pass kernel (a warp a chunk):
// 2048 chunks for 64k rows, about 15 warps for each multiprocessor of an H100, run in two
// waves at that kernel's register count.
constexpr int64_t kMaxRowChunks = 4096;

template <class T>
__global__ void layernorm_forward_kernel(T* out, float* mean, float* rstd, const T* inp,
                                         const T* weight, const T* bias, int64_t N, int64_t C,
                                         bool packed) {
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.x / 32;
  if (row >= N) return;
  const T* x = inp + row * C;
  float s = 0.f;
  for_lane_channels(x, C, packed, lane, [&](int64_t, float v) { s += v; });
  const float m = warp_sum(s) / static_cast<float>(C);
  float v = 0.f;
  for_lane_channels(x, C, packed, lane, [&](int64_t, float xc) { v += (xc - m) * (xc - m); });
  const float r = rsqrtf(warp_sum(v) / static_cast<float>(C) + kEps);
  T* y = out + row * C;
  if (packed) {
    for (int64_t p = lane; p < C / kPack; p += 32) {
      const Pack<T> xp = load_pack(x, p), w = load_pack(weight, p), b = load_pack(bias, p);
      Pack<T> yp;
#pragma unroll
      for (int k = 0; k < kPack; ++k)
        yp.v[k] = from_float<T>((to_float(xp.v[k]) - m) * r * to_float(w.v[k]) + to_float(b.v[k]));
      store_pack(y, p, yp);
    }
  } else {
    for (int64_t c = lane; c < C; c += 32)
      y[c] = from_float<T>((to_float(x[c]) - m) * r * to_float(weight[c]) + to_float(bias[c]));
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

template <class T>
__global__ void layernorm_dinp_kernel(T* dinp, const T* dout, const T* inp, const T* weight,
                                      const T* residual, const float* mean, const float* rstd,
                                      int64_t N, int64_t C, bool packed) {
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.x / 32;
  if (row >= N) return;
  const T* x = inp + row * C;
  const T* dy = dout + row * C;
  T* dx = dinp + row * C;
  const float m = mean[row], r = rstd[row];
  float g_sum = 0.f, gn_sum = 0.f;
  if (packed) {
    for (int64_t p = lane; p < C / kPack; p += 32) {
      const Pack<T> xp = load_pack(x, p), dyp = load_pack(dy, p), w = load_pack(weight, p);
#pragma unroll
      for (int k = 0; k < kPack; ++k) {
        const float g = to_float(dyp.v[k]) * to_float(w.v[k]);
        g_sum += g;
        gn_sum += g * (to_float(xp.v[k]) - m) * r;
      }
    }
  } else {
    for (int64_t c = lane; c < C; c += 32) {
      const float g = to_float(dy[c]) * to_float(weight[c]);
      g_sum += g;
      gn_sum += g * (to_float(x[c]) - m) * r;
    }
  }
  const float g_mean = warp_sum(g_sum) / static_cast<float>(C);
  const float gn_mean = warp_sum(gn_sum) / static_cast<float>(C);
  if (packed) {
    for (int64_t p = lane; p < C / kPack; p += 32) {
      const Pack<T> xp = load_pack(x, p), dyp = load_pack(dy, p), w = load_pack(weight, p);
      Pack<T> dxp;
#pragma unroll
      for (int k = 0; k < kPack; ++k) {
        const float n = (to_float(xp.v[k]) - m) * r;
        dxp.v[k] = dx_value(r * (to_float(dyp.v[k]) * to_float(w.v[k]) - g_mean - n * gn_mean),
                            residual, row * C + p * kPack + k);
      }
      store_pack(dx, p, dxp);
    }
  } else {
    for (int64_t c = lane; c < C; c += 32) {
      const float n = (to_float(x[c]) - m) * r;
      dx[c] = dx_value(r * (to_float(dy[c]) * to_float(weight[c]) - g_mean - n * gn_mean),
                       residual, row * C + c);
    }
  }
}

int64_t rows_per_chunk(int64_t N) {
  return std::max<int64_t>(32, (N + kMaxRowChunks - 1) / kMaxRowChunks);
}

// partials (chunks, 2, C): per row chunk, sum dy*n and sum dy for each channel.
template <class T>
__global__ void layernorm_dparams_partials_kernel(float* partials, const T* dout, const T* inp,
                                                  const float* mean, const float* rstd, int64_t N,
                                                  int64_t C, int64_t rows) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= C) return;
  const int64_t r0 = blockIdx.y * rows;
  const int64_t r1 = r0 + rows < N ? r0 + rows : N;
  float dw = 0.f, db = 0.f;
  for (int64_t r = r0; r < r1; ++r) {
    const float dy = to_float(dout[r * C + c]);
    dw += dy * (to_float(inp[r * C + c]) - mean[r]) * rstd[r];
    db += dy;
  }
  partials[(blockIdx.y * 2) * C + c] = dw;
  partials[(blockIdx.y * 2 + 1) * C + c] = db;
}

// The whole backward in one pass over x and dy, for rows of whole packs with at most
// kMaxLanePacks packs per lane (C <= 1024): warp k takes row chunk k (the partials kernel's
// chunks), keeps each row's packs in registers for dx, and sums dw, db per channel over its rows
// in row order, as the partials kernel does; the chunks then combine in order (final kernel).
// A warp has few rows and the two warp sums stall each one, so the next row's packs are loaded
// before this row computes: its loads are in flight meanwhile. P, the packs a lane
// holds, is a template argument so that the registers fit the row (C = 768: 3 of 4), and blocks
// are small, so that several fit on a multiprocessor at this kernel's register count.
constexpr int kMaxLanePacks = 4;
constexpr int kFusedThreads = 128;

template <class T, int P>
struct LaneRow {
  Pack<T> x[P], dy[P];
  float mean, rstd;
};

template <class T, int P>
__global__ void __launch_bounds__(kFusedThreads)
    layernorm_backward_fused_kernel(T* dinp, float* partials, const T* dout, const T* inp,
                                    const T* weight, const T* residual, const float* mean,
                                    const float* rstd, int64_t N, int64_t C, int64_t rows,
                                    int64_t chunks) {
  const int lane = threadIdx.x % 32;
  const int64_t chunk = blockIdx.x * int64_t{kFusedThreads / 32} + threadIdx.x / 32;
  if (chunk >= chunks) return;
  const int64_t packs = C / kPack;
  float dw[P][kPack] = {}, db[P][kPack] = {};
  Pack<T> w[P];
#pragma unroll
  for (int i = 0; i < P; ++i)
    if (lane + 32 * i < packs) w[i] = load_pack(weight, lane + 32 * i);
  const int64_t r0 = chunk * rows;
  const int64_t r1 = (chunk + 1) * rows < N ? (chunk + 1) * rows : N;
  // One row from its registers: dx stored, dw and db accumulated.
  const auto process = [&](const LaneRow<T, P>& cur, int64_t row) {
    // The residual's packs are read here, not a row ahead (registers): the warp sums below
    // give their loads time.
    Pack<T> res[P];
#pragma unroll
    for (int i = 0; i < P; ++i)
      if (residual != nullptr && lane + 32 * i < packs) res[i] = load_pack(residual + row * C, lane + 32 * i);
    const float m = cur.mean, r = cur.rstd;
    float g_sum = 0.f, gn_sum = 0.f;
#pragma unroll
    for (int i = 0; i < P; ++i) {
      if (lane + 32 * i >= packs) continue;
#pragma unroll
      for (int k = 0; k < kPack; ++k) {
        const float g = to_float(cur.dy[i].v[k]) * to_float(w[i].v[k]);
        g_sum += g;
        gn_sum += g * (to_float(cur.x[i].v[k]) - m) * r;
      }
    }
    const float g_mean = warp_sum(g_sum) / static_cast<float>(C);
    const float gn_mean = warp_sum(gn_sum) / static_cast<float>(C);
#pragma unroll
    for (int i = 0; i < P; ++i) {
      if (lane + 32 * i >= packs) continue;
      Pack<T> dxp;
#pragma unroll
      for (int k = 0; k < kPack; ++k) {
        const float n = (to_float(cur.x[i].v[k]) - m) * r, d = to_float(cur.dy[i].v[k]);
        const float dx = r * (d * to_float(w[i].v[k]) - g_mean - n * gn_mean);
        dxp.v[k] = residual == nullptr ? from_float<T>(dx) : dx_plus<T>(dx, to_float(res[i].v[k]));
        dw[i][k] += d * n;
        db[i][k] += d;
      }
      store_pack(dinp + row * C, lane + 32 * i, dxp);
    }
  };
  // Two row buffers taking turns, with no copies between them (a copy would wait for the loads
  // it copies): while one row computes, the other's loads are in flight.
  const auto load = [&](LaneRow<T, P>& into, int64_t row) {
    into.mean = mean[row];
    into.rstd = rstd[row];
#pragma unroll
    for (int i = 0; i < P; ++i) {
      if (lane + 32 * i >= packs) continue;
      into.x[i] = load_pack(inp + row * C, lane + 32 * i);
      into.dy[i] = load_pack(dout + row * C, lane + 32 * i);
    }
  };
  LaneRow<T, P> even, odd;
  if (r0 < r1) load(even, r0);
  for (int64_t row = r0; row < r1; row += 2) {
    if (row + 1 < r1) load(odd, row + 1);
    process(even, row);
    if (row + 2 < r1) load(even, row + 2);
    if (row + 1 < r1) process(odd, row + 1);
  }
#pragma unroll
  for (int i = 0; i < P; ++i) {
    if (lane + 32 * i >= packs) continue;
#pragma unroll
    for (int k = 0; k < kPack; ++k) {
      const int64_t c = (lane + 32 * i) * int64_t{kPack} + k;
      partials[(chunk * 2) * C + c] = dw[i][k];
      partials[(chunk * 2 + 1) * C + c] = db[i][k];
    }
  }
}

template <class T, int P>
void launch_fused_backward(T* dinp, float* partials, const T* dout, const T* inp, const T* weight,
                           const T* residual, const float* mean, const float* rstd, int64_t N,
                           int64_t C, int64_t rows, int64_t chunks, cudaStream_t s) {
  constexpr int64_t warps = kFusedThreads / 32;
  layernorm_backward_fused_kernel<T, P><<<static_cast<unsigned>((chunks + warps - 1) / warps),
                                          kFusedThreads, 0, s>>>(
      dinp, partials, dout, inp, weight, residual, mean, rstd, N, C, rows, chunks);
}

__global__ void layernorm_dparams_final_kernel(float* dweight, float* dbias, const float* partials,
                                               int64_t chunks, int64_t C) {
  __shared__ float shared[kSlices][kSliceColumns + 1];
  const int64_t c = blockIdx.x * int64_t{kSliceColumns} + threadIdx.x;
  const bool active = c < C;
  const float* column = partials + (active ? c : 0);
  const float dw = sliced_column_sum(column, 2 * C, chunks, active, shared);
  const float db = sliced_column_sum(column + C, 2 * C, chunks, active, shared);
  if (active && threadIdx.y == 0) {
    dweight[c] += dw;
    dbias[c] += db;
  }
}

unsigned row_blocks(int64_t N) {
  return static_cast<unsigned>((N + kRowsPerBlock - 1) / kRowsPerBlock);
}

}  // namespace

template <class T>
void layernorm_forward(T* out, float* mean, float* rstd, const T* inp, const T* weight,
                       const T* bias, int64_t N, int64_t C, cudaStream_t s) {
  if (N == 0) return;
  const bool packed = C % kPack == 0 && pack_count(C, out, inp, weight, bias) > 0;
  layernorm_forward_kernel<<<row_blocks(N), kThreads, 0, s>>>(out, mean, rstd, inp, weight, bias,
                                                              N, C, packed);
  check_launch("layernorm_forward");
}

int64_t layernorm_backward_scratch(int64_t N, int64_t C) {
  const int64_t rows = rows_per_chunk(N);
  return std::max<int64_t>(1, (N + rows - 1) / rows * 2 * C);
}

template <class T>
void layernorm_backward(T* dinp, float* dweight, float* dbias, const T* dout, const T* inp,
                        const T* weight, const T* residual, const float* mean, const float* rstd,
                        int64_t N, int64_t C, float* scratch, cudaStream_t s) {
  if (N == 0 || C == 0) return;
  const bool packed = C % kPack == 0 && pack_count(C, dinp, dout, inp, weight) > 0 &&
                      (residual == nullptr || pack_count(C, residual) > 0);
  const int64_t rows = rows_per_chunk(N);
  const int64_t chunks = (N + rows - 1) / rows;
  const unsigned col_blocks = static_cast<unsigned>((C + kThreads - 1) / kThreads);
  if (packed && C / kPack <= 32 * kMaxLanePacks) {
    const int64_t lane_packs = (C / kPack + 31) / 32;
    const auto launch = lane_packs <= 1 ? launch_fused_backward<T, 1>
                        : lane_packs == 2 ? launch_fused_backward<T, 2>
                        : lane_packs == 3 ? launch_fused_backward<T, 3>
                                          : launch_fused_backward<T, 4>;
    launch(dinp, scratch, dout, inp, weight, residual, mean, rstd, N, C, rows, chunks, s);
    check_launch("layernorm_backward");
  } else {
    layernorm_dinp_kernel<<<row_blocks(N), kThreads, 0, s>>>(dinp, dout, inp, weight, residual,
                                                             mean, rstd, N, C, packed);
    check_launch("layernorm_backward");
    layernorm_dparams_partials_kernel<<<dim3(col_blocks, static_cast<unsigned>(chunks)), kThreads,
                                        0, s>>>(scratch, dout, inp, mean, rstd, N, C, rows);
    check_launch("layernorm_backward");
  }
  layernorm_dparams_final_kernel<<<static_cast<unsigned>((C + kSliceColumns - 1) / kSliceColumns),
                                  dim3(kSliceColumns, kSlices), 0, s>>>(dweight, dbias, scratch,
                                                                        chunks, C);
  check_launch("layernorm_backward");
}

#define INSTANTIATE(T)                                                                         \
  template void layernorm_forward<T>(T*, float*, float*, const T*, const T*, const T*, int64_t, \
                                     int64_t, cudaStream_t);                                   \
  template void layernorm_backward<T>(T*, float*, float*, const T*, const T*, const T*,        \
                                      const T*, const float*, const float*, int64_t, int64_t,  \
                                      float*, cudaStream_t);
INSTANTIATE(float)
INSTANTIATE(bf16)
#undef INSTANTIATE

}  // namespace meshtrain::cuda
