#pragma once
// FlatStateView: the parameter servers' view of ModelState (asynchronous data parallelism,
// parallel/parameter_server.h): this rank's values, gradients and moments as one flat range,
// the buckets one after another in the optimizer's dtype. Only under ZeRO 0 without offload,
// where every bucket is whole and on the device.

#include <cstdint>
#include <vector>

#include "meshtrain/parallel/sharded_optimizer.h"
#include "meshtrain/parallel/state_layout.h"

namespace meshtrain {

// One field of this rank's state as one flat range.
enum class FlatField { Values, Gradients, ExpAvg, ExpAvgSq };

class FlatStateView {
 public:
  FlatStateView(StateLayout& layout, ShardedOptimizer& optimizer)
      : layout_(&layout), optimizer_(&optimizer) {}

  int64_t size() const { return layout_->plan().total_size(); }
  // Its AdamW segments (where weight decay applies) and its norm segments (each element of the
  // grid counted once), in flat offsets.
  std::vector<OptimizerSegment> segments() const;
  std::vector<OptimizerSegment> norm_segments() const;
  // Host copies in and out. Writing Values sets the optimizer's values; sync_after_load() then
  // brings them into the parameters.
  void read(FlatField field, void* host);
  void write(FlatField field, const void* host);

 private:
  void require_flat(const char* what) const;
  Tensor field_of(FlatField field, int b);

  StateLayout* layout_;
  ShardedOptimizer* optimizer_;
};

}  // namespace meshtrain
