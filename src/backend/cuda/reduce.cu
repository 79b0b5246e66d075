// Deterministic reductions. Both run in two passes with a partition that depends only on the
// sizes, never on the device or the timing, so equal inputs give equal bits:
//  - sum / sum of squares: fixed chunks of kChunk elements, one block each, summed in double by
//    a fixed tree; then one block sums the chunk partials the same way;
//  - column sums (bias gradients): fixed row chunks, one thread per column summing its chunk in
//    row order; then one thread per column sums the chunk partials in order and adds to out.

#include "cuda_check.h"
#include "device_common.cuh"
#include "kernels.h"

namespace meshtrain::cuda {

namespace {

constexpr int64_t kChunk = 8192;       // elements per block in the first pass of sum()
constexpr int kSumThreads = 256;
constexpr int64_t kMaxRowChunks = 1024;

template <class T>
__global__ void sum_partials_kernel(double* partials, const T* x, int64_t n, bool squares) {
  __shared__ double shared[32];
  const int64_t begin = blockIdx.x * kChunk;
  const int64_t end = begin + kChunk < n ? begin + kChunk : n;
  double acc = 0.0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const double v = static_cast<double>(to_float(x[i]));
    acc += squares ? v * v : v;
  }
  acc = block_sum(acc, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

__global__ void sum_final_kernel(double* result, const double* partials, int64_t count) {
  __shared__ double shared[32];
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) acc += partials[i];
  acc = block_sum(acc, shared);
  if (threadIdx.x == 0) *result = acc;
}

int64_t rows_per_chunk(int64_t N) {
  return std::max<int64_t>(32, (N + kMaxRowChunks - 1) / kMaxRowChunks);
}

template <class T>
__global__ void column_partials_kernel(float* partials, const T* in, int64_t N, int64_t C,
                                       int64_t rows) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= C) return;
  const int64_t r0 = blockIdx.y * rows;
  const int64_t r1 = r0 + rows < N ? r0 + rows : N;
  float acc = 0.f;
  for (int64_t r = r0; r < r1; ++r) acc += to_float(in[r * C + c]);
  partials[blockIdx.y * C + c] = acc;
}

__global__ void column_final_kernel(float* out, const float* partials, int64_t chunks, int64_t C) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= C) return;
  float acc = 0.f;
  for (int64_t k = 0; k < chunks; ++k) acc += partials[k * C + c];
  out[c] += acc;
}

}  // namespace

int64_t sum_scratch(int64_t n) { return std::max<int64_t>(1, (n + kChunk - 1) / kChunk) + 1; }

template <class T>
void sum(double* result, const T* x, int64_t n, bool squares, double* scratch, cudaStream_t s) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  if (chunks > 0) {
    if (chunks > 0x7fffffff) fail("sum", "tensor too large for one reduction");
    sum_partials_kernel<<<static_cast<unsigned>(chunks), kSumThreads, 0, s>>>(scratch, x, n, squares);
    check_launch(squares ? "sum_squares" : "sum");
  }
  sum_final_kernel<<<1, 1024, 0, s>>>(result, scratch, chunks);
  check_launch(squares ? "sum_squares" : "sum");
}

int64_t column_sums_scratch(int64_t N, int64_t C) {
  const int64_t chunks = (N + rows_per_chunk(N) - 1) / rows_per_chunk(N);
  return std::max<int64_t>(1, chunks * C);
}

template <class T>
void column_sums(float* out, const T* in, int64_t N, int64_t C, float* scratch, cudaStream_t s) {
  if (N == 0 || C == 0) return;
  const int64_t rows = rows_per_chunk(N);
  const int64_t chunks = (N + rows - 1) / rows;
  const dim3 grid(static_cast<unsigned>((C + kThreads - 1) / kThreads), static_cast<unsigned>(chunks));
  column_partials_kernel<<<grid, kThreads, 0, s>>>(scratch, in, N, C, rows);
  check_launch("bias_backward");
  column_final_kernel<<<static_cast<unsigned>((C + kThreads - 1) / kThreads), kThreads, 0, s>>>(
      out, scratch, chunks, C);
  check_launch("bias_backward");
}

template void sum<float>(double*, const float*, int64_t, bool, double*, cudaStream_t);
template void sum<bf16>(double*, const bf16*, int64_t, bool, double*, cudaStream_t);
template void column_sums<float>(float*, const float*, int64_t, int64_t, float*, cudaStream_t);
template void column_sums<bf16>(float*, const bf16*, int64_t, int64_t, float*, cudaStream_t);

}  // namespace meshtrain::cuda
