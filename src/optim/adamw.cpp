#include "meshtrain/optim/adamw.h"

namespace meshtrain {

AdamW::AdamW(Backend& be, int64_t elements, DType dtype, std::vector<OptimizerSegment> segments,
             AdamWHyper hyper)
    : be_(&be), segments_(std::move(segments)), hyper_(hyper) {
  exp_avg_ = be.zeros({elements}, dtype, MemoryCategory::OptimizerState);
  exp_avg_sq_ = be.zeros({elements}, dtype, MemoryCategory::OptimizerState);
  for (const OptimizerSegment& s : segments_) {
    if (s.count == 0) continue;
    pieces_.push_back({s.offset, s.count});
    decays_.push_back(s.decay == WeightDecay::Apply ? hyper_.weight_decay : 0.0);
  }
}

void AdamW::step(Tensor& params, const Tensor& grads, double lr, double grad_scale,
                 Tensor* rounded) {
  ++steps_;
  be_->adamw_update_pieces(params, grads, exp_avg_, exp_avg_sq_, pieces_, decays_,
                           {lr, hyper_.beta1, hyper_.beta2, hyper_.eps, 0.0, steps_, grad_scale},
                           rounded);
}

}  // namespace meshtrain
