// AdamW with decoupled weight decay (Loshchilov & Hutter, arXiv 1711.05101) on FP32 master
// parameters, FP32 gradients and moments, the same arithmetic as the CPU backend's fp32 path:
//   g = grad * grad_scale
//   m = b1 m + (1 - b1) g,   v = b2 v + (1 - b2) g^2
//   p -= lr * ( (m c1) / (sqrt(v c2) + eps) + wd * p ),   c1 = 1/(1 - b1^t), c2 = 1/(1 - b2^t)

#include "cuda_check.h"
#include "device_common.cuh"
#include "kernels.h"

namespace meshtrain::cuda {

namespace {

__device__ __forceinline__ void adamw_element(float* param, const float* grad, float* exp_avg,
                                              float* exp_avg_sq, int64_t i, const AdamWParams& p,
                                              float weight_decay) {
  const float g = grad[i] * p.grad_scale;
  const float m = p.beta1 * exp_avg[i] + (1.f - p.beta1) * g;
  const float v = p.beta2 * exp_avg_sq[i] + (1.f - p.beta2) * g * g;
  exp_avg[i] = m;
  exp_avg_sq[i] = v;
  const float w = param[i];
  param[i] = w - p.lr * ((m * p.bias_correction1) / (sqrtf(v * p.bias_correction2) + p.eps) +
                         weight_decay * w);
}

// Up to kGroup pieces per launch, passed by value. The launch's index j runs over the pieces
// laid end to end: piece k holds j in [first[k], first[k + 1]), element offset[k] + j - first[k].
constexpr int kGroup = 96;
struct AdamWGroup {
  int pieces;
  int64_t offset[kGroup], first[kGroup + 1];
  float decay[kGroup];
};

__global__ void adamw_pieces_kernel(float* param, const float* grad, float* exp_avg,
                                    float* exp_avg_sq, const __grid_constant__ AdamWGroup g,
                                    const AdamWParams p) {
  MESHTRAIN_GRID_LOOP(j, g.first[g.pieces]) {
    int lo = 0, hi = g.pieces - 1;  // the last piece starting at or before j
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (g.first[mid] <= j) lo = mid; else hi = mid - 1;
    }
    adamw_element(param, grad, exp_avg, exp_avg_sq, g.offset[lo] + j - g.first[lo], p, g.decay[lo]);
  }
}

}  // namespace

void adamw_update_pieces(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                         const int64_t* offsets, const int64_t* counts, const float* decays,
                         int64_t pieces, const AdamWParams& p, cudaStream_t s) {
  for (int64_t first = 0; first < pieces; first += kGroup) {
    AdamWGroup g{};
    g.pieces = static_cast<int>(std::min<int64_t>(kGroup, pieces - first));
    for (int k = 0; k < g.pieces; ++k) {
      g.offset[k] = offsets[first + k];
      g.decay[k] = decays[first + k];
      g.first[k + 1] = g.first[k] + counts[first + k];
    }
    const int64_t n = g.first[g.pieces];
    if (n == 0) continue;
    adamw_pieces_kernel<<<grid_for(n), kThreads, 0, s>>>(param, grad, exp_avg, exp_avg_sq, g, p);
    check_launch("adamw_update");
  }
}

}  // namespace meshtrain::cuda
