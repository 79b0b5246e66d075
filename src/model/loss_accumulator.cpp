#include "meshtrain/model/loss_accumulator.h"

#include <utility>
#include <vector>

namespace meshtrain {

void LossAccumulator::add(const Tensor& losses) {
  const int64_t capacity = slots_.defined() ? slots_.numel() : 0;
  if (used_ == capacity) {  // grow by doubling, on the device (no host round trip)
    Tensor grown = be_->empty({capacity > 0 ? 2 * capacity : 16}, DType::F64, MemoryCategory::Workspace);
    if (used_ > 0) {
      Tensor head = grown.view(0, {used_});
      be_->copy(head, slots_.view(0, {used_}));
    }
    slots_ = grown;
  }
  be_->reduce_into(slots_, used_++, losses, Reduction::Sum);
}

double LossAccumulator::take() {
  const double host_losses = std::exchange(host_, 0.0);
  double sum = 0.0;
  if (used_ > 0) {
    std::vector<double> host(static_cast<size_t>(used_), 0.0);
    be_->copy_to_host(host.data(), slots_.view(0, {used_}));
    used_ = 0;
    for (double v : host) sum += v;
  }
  // Only where there is one: a model without host losses keeps its sum's bits.
  if (host_losses != 0.0) sum += host_losses;
  return sum;
}

}  // namespace meshtrain
