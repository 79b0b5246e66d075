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

__global__ void adamw_kernel(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                             int64_t n, AdamWParams p) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float g = grad[i] * p.grad_scale;
    const float m = p.beta1 * exp_avg[i] + (1.f - p.beta1) * g;
    const float v = p.beta2 * exp_avg_sq[i] + (1.f - p.beta2) * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    const float w = param[i];
    param[i] = w - p.lr * ((m * p.bias_correction1) / (sqrtf(v * p.bias_correction2) + p.eps) +
                           p.weight_decay * w);
  }
}

}  // namespace

void adamw_update(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                  const AdamWParams& p, cudaStream_t s) {
  if (n == 0) return;
  adamw_kernel<<<grid_for(n), kThreads, 0, s>>>(param, grad, exp_avg, exp_avg_sq, n, p);
  check_launch("adamw_update");
}

}  // namespace meshtrain::cuda
