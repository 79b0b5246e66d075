// FlatStateView: this rank's state as one flat range, for parameter servers, which keep the
// optimizer and hand values back.

#include "meshtrain/parallel/flat_state_view.h"

#include <stdexcept>
#include <string>
#include <vector>

namespace meshtrain {

namespace {
// Each bucket's segments shifted by the bucket's place in the flat range.
template <class Pick>
std::vector<OptimizerSegment> shifted(const BucketPlan& plan, Pick pick) {
  std::vector<OptimizerSegment> out;
  int64_t offset = 0;
  for (size_t b = 0; b < plan.buckets.size(); ++b) {
    for (OptimizerSegment seg : pick(static_cast<int>(b))) {
      seg.offset += offset;
      out.push_back(seg);
    }
    offset += plan.buckets[b].size;
  }
  return out;
}
}  // namespace

std::vector<OptimizerSegment> FlatStateView::segments() const {
  return shifted(layout_->plan(), [this](int b) { return optimizer_->adamw(b).segments(); });
}

std::vector<OptimizerSegment> FlatStateView::norm_segments() const {
  return shifted(layout_->plan(), [this](int b) { return layout_->bucket(b).norm_segments; });
}

void FlatStateView::require_flat(const char* what) const {
  if (layout_->zero() != 0 || layout_->offloaded())
    throw std::logic_error(std::string("ModelState::") + what + " needs ZeRO 0 without offload");
}

Tensor FlatStateView::field_of(FlatField field, int b) {
  switch (field) {
    case FlatField::Values: return optimizer_->values(b);
    case FlatField::Gradients: return layout_->bucket(b).grads;
    case FlatField::ExpAvg: return optimizer_->adamw(b).exp_avg();
    case FlatField::ExpAvgSq: break;
  }
  return optimizer_->adamw(b).exp_avg_sq();
}

void FlatStateView::read(FlatField field, void* host) {
  require_flat("read_flat");
  auto* out = static_cast<char*>(host);
  const auto elem = static_cast<int64_t>(dtype_size(layout_->state_dtype()));
  int64_t offset = 0;
  for (int b = 0; b < layout_->buckets(); ++b) {
    layout_->device().copy_to_host(out + offset * elem, field_of(field, b));
    offset += layout_->plan().buckets[b].size;
  }
}

void FlatStateView::write(FlatField field, const void* host) {
  optimizer_->pass_update_fence();
  require_flat("write_flat");
  const auto* in = static_cast<const char*>(host);
  const auto elem = static_cast<int64_t>(dtype_size(layout_->state_dtype()));
  int64_t offset = 0;
  for (int b = 0; b < layout_->buckets(); ++b) {
    Tensor t = field_of(field, b);
    layout_->device().copy_from_host(t, in + offset * elem);
    offset += layout_->plan().buckets[b].size;
  }
}

}  // namespace meshtrain
