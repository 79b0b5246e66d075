// Softmax cross-entropy over this rank's vocabulary slice, FP32 math on fp32 or bf16 logits (see
// src/backend/cpu/cross_entropy.cpp for the vocabulary-parallel scheme, after Megatron's
// vocab-parallel cross-entropy, arXiv 1909.08053):
//   stats:    row_max_i, row_sumexp_i = sum_j exp(l_ij - row_max_i)     (one block per row)
//   losses:   log(sumexp_i) + max_i - target_logit_i
//   backward: dl_ij = (exp(l_ij - max_i) / sumexp_i - [j == target_i]) * dloss   (in place ok)
// The statistics use the online max/sum recurrence (Milakov & Gimelshein, arXiv 1805.02867) in
// one pass per thread, then a fixed-order block combine.

#include <cfloat>

#include "cuda_check.h"
#include "device_common.cuh"
#include "kernels.h"

namespace meshtrain::cuda {

namespace {

constexpr int kRowThreads = 512;

struct MaxSum {
  float m, s;
};

__device__ __forceinline__ MaxSum combine(MaxSum a, MaxSum b) {
  if (a.s == 0.f) return b;  // an empty part (no elements seen) contributes nothing
  if (b.s == 0.f) return a;
  const float m = fmaxf(a.m, b.m);
  return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}

// One pack of a row folded into a running (max, sum): its max first, then one rescale.
template <class T> __device__ __forceinline__ MaxSum fold(MaxSum acc, const Pack<T>& x) {
  float m = acc.m;
#pragma unroll
  for (int k = 0; k < kPack; ++k) m = fmaxf(m, to_float(x.v[k]));
  float s = acc.s * expf(acc.m - m);
#pragma unroll
  for (int k = 0; k < kPack; ++k) s += expf(to_float(x.v[k]) - m);
  return {m, s};
}

// A row's (max, sum of exp) over the block, in a fixed order: each thread folds its elements,
// then lanes combine by butterfly and warps in index order. Every thread gets the result.
// packed: V is a multiple of kPack and the row pack-aligned, so the row is whole packs.
template <class T>
__device__ MaxSum row_stats(const T* l, int64_t V, bool packed, MaxSum* shared) {
  MaxSum acc{-FLT_MAX, 0.f};
  if (packed) {
    for (int64_t p = threadIdx.x; p < V / kPack; p += blockDim.x) acc = fold(acc, load_pack(l, p));
  } else {
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
      const float x = to_float(l[j]);
      if (x > acc.m) {
        acc.s = acc.s * expf(acc.m - x) + 1.f;
        acc.m = x;
      } else {
        acc.s += expf(x - acc.m);
      }
    }
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    MaxSum other{__shfl_xor_sync(0xffffffffu, acc.m, offset),
                 __shfl_xor_sync(0xffffffffu, acc.s, offset)};
    acc = combine(acc, other);
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) shared[warp] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    MaxSum total = shared[0];
    for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) total = combine(total, shared[w]);
    shared[32] = total;
  }
  __syncthreads();
  return shared[32];
}

// d (a row of dlogits, may be l) = (exp(l - m) * scale - [j == t] * dloss).
template <class T>
__device__ void row_gradient(T* d, const T* l, float m, float scale, int64_t t, float dloss,
                             int64_t V, bool packed) {
  if (packed) {
    for (int64_t p = threadIdx.x; p < V / kPack; p += blockDim.x) {
      const Pack<T> x = load_pack(l, p);
      Pack<T> g;
#pragma unroll
      for (int k = 0; k < kPack; ++k) {
        float v = expf(to_float(x.v[k]) - m) * scale;
        if (p * kPack + k == t) v -= dloss;
        g.v[k] = from_float<T>(v);
      }
      store_pack(d, p, g);
    }
    return;
  }
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
    float g = expf(to_float(l[j]) - m) * scale;
    if (j == t) g -= dloss;
    d[j] = from_float<T>(g);
  }
}

template <class T>
__global__ void crossentropy_stats_kernel(float* row_max, float* row_sumexp, const T* logits,
                                          int64_t V, bool packed) {
  __shared__ MaxSum shared[33];
  const MaxSum total = row_stats(logits + blockIdx.x * V, V, packed, shared);
  if (threadIdx.x == 0) {
    row_max[blockIdx.x] = total.m;
    row_sumexp[blockIdx.x] = total.s;
  }
}

// The logit of target t in a row of V (this rank's slice), 0 where the target is elsewhere.
template <class T>
__device__ __forceinline__ float target_logit_of(const T* row, int64_t t, int64_t V) {
  return (t >= 0 && t < V) ? to_float(row[t]) : 0.f;
}

__device__ __forceinline__ float row_loss(float max, float sumexp, float target_logit) {
  return logf(sumexp) + max - target_logit;
}

// One row a block: its statistics, its loss (the target logit read before any thread overwrites
// the row, when dlogits is the logits), then its gradient. The gradient rereads the row; on an
// H100 that reread mostly missed L2 (4 blocks a multiprocessor, each on a 100 KB row, fill it),
// so this saves launches and the statistics' round trip through memory, not a read.
template <class T>
__global__ void crossentropy_fused_kernel(T* dlogits, float* losses, const T* logits,
                                          const int32_t* targets, float dloss, int64_t V,
                                          bool stats_packed, bool gradient_packed) {
  __shared__ MaxSum shared[33];
  const int64_t row = blockIdx.x;
  const T* l = logits + row * V;
  const MaxSum total = row_stats(l, V, stats_packed, shared);
  const int64_t t = targets[row];
  if (threadIdx.x == 0) {
    losses[row] = row_loss(total.m, total.s, target_logit_of(l, t, V));
  }
  __syncthreads();
  row_gradient(dlogits + row * V, l, total.m, dloss / total.s, t, dloss, V, gradient_packed);
}

__global__ void crossentropy_rebase_kernel(float* sumexp, const float* local_max,
                                           const float* global_max, int64_t N) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i < N) sumexp[i] *= expf(local_max[i] - global_max[i]);
}

template <class T>
__global__ void crossentropy_target_kernel(float* target_logit, const T* logits,
                                           const int32_t* targets, int64_t vocab_begin, int64_t N,
                                           int64_t V) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= N) return;
  target_logit[i] =
      target_logit_of(logits + i * V, static_cast<int64_t>(targets[i]) - vocab_begin, V);
}

__global__ void crossentropy_losses_kernel(float* losses, const float* row_max,
                                           const float* row_sumexp, const float* target_logit,
                                           int64_t N) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i < N) losses[i] = row_loss(row_max[i], row_sumexp[i], target_logit[i]);
}

template <class T>
__global__ void crossentropy_backward_kernel(T* dlogits, const T* logits, const float* row_max,
                                             const float* row_sumexp, const int32_t* targets,
                                             int64_t vocab_begin, float dloss, int64_t V,
                                             bool packed) {
  const int64_t row = blockIdx.x;
  row_gradient(dlogits + row * V, logits + row * V, row_max[row], dloss / row_sumexp[row],
               static_cast<int64_t>(targets[row]) - vocab_begin, dloss, V, packed);
}

unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

}  // namespace

template <class T>
void crossentropy_stats(float* row_max, float* row_sumexp, const T* logits, int64_t N, int64_t V,
                        cudaStream_t s) {
  if (N == 0) return;
  const bool packed = V % kPack == 0 && pack_aligned(logits);
  crossentropy_stats_kernel<<<static_cast<unsigned>(N), kRowThreads, 0, s>>>(row_max, row_sumexp,
                                                                             logits, V, packed);
  check_launch("crossentropy_stats");
}

void crossentropy_rebase(float* row_sumexp, const float* local_max, const float* global_max,
                         int64_t N, cudaStream_t s) {
  if (N == 0) return;
  crossentropy_rebase_kernel<<<blocks_for(N), kThreads, 0, s>>>(row_sumexp, local_max, global_max, N);
  check_launch("crossentropy_rebase");
}

template <class T>
void crossentropy_target_logit(float* target_logit, const T* logits, const int32_t* targets,
                               int64_t vocab_begin, int64_t N, int64_t V, cudaStream_t s) {
  if (N == 0) return;
  crossentropy_target_kernel<<<blocks_for(N), kThreads, 0, s>>>(target_logit, logits, targets,
                                                                vocab_begin, N, V);
  check_launch("crossentropy_target_logit");
}

void crossentropy_losses(float* losses, const float* row_max, const float* row_sumexp,
                         const float* target_logit, int64_t N, cudaStream_t s) {
  if (N == 0) return;
  crossentropy_losses_kernel<<<blocks_for(N), kThreads, 0, s>>>(losses, row_max, row_sumexp,
                                                                target_logit, N);
  check_launch("crossentropy_losses");
}

template <class T>
void crossentropy_backward(T* dlogits, const T* logits, const float* row_max,
                           const float* row_sumexp, const int32_t* targets, int64_t vocab_begin,
                           float dloss, int64_t N, int64_t V, cudaStream_t s) {
  if (N == 0) return;
  const bool packed = V % kPack == 0 && pack_aligned(logits) && pack_aligned(dlogits);
  crossentropy_backward_kernel<<<static_cast<unsigned>(N), kRowThreads, 0, s>>>(
      dlogits, logits, row_max, row_sumexp, targets, vocab_begin, dloss, V, packed);
  check_launch("crossentropy_backward");
}

template <class T>
void crossentropy_loss_and_backward(T* dlogits, float* losses, const T* logits,
                                    const int32_t* targets, float dloss, int64_t N, int64_t V,
                                    cudaStream_t s) {
  if (N == 0) return;
  // Each half packed exactly where its own launcher would pack it: the same bits.
  const bool stats_packed = V % kPack == 0 && pack_aligned(logits);
  const bool gradient_packed = stats_packed && pack_aligned(dlogits);
  crossentropy_fused_kernel<<<static_cast<unsigned>(N), kRowThreads, 0, s>>>(
      dlogits, losses, logits, targets, dloss, V, stats_packed, gradient_packed);
  check_launch("crossentropy_loss_and_backward");
}

#define INSTANTIATE(T)                                                                         \
  template void crossentropy_loss_and_backward<T>(T*, float*, const T*, const int32_t*, float,  \
                                                  int64_t, int64_t, cudaStream_t);             \
  template void crossentropy_stats<T>(float*, float*, const T*, int64_t, int64_t, cudaStream_t); \
  template void crossentropy_target_logit<T>(float*, const T*, const int32_t*, int64_t, int64_t, \
                                             int64_t, cudaStream_t);                            \
  template void crossentropy_backward<T>(T*, const T*, const float*, const float*,             \
                                         const int32_t*, int64_t, float, int64_t, int64_t,      \
                                         cudaStream_t);
INSTANTIATE(float)
INSTANTIATE(bf16)
#undef INSTANTIATE

}  // namespace meshtrain::cuda
