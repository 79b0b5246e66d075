#pragma once
// ModelState owns this rank's training state — parameters, gradients, optimizer moments — and is
// the model's UnitHooks. It is a thin owner of parts, one responsibility each (ZeRO, Rajbhandari
// et al., arXiv 1910.02054):
//   StateLayout       the buckets in flat buffers, the owned ranges, the parameters' views
//   ZeroGather        ZeRO-3's gathers around a unit's use; ZeRO 1/2's gather after the update
//   GradientReducer   per-bucket reductions overlapped with backward; finishing a backward
//   ShardedOptimizer  initial values, the gradient norm, AdamW on the owned ranges (masters,
//                     offload)
//   owned_pieces      the checkpoint's view;  StateIntegrity: replica hashes and bit flips;
//   FlatStateView     the parameter servers' view
//
//   zero  parameters         gradients                     optimizer (AdamW m, v)
//   0     full               full, all-reduced             full
//   1     full, all-gathered  full, reduce-scattered        shard
//   2     full, all-gathered  shard (per-bucket staging)    shard
//   3     shard, gathered     shard (per-bucket staging)    shard
//         per unit on use
//
// As UnitHooks it gathers a unit's parameters before the unit runs (ZeRO-3, with the next unit
// prefetched), gives ZeRO-2/3 staging buffers to a backward, and hands each finished backward to
// the reducer. The calls below that only forward to a part are kept for the trainer and the
// checkpointer, which see one state.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "meshtrain/model/pipeline_stage.h"
#include "meshtrain/parallel/flat_state_view.h"
#include "meshtrain/parallel/gradient_reducer.h"
#include "meshtrain/parallel/owned_pieces.h"
#include "meshtrain/parallel/row_scaling.h"
#include "meshtrain/parallel/sharded_optimizer.h"
#include "meshtrain/parallel/state_integrity.h"
#include "meshtrain/parallel/state_layout.h"
#include "meshtrain/parallel/zero_gather.h"

namespace meshtrain {

class ModelState final : public UnitHooks {
 public:
  ModelState(PipelineStage& stage, const StateGroups& groups, const ModelStateOptions& options);

  void before_forward(int unit) override;
  void after_forward(int unit) override;
  void before_backward(int unit) override;
  void after_backward(int unit) override;
  void after_input_backward(int unit) override;
  void before_weight_backward(int unit) override;
  void after_weight_backward(int unit) override;

  StateLayout& layout() { return layout_; }
  ZeroGather& gather() { return gather_; }
  GradientReducer& reducer() { return reducer_; }
  const GradientReducer& reducer() const { return reducer_; }
  ShardedOptimizer& optimizer() { return optimizer_; }
  StateIntegrity& integrity() { return integrity_; }
  FlatStateView& flat() { return flat_; }

  // The step, for the trainer (see the parts for what each does).
  void initialize(uint64_t seed) { optimizer_.initialize(seed); }
  void begin_step() { reducer_.begin_step(); }
  void finish_backward() { reducer_.finish_backward(); }
  double grad_norm() { return optimizer_.grad_norm(); }
  void optimizer_step(double lr, double grad_scale) { optimizer_.step(lr, grad_scale); }
  // Scales rows of parameters wherever their values live, then refreshes them (row_scaling.h).
  void scale_rows(const std::vector<RowScale>& scales) { scale_parameter_rows(layout_, optimizer_, scales); }
  // Drops gathered parameters (ZeRO-3) outside a step, e.g. after an evaluation pass.
  void release_gathered() { gather_.release_unpinned(); }
  // Backward passes per unit per step from the next step on (uneven data-parallel shares,
  // train/work_balance.h; ZeRO 0 and 1 only, which reduce once per step).
  void set_microbatches(int microbatches) { reducer_.set_microbatches(microbatches); }

  // For checkpoints: the owned pieces (owned_pieces.h), the step count, the optimizer's dtype,
  // and the refresh after values of owned pieces were overwritten. An asynchronous checkpoint
  // copying the pieces on another thread sets a fence that the first writer of them runs
  // (ShardedOptimizer::set_update_fence).
  std::vector<OwnedPiece> owned_pieces() { return meshtrain::owned_pieces(layout_, optimizer_); }
  int64_t steps_taken() const { return optimizer_.steps_taken(); }
  void set_steps_taken(int64_t steps) { optimizer_.set_steps_taken(steps); }
  DType state_dtype() const { return layout_.state_dtype(); }
  void sync_after_load() { optimizer_.sync_after_load(); }
  void set_update_fence(std::function<void()> fence) { optimizer_.set_update_fence(std::move(fence)); }
  bool update_fenced() const { return optimizer_.update_fenced(); }

  // Integrity checks and fault injection (state_integrity.h).
  std::vector<ReplicaRecord> replica_records(ReplicaScope scope) { return integrity_.replica_records(scope); }
  uint64_t gradient_hash() { return integrity_.gradient_hash(); }
  bool flip_parameter_bit(const std::string& name, int64_t index, int bit) {
    return integrity_.flip_parameter_bit(name, index, bit);
  }
  void flip_gradient_bit(int64_t index, int bit) { integrity_.flip_gradient_bit(index, bit); }

  // The parameter servers' flat view (flat_state_view.h).
  int64_t flat_size() const { return flat_.size(); }
  std::vector<OptimizerSegment> flat_segments() const { return flat_.segments(); }
  std::vector<OptimizerSegment> flat_norm_segments() const { return flat_.norm_segments(); }
  void read_flat(FlatField field, void* host) { flat_.read(field, host); }
  void write_flat(FlatField field, const void* host) { flat_.write(field, host); }

  // What the parameters belong to (checkpoint/ saves and restores its buffers by name).
  PipelineStage& stage() { return layout_.stage(); }
 private:
  // Declared in dependency order: destroyed in reverse, the reducer's pending reductions and
  // the gathers in flight complete before the layout's buffers go.
  StateLayout layout_;
  ZeroGather gather_;
  GradientReducer reducer_;
  ShardedOptimizer optimizer_;
  StateIntegrity integrity_;
  FlatStateView flat_;
};

}  // namespace meshtrain
