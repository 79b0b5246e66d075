// Token and position embeddings over this rank's vocabulary slice [vocab_begin, vocab_begin + V).
//
// Backward without atomics, so gradients are bitwise repeatable: the (token, row) pairs are
// radix-sorted by token (LSD radix sort is stable, so rows of one token stay in row order),
// then summed in fixed chunks of sorted positions and the chunks of each token added in order
// into dtable (see embedding_chunks_kernel). Tokens outside the
// slice sort last (key V) and are skipped. Position gradients need no sort: position p gathers
// rows p', p' + T, p' + 2T, ... (p' = (p - token_begin) mod T), one thread per (p, channel).

#include <cub/device/device_radix_sort.cuh>

#include "cuda_check.h"
#include "device_common.cuh"
#include "kernels.h"

namespace meshtrain::cuda {

namespace {

template <class T>
__global__ void embedding_forward_kernel(T* out, const int32_t* tokens, const T* table,
                                         int64_t vocab_begin, int64_t V, int64_t N, int64_t C) {
  const int64_t n = N * C;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = i / C, c = i % C;
    const int64_t r = static_cast<int64_t>(tokens[row]) - vocab_begin;
    out[i] = (r >= 0 && r < V) ? table[r * C + c] : from_float<T>(0.f);
  }
}

// keys[i] = local token (V when outside the slice), values[i] = i.
__global__ void embedding_keys_kernel(int32_t* keys, int32_t* values, const int32_t* tokens,
                                      int64_t vocab_begin, int64_t V, int64_t N) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= N) return;
  const int64_t r = static_cast<int64_t>(tokens[i]) - vocab_begin;
  keys[i] = static_cast<int32_t>((r >= 0 && r < V) ? r : V);
  values[i] = static_cast<int32_t>(i);
}

// Sorted positions are cut into chunks of kEmbedChunk, so that a frequent token's rows are summed
// by many blocks rather than one. Block j sums each run of equal keys (a segment) within chunk j
// in position order: a run that starts and ends in the chunk goes straight into dtable (this block
// alone owns it); a run's first piece, when it continues into the next chunk, goes to tail[j],
// and any other piece (the run began in an earlier chunk) to head[j].
constexpr int64_t kEmbedChunk = 64;

template <class T>
__global__ void embedding_chunks_kernel(float* dtable, float* head, float* tail, const T* dout,
                                        const int32_t* keys, const int32_t* rows, int64_t V,
                                        int64_t N, int64_t C) {
  const int64_t j = blockIdx.x, begin = j * kEmbedChunk;
  const int64_t end = begin + kEmbedChunk < N ? begin + kEmbedChunk : N;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    int64_t start = begin;
    float acc = 0.f;
    for (int64_t k = begin; k < end; ++k) {
      acc += to_float(dout[static_cast<int64_t>(rows[k]) * C + c]);
      const int32_t key = keys[k];
      if (k + 1 < end && keys[k + 1] == key) continue;  // the segment goes on in this chunk
      if (key < V) {
        const bool starts_here = start == 0 || keys[start - 1] != key;
        const bool ends_here = k + 1 == N || keys[k + 1] != key;
        if (starts_here && ends_here) dtable[static_cast<int64_t>(key) * C + c] += acc;
        else if (!starts_here) head[j * C + c] = acc;
        else tail[j * C + c] = acc;
      }
      acc = 0.f;
      start = k + 1;
    }
  }
}

// Block j adds up the run that starts in chunk j and goes on past it, if any: tail[j], then the
// head of every later chunk the run reaches, in order.
__global__ void embedding_runs_kernel(float* dtable, const float* head, const float* tail,
                                      const int32_t* keys, int64_t V, int64_t N, int64_t C) {
  const int64_t j = blockIdx.x, begin = j * kEmbedChunk;
  const int64_t last = (begin + kEmbedChunk < N ? begin + kEmbedChunk : N) - 1;
  const int32_t key = keys[last];
  if (key >= V || last + 1 == N || keys[last + 1] != key) return;  // no run leaves this chunk
  if (keys[begin] == key && begin > 0 && keys[begin - 1] == key) return;  // began earlier
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float acc = tail[j * C + c];
    for (int64_t m = j + 1;; ++m) {
      acc += head[m * C + c];
      const int64_t next = (m + 1) * kEmbedChunk;  // the first position of chunk m + 1
      if (next >= N || keys[next] != key) break;
    }
    dtable[static_cast<int64_t>(key) * C + c] += acc;
  }
}

template <class T>
__global__ void position_forward_kernel(T* out, const T* table, int64_t token_begin, int64_t T_,
                                        int64_t N, int64_t C) {
  const int64_t n = N * C;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = i / C, c = i % C;
    const int64_t p = (token_begin + row) % T_;
    out[i] = from_float<T>(to_float(out[i]) + to_float(table[p * C + c]));
  }
}

template <class T>
__global__ void position_backward_kernel(float* dtable, const T* dout, int64_t token_begin,
                                         int64_t T_, int64_t N, int64_t C) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int64_t p = blockIdx.y;
  if (c >= C) return;
  const int64_t first = ((p - token_begin) % T_ + T_) % T_;  // first row at position p
  if (first >= N) return;
  float acc = 0.f;
  for (int64_t row = first; row < N; row += T_) acc += to_float(dout[row * C + c]);
  dtable[p * C + c] += acc;
}

// Workspace layout: keys in/out and values in/out (N int32 each), then CUB's temporary storage.
constexpr size_t kAlign = 256;
size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

size_t cub_temp_bytes(int64_t N) {
  size_t bytes = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const int32_t*>(nullptr),
                                  static_cast<int32_t*>(nullptr),
                                  static_cast<const int32_t*>(nullptr),
                                  static_cast<int32_t*>(nullptr), static_cast<int>(N));
  return bytes;
}

int end_bit_for(int64_t V) {  // keys are in [0, V]
  int bits = 1;
  while ((int64_t{1} << bits) <= V && bits < 31) ++bits;
  return bits;
}

}  // namespace

template <class T>
void embedding_forward(T* out, const int32_t* tokens, const T* table, int64_t vocab_begin,
                       int64_t V, int64_t N, int64_t C, cudaStream_t s) {
  if (N * C == 0) return;
  embedding_forward_kernel<<<grid_for(N * C), kThreads, 0, s>>>(out, tokens, table, vocab_begin, V,
                                                                N, C);
  check_launch("embedding_forward");
}

size_t embedding_backward_workspace(int64_t N, int64_t C) {
  const size_t chunk_sums = static_cast<size_t>((N + kEmbedChunk - 1) / kEmbedChunk * C);
  return 4 * align_up(static_cast<size_t>(N) * sizeof(int32_t)) + align_up(cub_temp_bytes(N)) +
         2 * align_up(chunk_sums * sizeof(float));
}

template <class T>
void embedding_backward(float* dtable, const T* dout, const int32_t* tokens, int64_t vocab_begin,
                        int64_t V, int64_t N, int64_t C, void* workspace, size_t workspace_bytes,
                        cudaStream_t s) {
  if (N == 0 || C == 0) return;
  if (N > 0x7fffffff || V >= 0x7fffffff) fail("embedding_backward", "more than 2^31 tokens or rows");
  if (workspace_bytes < embedding_backward_workspace(N, C))
    fail("embedding_backward", "workspace too small");
  const size_t slot = align_up(static_cast<size_t>(N) * sizeof(int32_t));
  char* base = static_cast<char*>(workspace);
  auto* keys_in = reinterpret_cast<int32_t*>(base);
  auto* keys_out = reinterpret_cast<int32_t*>(base + slot);
  auto* rows_in = reinterpret_cast<int32_t*>(base + 2 * slot);
  auto* rows_out = reinterpret_cast<int32_t*>(base + 3 * slot);
  void* temp = base + 4 * slot;
  size_t temp_bytes = cub_temp_bytes(N);
  const int64_t chunks = (N + kEmbedChunk - 1) / kEmbedChunk;
  auto* head = reinterpret_cast<float*>(base + 4 * slot + align_up(temp_bytes));
  auto* tail = head + align_up(static_cast<size_t>(chunks * C) * sizeof(float)) / sizeof(float);

  embedding_keys_kernel<<<static_cast<unsigned>((N + kThreads - 1) / kThreads), kThreads, 0, s>>>(
      keys_in, rows_in, tokens, vocab_begin, V, N);
  check_launch("embedding_backward");
  check(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys_in, keys_out, rows_in, rows_out,
                                        static_cast<int>(N), 0, end_bit_for(V), s),
        "embedding_backward", "cub::DeviceRadixSort::SortPairs");
  embedding_chunks_kernel<<<static_cast<unsigned>(chunks), kThreads, 0, s>>>(
      dtable, head, tail, dout, keys_out, rows_out, V, N, C);
  check_launch("embedding_backward");
  embedding_runs_kernel<<<static_cast<unsigned>(chunks), kThreads, 0, s>>>(dtable, head, tail,
                                                                          keys_out, V, N, C);
  check_launch("embedding_backward");
}

template <class T>
void position_forward(T* out, const T* table, int64_t token_begin, int64_t T_, int64_t N,
                      int64_t C, cudaStream_t s) {
  if (N * C == 0) return;
  position_forward_kernel<<<grid_for(N * C), kThreads, 0, s>>>(out, table, token_begin, T_, N, C);
  check_launch("position_forward");
}

template <class T>
void position_backward(float* dtable, const T* dout, int64_t token_begin, int64_t T_, int64_t N,
                       int64_t C, cudaStream_t s) {
  if (N * C == 0) return;
  if (T_ > 65535) fail("position_backward", "more than 65535 positions");
  const dim3 grid(static_cast<unsigned>((C + kThreads - 1) / kThreads), static_cast<unsigned>(T_));
  position_backward_kernel<<<grid, kThreads, 0, s>>>(dtable, dout, token_begin, T_, N, C);
  check_launch("position_backward");
}

#define INSTANTIATE(T)                                                                          \
  template void embedding_forward<T>(T*, const int32_t*, const T*, int64_t, int64_t, int64_t,   \
                                     int64_t, cudaStream_t);                                    \
  template void embedding_backward<T>(float*, const T*, const int32_t*, int64_t, int64_t,       \
                                      int64_t, int64_t, void*, size_t, cudaStream_t);           \
  template void position_forward<T>(T*, const T*, int64_t, int64_t, int64_t, int64_t,           \
                                    cudaStream_t);                                              \
  template void position_backward<T>(float*, const T*, int64_t, int64_t, int64_t, int64_t,     \
                                     cudaStream_t);
INSTANTIATE(float)
INSTANTIATE(bf16)
#undef INSTANTIATE

}  // namespace meshtrain::cuda
