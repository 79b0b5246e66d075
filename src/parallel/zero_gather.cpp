// ZeroGather: ZeRO-3's gathering of a bucket's values around its use, ZeRO 1/2's all-gather of
// the updated shards.
#include "meshtrain/parallel/zero_gather.h"

namespace meshtrain {

ZeroGather::ZeroGather(StateLayout& layout)
    : layout_(&layout), in_flight_(static_cast<size_t>(layout.buckets())) {}

void ZeroGather::pin(int unit, int prefetch_unit) {
  if (!layout_->shards_params()) return;
  const BucketPlan& plan = layout_->plan();
  for (int b : plan.unit_buckets[unit]) {
    ensure_gathered(b);
    ++in_flight_[b].pins;
  }
  if (prefetch_unit >= 0 && prefetch_unit < static_cast<int>(plan.unit_buckets.size()))
    for (int b : plan.unit_buckets[prefetch_unit])
      if (!layout_->bucket(b).values.defined()) start_gather(b);
}

void ZeroGather::unpin(int unit) {
  if (!layout_->shards_params()) return;
  for (int b : layout_->plan().unit_buckets[unit])
    if (--in_flight_[b].pins == 0) release(b);
}

void ZeroGather::release_unpinned() {
  if (!layout_->shards_params()) return;
  for (int b = 0; b < layout_->buckets(); ++b)
    if (in_flight_[b].pins == 0 && layout_->bucket(b).values.defined()) release(b);
}

void ZeroGather::start_gather(int b) {
  BucketBuffers& s = layout_->bucket(b);
  const Bucket& bk = layout_->plan().buckets[b];
  Backend& be = layout_->device();
  Tensor full = be.empty({bk.size}, layout_->stage().dtype(), MemoryCategory::CommBuffers);
  Tensor slot = full.view(layout_->owned_begin(b), {bk.shard_size});
  be.copy(slot, s.value_shard);
  in_flight_[b].gather = layout_->replicas(b).all_gather(full, slot);
  s.values = full;
  in_flight_[b].gathering = true;
}

void ZeroGather::ensure_gathered(int b) {
  BucketBuffers& s = layout_->bucket(b);
  if (!s.values.defined()) start_gather(b);
  if (in_flight_[b].gathering) {
    in_flight_[b].gather.wait();
    in_flight_[b].gathering = false;
    layout_->point_values(b, s.values);
  }
}

void ZeroGather::release(int b) {
  if (in_flight_[b].gathering) {
    in_flight_[b].gather.wait();
    in_flight_[b].gathering = false;
  }
  layout_->bucket(b).values = Tensor{};
  layout_->point_values(b, Tensor{});
}

void ZeroGather::gather_updated_shards() {
  if (layout_->zero() != 1 && layout_->zero() != 2) return;
  std::vector<Work> gathers;
  for (int b = 0; b < layout_->buckets(); ++b)
    gathers.push_back(layout_->replicas(b).all_gather(layout_->bucket(b).values, layout_->owned_values(b)));
  wait_all(gathers);
}

}  // namespace meshtrain
