// SwiGLU, FP32 math on float or bf16 storage (the CPU backend's swiglu.cpp states the formulas):
// elementwise, packed where aligned.

#include "cuda_check.h"
#include "device_common.cuh"
#include "kernels.h"

namespace meshtrain::cuda {

namespace {

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

}  // namespace

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

#define INSTANTIATE(T)                                                                          \
  template void swiglu_forward<T>(T*, const T*, const T*, int64_t, cudaStream_t);               \
  template void swiglu_backward<T>(T*, T*, const T*, const T*, const T*, int64_t, cudaStream_t);
INSTANTIATE(float)
INSTANTIATE(bf16)
#undef INSTANTIATE

}  // namespace meshtrain::cuda
