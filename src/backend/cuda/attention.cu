// Row kernels of the backend's own causal attention (the GEMMs around them are cuBLASLt calls in
// attention.cpp). One warp per score row; row r is query i = r % T and sees keys j <= i:
//   P_ij  = exp(S_ij - max_j S_ij) / sum_j exp(S_ij - max_j S_ij)   (S already scaled)
//   dS_ij = P_ij (dP_ij - sum_k P_ik dP_ik) * scale
// Entries above the diagonal are written as zeros, so the GEMMs that follow may run over full
// T x T tiles. FP32 math throughout; probs may be bf16.

#include <cfloat>

#include "cuda_check.h"
#include "device_common.cuh"
#include "kernels.h"

namespace meshtrain::cuda {

namespace {

constexpr int kRowsPerBlock = kThreads / 32;

template <class T>
__global__ void causal_softmax_forward_kernel(T* probs, const float* scores, int64_t rows,
                                              int64_t T_) {
  const int lane = threadIdx.x % 32;
  const int64_t r = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.x / 32;
  if (r >= rows) return;
  const int64_t i = r % T_;
  const float* s = scores + r * T_;
  T* p = probs + r * T_;
  float m = -FLT_MAX;
  for (int64_t j = lane; j <= i; j += 32) m = fmaxf(m, s[j]);
  m = warp_max(m);
  float z = 0.f;
  for (int64_t j = lane; j <= i; j += 32) z += expf(s[j] - m);
  const float inv = 1.f / warp_sum(z);
  // Reading s[j] before writing p[j] in the same thread keeps the in-place (float) case correct.
  for (int64_t j = lane; j < T_; j += 32)
    p[j] = from_float<T>(j <= i ? expf(s[j] - m) * inv : 0.f);
}

template <class T>
__global__ void causal_softmax_backward_kernel(T* dscores, const T* probs, const float* dprobs,
                                               int64_t rows, int64_t T_, float scale) {
  const int lane = threadIdx.x % 32;
  const int64_t r = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.x / 32;
  if (r >= rows) return;
  const int64_t i = r % T_;
  const T* p = probs + r * T_;
  const float* dp = dprobs + r * T_;
  T* ds = dscores + r * T_;
  float dot = 0.f;
  for (int64_t j = lane; j <= i; j += 32) dot += to_float(p[j]) * dp[j];
  dot = warp_sum(dot);
  for (int64_t j = lane; j < T_; j += 32)
    ds[j] = from_float<T>(j <= i ? to_float(p[j]) * (dp[j] - dot) * scale : 0.f);
}

__global__ void narrow_rows_kernel(bf16* dst, int64_t ld_dst, const float* src, int64_t rows,
                                   int64_t cols) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= rows * cols) return;
  dst[(i / cols) * ld_dst + i % cols] = from_float<bf16>(src[i]);
}

unsigned row_blocks(int64_t rows) {
  return static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
}

}  // namespace

template <class T>
void causal_softmax_forward(T* probs, const float* scores, int64_t rows, int64_t T_, cudaStream_t s) {
  if (rows == 0) return;
  causal_softmax_forward_kernel<<<row_blocks(rows), kThreads, 0, s>>>(probs, scores, rows, T_);
  check_launch("attention_forward");
}

template <class T>
void causal_softmax_backward(T* dscores, const T* probs, const float* dprobs, int64_t rows,
                             int64_t T_, float scale, cudaStream_t s) {
  if (rows == 0) return;
  causal_softmax_backward_kernel<<<row_blocks(rows), kThreads, 0, s>>>(dscores, probs, dprobs,
                                                                       rows, T_, scale);
  check_launch("attention_backward");
}

void narrow_rows(bf16* dst, int64_t ld_dst, const float* src, int64_t rows, int64_t cols,
                 cudaStream_t s) {
  const int64_t n = rows * cols;
  if (n == 0) return;
  narrow_rows_kernel<<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0, s>>>(
      dst, ld_dst, src, rows, cols);
  check_launch("attention_backward");
}

template void causal_softmax_forward<float>(float*, const float*, int64_t, int64_t, cudaStream_t);
template void causal_softmax_forward<bf16>(bf16*, const float*, int64_t, int64_t, cudaStream_t);
template void causal_softmax_backward<float>(float*, const float*, const float*, int64_t, int64_t,
                                             float, cudaStream_t);
template void causal_softmax_backward<bf16>(bf16*, const bf16*, const float*, int64_t, int64_t,
                                            float, cudaStream_t);

}  // namespace meshtrain::cuda
