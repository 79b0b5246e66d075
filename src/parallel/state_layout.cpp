// StateLayout: the buckets laid out in flat buffers, the owned ranges and the parameters' views.
#include "meshtrain/parallel/state_layout.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace meshtrain {

Communicator& StateGroups::replicas_of(ReplicaGroup group) const {
  Communicator* comm = group == ReplicaGroup::ExpertData ? expert_data : dp;
  if (!comm)
    throw std::invalid_argument(
        std::string("ModelState: a parameter is replicated over the ") +
        (group == ReplicaGroup::ExpertData ? "expert-data" : "data") +
        " group, but no communicator for it was given (hint: StateGroups::" +
        (group == ReplicaGroup::ExpertData ? "expert_data" : "dp") + " must be set)");
  return *comm;
}

bool intersect(int64_t begin, int64_t end, int64_t lo, int64_t hi, OptimizerSegment& out) {
  const int64_t a = std::max(begin, lo), b = std::min(end, hi);
  if (a >= b) return false;
  out.offset = a - lo;
  out.count = b - a;
  return true;
}

StateLayout::StateLayout(PipelineStage& stage, const StateGroups& groups,
                         const ModelStateOptions& options)
    : stage_(&stage),
      be_(&stage.backend()),
      state_be_(options.offload ? options.offload : &stage.backend()),
      state_dtype_(stage.dtype() == DType::F32 || stage.dtype() == DType::F64 ? stage.dtype()
                                                                              : DType::F32),
      groups_(groups),
      options_(options) {
  // Under ZeRO each group's buckets split into one shard per rank of that group.
  auto shards = [&](ReplicaGroup g) { return options_.zero >= 1 ? groups_.replicas_of(g).size() : 1; };
  plan_ = make_bucket_plan(stage.params(), shards, options_.bucket_mb,
                           shards_params() ? BucketBy::Unit : BucketBy::Size, stage.dtype());
  // Every bucket's group has its communicator: refused here, not at the first reduction.
  for (size_t b = 0; b < plan_.buckets.size(); ++b) replicas(static_cast<int>(b));

  // Gradients are kept in the optimizer's precision.
  if (!shards_params())
    flat_values_ = be_->zeros({plan_.total_size()}, stage.dtype(), MemoryCategory::Parameters);
  if (!shards_grads())
    flat_grads_ = be_->zeros({plan_.total_size()}, state_dtype_, MemoryCategory::Gradients);
  buffers_.resize(plan_.buckets.size());
  int64_t offset = 0;
  for (int b = 0; b < buckets(); ++b) {
    lay_out_bucket(b, offset);
    find_segments(b);
    offset += plan_.buckets[b].size;
  }
}

void StateLayout::lay_out_bucket(int b, int64_t offset) {
  const Bucket& bk = plan_.buckets[b];
  BucketBuffers& s = bucket(b);
  if (shards_params()) {
    s.value_shard = be_->zeros({bk.shard_size}, stage_->dtype(), MemoryCategory::Parameters);
  } else {
    s.values = flat_values_.view(offset, {bk.size});
    point_values(b, s.values);
  }
  if (shards_grads()) {
    s.grad_shard = be_->zeros({bk.shard_size}, state_dtype_, MemoryCategory::Gradients);
  } else {
    s.grads = flat_grads_.view(offset, {bk.size});
    point_grads(b, s.grads);
  }
}

void StateLayout::find_segments(int b) {
  const Bucket& bk = plan_.buckets[b];
  BucketBuffers& s = bucket(b);
  const bool tp_leader = groups_.tp->rank() == 0;
  const int64_t lo = owned_begin(b), hi = lo + owned_size(b);
  for (size_t i = 0; i < bk.params.size(); ++i) {
    const Parameter& p = *bk.params[i];
    OptimizerSegment seg;
    if (!intersect(bk.offsets[i], bk.offsets[i] + p.numel(), lo, hi, seg)) continue;
    seg.decay = p.spec.decay;
    s.decay_segments.push_back(seg);
    // Each element counts once in the norm: replicas over tp on tp rank 0 only, tied copies never.
    if (!p.tied_copy && (p.spec.tp_split_dim >= 0 || tp_leader)) s.norm_segments.push_back(seg);
    if (p.spec.tp_grad == TpGrad::Partial) s.partial_segments.push_back(seg);
  }
}

int64_t StateLayout::owned_begin(int b) const {
  return options_.zero >= 1 ? replicas(b).rank() * plan_.buckets[b].shard_size : 0;
}

int64_t StateLayout::owned_size(int b) const {
  return options_.zero >= 1 ? plan_.buckets[b].shard_size : plan_.buckets[b].size;
}

Tensor StateLayout::owned_values(int b) {
  BucketBuffers& s = bucket(b);
  return shards_params() ? s.value_shard : s.values.view(owned_begin(b), {owned_size(b)});
}

Tensor StateLayout::owned_grads(int b) {
  BucketBuffers& s = bucket(b);
  return options_.zero >= 1 ? s.grad_shard : s.grads;
}

void StateLayout::point_values(int b, const Tensor& full) {
  const Bucket& bk = plan_.buckets[b];
  for (size_t i = 0; i < bk.params.size(); ++i)
    bk.params[i]->value = full.defined() ? full.view(bk.offsets[i], bk.params[i]->shape) : Tensor{};
}

void StateLayout::point_grads(int b, const Tensor& full) {
  const Bucket& bk = plan_.buckets[b];
  for (size_t i = 0; i < bk.params.size(); ++i)
    bk.params[i]->grad = full.defined() ? full.view(bk.offsets[i], bk.params[i]->shape) : Tensor{};
}

}  // namespace meshtrain
