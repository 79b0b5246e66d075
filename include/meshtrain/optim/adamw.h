#pragma once
// AdamW over flat buffers. The optimizer owns its moments (exp_avg, exp_avg_sq) for a flat range
// of elements; parameters and gradients are passed in laid out the same way. Which elements it
// owns is the caller's business: everything (no sharding) or this rank's shard (ZeRO 1-3).
// Segments say where weight decay applies; elements outside every segment (padding) are left
// untouched.

#include <cstdint>
#include <vector>

#include "meshtrain/backend/backend.h"
#include "meshtrain/optim/weight_decay.h"

namespace meshtrain {

struct OptimizerSegment {
  int64_t offset = 0, count = 0;
  WeightDecay decay = WeightDecay::Apply;
};

struct AdamWHyper {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
};

class AdamW {
 public:
  AdamW(Backend& be, int64_t elements, DType dtype, std::vector<OptimizerSegment> segments,
        AdamWHyper hyper);

  // One step over every segment; grads are multiplied by grad_scale first (clipping). With
  // `rounded`, params are fp32 masters and their bf16 copy is written there in the same pass.
  void step(Tensor& params, const Tensor& grads, double lr, double grad_scale,
            Tensor* rounded = nullptr);

  Tensor& exp_avg() { return exp_avg_; }
  Tensor& exp_avg_sq() { return exp_avg_sq_; }
  int64_t steps_taken() const { return steps_; }
  void set_steps_taken(int64_t steps) { steps_ = steps; }
  const std::vector<OptimizerSegment>& segments() const { return segments_; }

 private:
  Backend* be_;
  std::vector<OptimizerSegment> segments_;
  // The segments as the backend takes them, with each one's weight decay; empty ones left out.
  std::vector<FlatPiece> pieces_;
  std::vector<double> decays_;
  AdamWHyper hyper_;
  Tensor exp_avg_, exp_avg_sq_;
  int64_t steps_ = 0;
};

}  // namespace meshtrain
