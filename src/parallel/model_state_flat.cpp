// ModelState, flat view: this rank's values, gradients and moments as one range, for parameter
// servers (asynchronous data parallelism), which keep the optimizer and hand values back.

#include <stdexcept>
#include <vector>

#include "meshtrain/parallel/model_state.h"
#include "model_state_internal.h"

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

std::vector<OptimizerSegment> ModelState::flat_segments() const {
  return shifted(plan_, [this](int b) { return buckets_[static_cast<size_t>(b)]->optim->segments(); });
}

std::vector<OptimizerSegment> ModelState::flat_norm_segments() const {
  return shifted(plan_, [this](int b) { return buckets_[static_cast<size_t>(b)]->norm_segments; });
}

void ModelState::read_flat(FlatField field, void* host) {
  if (options_.zero != 0 || state_be_ != be_)
    throw std::logic_error("ModelState::read_flat needs ZeRO 0 without offload");
  auto* out = static_cast<char*>(host);
  const auto elem = static_cast<int64_t>(dtype_size(state_dtype_));
  int64_t offset = 0;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    BucketState& s = bucket(static_cast<int>(b));
    const Tensor t = field == FlatField::Values      ? optimizer_values(static_cast<int>(b))
                     : field == FlatField::Gradients ? s.grads
                     : field == FlatField::ExpAvg    ? s.optim->exp_avg()
                                                     : s.optim->exp_avg_sq();
    be_->copy_to_host(out + offset * elem, t);
    offset += plan_.buckets[b].size;
  }
}

void ModelState::write_flat(FlatField field, const void* host) {
  pass_update_fence();
  if (options_.zero != 0 || state_be_ != be_)
    throw std::logic_error("ModelState::write_flat needs ZeRO 0 without offload");
  const auto* in = static_cast<const char*>(host);
  const auto elem = static_cast<int64_t>(dtype_size(state_dtype_));
  int64_t offset = 0;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    BucketState& s = bucket(static_cast<int>(b));
    Tensor t = field == FlatField::Values      ? optimizer_values(static_cast<int>(b))
               : field == FlatField::Gradients ? s.grads
               : field == FlatField::ExpAvg    ? s.optim->exp_avg()
                                               : s.optim->exp_avg_sq();
    be_->copy_from_host(t, in + offset * elem);
    offset += plan_.buckets[b].size;
  }
}

}  // namespace meshtrain
