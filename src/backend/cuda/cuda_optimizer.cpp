// AdamW on the device: one tensor at a time, or a flat buffer's pieces (one per parameter) in a
// few launches, each piece with its own weight decay.

#include <cmath>
#include <string>
#include <vector>

#include "backend_util.h"
#include "cuda_check.h"

namespace meshtrain {

using cuda::ptr;
using cuda::require;

namespace {
cuda::AdamWParams adamw_params(const Backend::AdamWStep& s) {
  cuda::AdamWParams p{};
  p.lr = static_cast<float>(s.lr);
  p.beta1 = static_cast<float>(s.beta1);
  p.beta2 = static_cast<float>(s.beta2);
  p.eps = static_cast<float>(s.eps);
  p.weight_decay = static_cast<float>(s.weight_decay);
  p.bias_correction1 =
      static_cast<float>(1.0 / (1.0 - std::pow(s.beta1, static_cast<double>(s.step))));
  p.bias_correction2 =
      static_cast<float>(1.0 / (1.0 - std::pow(s.beta2, static_cast<double>(s.step))));
  p.grad_scale = static_cast<float>(s.grad_scale);
  return p;
}

void check_adamw_tensors(const char* op, const Tensor& param, const Tensor& grad,
                         const Tensor& exp_avg, const Tensor& exp_avg_sq) {
  require(param.numel() == grad.numel() && param.numel() == exp_avg.numel() &&
              param.numel() == exp_avg_sq.numel(),
          op, "size mismatch");
  for (const Tensor* t : {&param, &grad, &exp_avg, &exp_avg_sq})
    if (t->dtype() != DType::F32)
      cuda::wrong_dtype(op, param.dtype(), "a tensor", t->dtype(), DType::F32,
                        "master parameters, gradients and moments are fp32");
}
}  // namespace

void CudaBackend::adamw_update(Tensor& param, const Tensor& grad, Tensor& exp_avg,
                               Tensor& exp_avg_sq, const AdamWStep& s) {
  cuda::TimedOp timed(profile_, stream_, "adamw_update");
  const char* op = "adamw_update";
  check_adamw_tensors(op, param, grad, exp_avg, exp_avg_sq);
  cuda::adamw_update(ptr<float>(op, param), ptr<float>(op, grad), ptr<float>(op, exp_avg),
                     ptr<float>(op, exp_avg_sq), param.numel(), adamw_params(s), stream_);
}

void CudaBackend::adamw_update_pieces(Tensor& param, const Tensor& grad, Tensor& exp_avg,
                                      Tensor& exp_avg_sq, const std::vector<FlatPiece>& pieces,
                                      const std::vector<double>& decays, const AdamWStep& s) {
  cuda::TimedOp timed(profile_, stream_, "adamw_update");
  const char* op = "adamw_update";
  check_adamw_tensors(op, param, grad, exp_avg, exp_avg_sq);
  require(decays.size() == pieces.size(), op,
          std::to_string(pieces.size()) + " pieces but " + std::to_string(decays.size()) +
              " weight decays");
  cuda::require_pieces_inside(op, param, pieces);
  std::vector<int64_t> offsets, counts;
  std::vector<float> decay;
  for (size_t k = 0; k < pieces.size(); ++k) {
    offsets.push_back(pieces[k].offset);
    counts.push_back(pieces[k].count);
    decay.push_back(static_cast<float>(decays[k]));
  }
  cuda::adamw_update_pieces(ptr<float>(op, param), ptr<float>(op, grad), ptr<float>(op, exp_avg),
                            ptr<float>(op, exp_avg_sq), offsets.data(), counts.data(),
                            decay.data(), static_cast<int64_t>(pieces.size()), adamw_params(s),
                            stream_);
}

}  // namespace meshtrain
