#pragma once
// StateLayout: where this rank's training state lives, and nothing that changes it. The buckets
// (bucket_plan.h) laid out one after another in flat buffers, each bucket's range this rank owns
// in its replica group (ZeRO, Rajbhandari et al., arXiv 1910.02054), the parameters' views into
// them, and the segments of an owned range that weight decay, the gradient norm and the
// sequence-parallel sum look at. The parts of ModelState (model_state.h) that gather, reduce and
// update share one StateLayout; it is not a UnitHooks and runs no collective.
//
//   zero  parameters (values)       gradients (grads)
//   0     full, flat                 full, flat
//   1     full, flat                 full, flat; grad_shard: the step's reduce-scatter result
//   2     full, flat                 staging per bucket; grad_shard: the accumulated shard
//   3     value_shard (+ gathered)   staging per bucket; grad_shard: the accumulated shard

#include <cstdint>
#include <vector>

#include "meshtrain/comm/communicator.h"
#include "meshtrain/model/pipeline_stage.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/optim/muon_hyper.h"
#include "meshtrain/parallel/bucket_plan.h"

namespace meshtrain {

struct StateGroups {
  Communicator* dp = nullptr;  // the data group (x context parallel): ReplicaGroup::Data
  Communicator* tp = nullptr;
  Communicator* pp = nullptr;
  Communicator* embedding = nullptr;  // first + last stage (tied embeddings), else size 1
  // ReplicaGroup::ExpertData's replicas; null where no parameter carries that group.
  Communicator* expert_data = nullptr;
  // The expert group (parallel.ep): its ranks hold different experts, whose gradients the norm
  // adds up over it; null without expert parallelism.
  Communicator* expert = nullptr;

  // The communicator a parameter of `group` is reduced and sharded over.
  Communicator& replicas_of(ReplicaGroup group) const;
};

struct ModelStateOptions {
  int zero = 0;
  double bucket_mb = 25.0;
  AdamWHyper adamw;
  // Muon for the hidden matrices (ParamRole::HiddenMatrix), AdamW for the rest (any ZeRO stage;
  // the deck refuses offload and parameter servers: config/deck.cpp).
  OptimizerKind optimizer = OptimizerKind::AdamW;
  MuonHyper muon;
  int microbatches = 1;  // backward passes per unit per step
  // Where the optimizer's state lives: null, with the parameters; or this host backend (pinned
  // memory): master weights and moments are updated on the CPU (parallel.offload = "optimizer").
  Backend* offload = nullptr;
  // False under asynchronous data parallelism: the gradient stays this replica's (ZeRO 0), for
  // the parameter servers to sum.
  bool reduce_over_dp = true;
};

// One bucket's buffers; which of them exist depends on the ZeRO stage (table above).
struct BucketBuffers {
  Tensor values;       // full bucket: a view of the flat values (zero <= 2), or the gathered copy
  Tensor value_shard;  // zero 3: this rank's persistent shard
  Tensor grads;        // zero <= 1: a view of the flat gradients; zero >= 2: the staging buffer
  Tensor grad_shard;   // zero 1: this step's reduce-scatter result; zero >= 2: accumulated shard
  // Pieces of the owned range (offsets relative to it): every parameter's, with its weight decay
  // (the optimizer's segments); those the gradient norm counts (each element of the grid once);
  // the sequence-parallel partial gradients summed over tp.
  std::vector<OptimizerSegment> decay_segments, norm_segments, partial_segments;
};

class StateLayout {
 public:
  StateLayout(PipelineStage& stage, const StateGroups& groups, const ModelStateOptions& options);

  PipelineStage& stage() const { return *stage_; }
  Backend& device() const { return *be_; }
  // Where master weights and moments live: the device, or the offload host.
  Backend& state_backend() const { return *state_be_; }
  // The optimizer's (and the gradients') element type: fp32 under bf16, else the parameters'.
  DType state_dtype() const { return state_dtype_; }
  const StateGroups& groups() const { return groups_; }
  const ModelStateOptions& options() const { return options_; }
  int zero() const { return options_.zero; }
  bool shards_params() const { return options_.zero >= 3; }
  bool shards_grads() const { return options_.zero >= 2; }
  bool offloaded() const { return state_be_ != be_; }
  // The optimizer keeps its own values (master weights), apart from the parameters'.
  bool has_master() const { return offloaded() || state_dtype_ != stage_->dtype(); }

  const BucketPlan& plan() const { return plan_; }
  int buckets() const { return static_cast<int>(buffers_.size()); }
  BucketBuffers& bucket(int b) { return buffers_[static_cast<size_t>(b)]; }
  const BucketBuffers& bucket(int b) const { return buffers_[static_cast<size_t>(b)]; }
  // The group bucket b is reduced and sharded over (its parameters' ReplicaGroup).
  Communicator& replicas(int b) const { return groups_.replicas_of(plan_.buckets[b].group); }

  // The range of bucket b this rank owns: its shard under ZeRO >= 1, else the whole bucket.
  int64_t owned_begin(int b) const;
  int64_t owned_size(int b) const;
  Tensor owned_values(int b);
  Tensor owned_grads(int b);
  // Points bucket b's parameters' values (gradients) into `full`, or at nothing if undefined.
  void point_values(int b, const Tensor& full);
  void point_grads(int b, const Tensor& full);

 private:
  void lay_out_bucket(int b, int64_t offset);
  void find_segments(int b);

  PipelineStage* stage_;  // what the parameters belong to: any model family
  Backend* be_;
  Backend* state_be_;
  DType state_dtype_;
  StateGroups groups_;
  ModelStateOptions options_;
  BucketPlan plan_;
  std::vector<BucketBuffers> buffers_;
  Tensor flat_values_, flat_grads_;
};

// [begin, end) of a parameter inside its bucket, intersected with [lo, hi), relative to lo.
bool intersect(int64_t begin, int64_t end, int64_t lo, int64_t hi, OptimizerSegment& out);

}  // namespace meshtrain
