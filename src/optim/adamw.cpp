#include "meshtrain/optim/adamw.h"

namespace meshtrain {

AdamW::AdamW(Backend& be, int64_t elements, DType dtype, std::vector<OptimizerSegment> segments,
             AdamWHyper hyper)
    : be_(&be), segments_(std::move(segments)), hyper_(hyper) {
  exp_avg_ = be.zeros({elements}, dtype, MemoryCategory::OptimizerState);
  exp_avg_sq_ = be.zeros({elements}, dtype, MemoryCategory::OptimizerState);
}

void AdamW::step(Tensor& params, const Tensor& grads, double lr, double grad_scale) {
  ++steps_;
  for (const OptimizerSegment& s : segments_) {
    if (s.count == 0) continue;
    Tensor p = params.view(s.offset, {s.count});
    const Tensor g = grads.view(s.offset, {s.count});
    Tensor m = exp_avg_.view(s.offset, {s.count});
    Tensor v = exp_avg_sq_.view(s.offset, {s.count});
    const double wd = s.decay == WeightDecay::Apply ? hyper_.weight_decay : 0.0;
    be_->adamw_update(p, g, m, v,
                      {lr, hyper_.beta1, hyper_.beta2, hyper_.eps, wd, steps_, grad_scale});
  }
}

}  // namespace meshtrain
