// AdamW on the device: a flat buffer's pieces (one per parameter; a single tensor is one piece)
// in a few launches, each piece with its own weight decay.

#include <cmath>
#include <string>
#include <vector>

#include "backend_util.h"
#include "cuda_check.h"

namespace meshtrain {

using cuda::ptr;

namespace {
cuda::AdamWParams adamw_params(const Backend::AdamWStep& s) {
  cuda::AdamWParams p{};
  p.lr = static_cast<float>(s.lr);
  p.beta1 = static_cast<float>(s.beta1);
  p.beta2 = static_cast<float>(s.beta2);
  p.eps = static_cast<float>(s.eps);
  p.bias_correction1 =
      static_cast<float>(1.0 / (1.0 - std::pow(s.beta1, static_cast<double>(s.step))));
  p.bias_correction2 =
      static_cast<float>(1.0 / (1.0 - std::pow(s.beta2, static_cast<double>(s.step))));
  p.grad_scale = static_cast<float>(s.grad_scale);
  return p;
}
}  // namespace

// `rounded`, if given, is cast from the updated masters after the update (no fused kernel yet).
void CudaBackend::do_adamw_update(Tensor& param, const Tensor& grad, Tensor& exp_avg,
                                  Tensor& exp_avg_sq, const std::vector<FlatPiece>& pieces,
                                  const std::vector<double>& decays, const AdamWStep& s,
                                  Tensor* rounded) {
  const char* op = "adamw_update";
  {
    cuda::TimedOp timed(profile_, stream_, op);
    std::vector<int64_t> offsets, counts;
    std::vector<float> decay;
    for (size_t k = 0; k < pieces.size(); ++k) {
      offsets.push_back(pieces[k].offset);
      counts.push_back(pieces[k].count);
      decay.push_back(static_cast<float>(decays[k]));
    }
    cuda::adamw_update_pieces(ptr<float>(op, param), ptr<float>(op, grad),
                              ptr<float>(op, exp_avg), ptr<float>(op, exp_avg_sq), offsets.data(),
                              counts.data(), decay.data(), static_cast<int64_t>(pieces.size()),
                              adamw_params(s), stream_);
  }
  if (rounded) cast(*rounded, param);
}

}  // namespace meshtrain
