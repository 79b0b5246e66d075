// AdamW with decoupled weight decay (Loshchilov & Hutter, arXiv 1711.05101), bias-corrected:
//   g = grad * grad_scale
//   m = b1 m + (1 - b1) g,   v = b2 v + (1 - b2) g^2
//   p -= lr * ( (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + wd * p )

#include <cmath>

#include "kernels.h"

namespace meshtrain::cpu {

template <class T>
void adamw_update(T* param, const T* grad, T* exp_avg, T* exp_avg_sq, int64_t n, double lr,
                  double beta1, double beta2, double eps, double weight_decay, int64_t step,
                  double grad_scale) {
  const T b1 = static_cast<T>(beta1), b2 = static_cast<T>(beta2);
  const T c1 = static_cast<T>(1.0 / (1.0 - std::pow(beta1, static_cast<double>(step))));
  const T c2 = static_cast<T>(1.0 / (1.0 - std::pow(beta2, static_cast<double>(step))));
  const T lr_ = static_cast<T>(lr), eps_ = static_cast<T>(eps), wd = static_cast<T>(weight_decay);
  const T gs = static_cast<T>(grad_scale);
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const T g = grad[i] * gs;
    const T m = b1 * exp_avg[i] + (T(1) - b1) * g;
    const T v = b2 * exp_avg_sq[i] + (T(1) - b2) * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    param[i] -= lr_ * ((m * c1) / (std::sqrt(v * c2) + eps_) + wd * param[i]);
  }
}

template void adamw_update<float>(float*, const float*, float*, float*, int64_t, double, double,
                                  double, double, double, int64_t, double);
template void adamw_update<double>(double*, const double*, double*, double*, int64_t, double,
                                   double, double, double, double, int64_t, double);

}  // namespace meshtrain::cpu
