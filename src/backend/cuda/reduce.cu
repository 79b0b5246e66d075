// Deterministic reductions. Both run in two passes with a partition that depends only on the
// sizes, never on the device or the timing, so equal inputs give equal bits:
//  - sum / sum of squares: fixed chunks of kChunk elements, one block each, summed in double by
//    a fixed tree; then one block sums the chunk partials the same way;
//  - column sums (bias gradients): fixed row chunks, one thread per column summing its chunk in
//    row order; then the chunk partials of each column in a fixed order (sliced_column_sum)
//    added to out.

#include "cuda_check.h"
#include "device_common.cuh"
#include "kernels.h"

namespace meshtrain::cuda {

namespace {

constexpr int64_t kChunk = 8192;       // elements per block in the first pass of sum()
constexpr int kSumThreads = 256;
constexpr int64_t kMaxRowChunks = 1024;

// The chunk [begin, end) of x summed by a block in the fixed tree order: sum() and
// sum_pieces() share it, so a piece's sum has the same bits as the sum of its view.
template <class T>
__device__ double chunk_sum(const T* x, int64_t begin, int64_t end, bool squares, double* shared) {
  double acc = 0.0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const double v = static_cast<double>(to_float(x[i]));
    acc += squares ? v * v : v;
  }
  return block_sum(acc, shared);
}

__device__ double partials_sum(const double* partials, int64_t count, double* shared) {
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) acc += partials[i];
  return block_sum(acc, shared);
}

template <class T>
__global__ void sum_partials_kernel(double* partials, const T* x, int64_t n, bool squares) {
  __shared__ double shared[32];
  const int64_t begin = blockIdx.x * kChunk;
  const double acc = chunk_sum(x, begin, begin + kChunk < n ? begin + kChunk : n, squares, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

__global__ void sum_final_kernel(double* result, const double* partials, int64_t count) {
  __shared__ double shared[32];
  const double acc = partials_sum(partials, count, shared);
  if (threadIdx.x == 0) *result = acc;
}

// Up to kGroup pieces of one tensor per launch, passed by value: piece k covers x[offset[k],
// offset[k] + count[k]) and its chunks are blocks first_chunk[k] .. first_chunk[k + 1] - 1.
constexpr int kGroup = 96;
struct PieceGroup {
  int pieces;
  int64_t offset[kGroup], count[kGroup], first_chunk[kGroup + 1];
};

__device__ int piece_of_chunk(const PieceGroup& g, int64_t chunk) {
  int lo = 0, hi = g.pieces - 1;  // the last piece whose first chunk is <= chunk
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (g.first_chunk[mid] <= chunk) lo = mid; else hi = mid - 1;
  }
  return lo;
}

template <class T>
__global__ void pieces_partials_kernel(double* partials, const T* x, const __grid_constant__ PieceGroup g,
                                       bool squares) {
  __shared__ double shared[32];
  const int k = piece_of_chunk(g, blockIdx.x);
  const int64_t n = g.count[k];
  const int64_t begin = (blockIdx.x - g.first_chunk[k]) * kChunk;
  const double acc =
      chunk_sum(x + g.offset[k], begin, begin + kChunk < n ? begin + kChunk : n, squares, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

__global__ void pieces_final_kernel(double* results, const double* partials,
                                    const __grid_constant__ PieceGroup g) {
  __shared__ double shared[32];
  const int k = blockIdx.x;
  const double acc = partials_sum(partials + g.first_chunk[k], g.first_chunk[k + 1] - g.first_chunk[k], shared);
  if (threadIdx.x == 0) results[k] = acc;
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

// The same partials, kPack columns a thread, read as one wide access per row (C a multiple of
// kPack, `in` pack-aligned): each column still sums its chunk's rows in row order, so the bits
// match column_partials_kernel's.
template <class T>
__global__ void column_partials_packed_kernel(float* partials, const T* in, int64_t N, int64_t C,
                                              int64_t rows) {
  const int64_t pack = blockIdx.x * int64_t{blockDim.x} + threadIdx.x, packs = C / kPack;
  if (pack >= packs) return;
  const int64_t r0 = blockIdx.y * rows;
  const int64_t r1 = r0 + rows < N ? r0 + rows : N;
  float acc[kPack] = {};
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) {  // four rows' loads in flight before their adds
    Pack<T> x[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) x[i] = load_pack(in + (r + i) * C, pack);
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int k = 0; k < kPack; ++k) acc[k] += to_float(x[i].v[k]);
  }
  for (; r < r1; ++r) {
    const Pack<T> x = load_pack(in + r * C, pack);
#pragma unroll
    for (int k = 0; k < kPack; ++k) acc[k] += to_float(x.v[k]);
  }
#pragma unroll
  for (int k = 0; k < kPack; ++k) partials[blockIdx.y * C + pack * kPack + k] = acc[k];
}

__global__ void column_final_kernel(float* out, const float* partials, int64_t chunks, int64_t C) {
  __shared__ float shared[kSlices][kSliceColumns + 1];
  const int64_t c = blockIdx.x * int64_t{kSliceColumns} + threadIdx.x;
  const bool active = c < C;
  const float total = sliced_column_sum(partials + (active ? c : 0), C, chunks, active, shared);
  if (active && threadIdx.y == 0) out[c] += total;
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

int64_t sum_pieces_scratch(const int64_t* counts, int64_t pieces) {
  int64_t chunks = 0;
  for (int64_t k = 0; k < pieces; ++k) chunks += (counts[k] + kChunk - 1) / kChunk;
  return std::max<int64_t>(1, chunks);
}

template <class T>
void sum_pieces(double* results, const T* x, const int64_t* offsets, const int64_t* counts,
                int64_t pieces, bool squares, double* scratch, cudaStream_t s) {
  const char* op = squares ? "sum_squares" : "sum";
  for (int64_t first = 0; first < pieces; first += kGroup) {
    PieceGroup g{};
    g.pieces = static_cast<int>(std::min<int64_t>(kGroup, pieces - first));
    for (int k = 0; k < g.pieces; ++k) {
      g.offset[k] = offsets[first + k];
      g.count[k] = counts[first + k];
      g.first_chunk[k + 1] = g.first_chunk[k] + (g.count[k] + kChunk - 1) / kChunk;
    }
    const int64_t chunks = g.first_chunk[g.pieces];
    if (chunks > 0x7fffffff) fail(op, "tensor too large for one reduction");
    if (chunks > 0) {
      pieces_partials_kernel<<<static_cast<unsigned>(chunks), kSumThreads, 0, s>>>(scratch, x, g, squares);
      check_launch(op);
    }
    pieces_final_kernel<<<static_cast<unsigned>(g.pieces), 1024, 0, s>>>(results + first, scratch, g);
    check_launch(op);
  }
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
  if (pack_count(C, in) > 0 && C % kPack == 0) {
    const int64_t packs = C / kPack;
    const int threads = static_cast<int>(std::min<int64_t>(kThreads, (packs + 31) / 32 * 32));
    const dim3 grid(static_cast<unsigned>((packs + threads - 1) / threads), static_cast<unsigned>(chunks));
    column_partials_packed_kernel<<<grid, threads, 0, s>>>(scratch, in, N, C, rows);
  } else {
    const dim3 grid(static_cast<unsigned>((C + kThreads - 1) / kThreads), static_cast<unsigned>(chunks));
    column_partials_kernel<<<grid, kThreads, 0, s>>>(scratch, in, N, C, rows);
  }
  check_launch("bias_backward");
  column_final_kernel<<<static_cast<unsigned>((C + kSliceColumns - 1) / kSliceColumns),
                        dim3(kSliceColumns, kSlices), 0, s>>>(
      out, scratch, chunks, C);
  check_launch("bias_backward");
}

template void sum<float>(double*, const float*, int64_t, bool, double*, cudaStream_t);
template void sum<bf16>(double*, const bf16*, int64_t, bool, double*, cudaStream_t);
template void sum_pieces<float>(double*, const float*, const int64_t*, const int64_t*, int64_t,
                                bool, double*, cudaStream_t);
template void sum_pieces<bf16>(double*, const bf16*, const int64_t*, const int64_t*, int64_t, bool,
                               double*, cudaStream_t);
template void column_sums<float>(float*, const float*, int64_t, int64_t, float*, cudaStream_t);
template void column_sums<bf16>(float*, const bf16*, int64_t, int64_t, float*, cudaStream_t);

}  // namespace meshtrain::cuda
