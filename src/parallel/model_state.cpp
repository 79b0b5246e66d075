// ModelState, parameter layout: the buckets (bucket_plan.h) laid out in flat buffers, each
// bucket's range this rank owns in its replica group, the parameters' views into them, and
// ZeRO-3's gathering of a bucket's values around its use. The gradient reducer is in
// model_state_reducer.cpp, the sharded optimizer in model_state_optimizer.cpp.
#include "meshtrain/parallel/model_state.h"

#include "model_state_internal.h"

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

ModelState::ModelState(PipelineStage& stage, const StateGroups& groups,
                       const ModelStateOptions& options)
    : stage_(&stage),
      be_(&stage.backend()),
      state_be_(options.offload ? options.offload : &stage.backend()),
      state_dtype_(stage.dtype() == DType::F32 || stage.dtype() == DType::F64 ? stage.dtype()
                                                                              : DType::F32),
      groups_(groups),
      options_(options),
      progress_thread_(!stage.backend().planning()) {
  ParameterStore& store = stage.params();
  const DType dt = stage.dtype();
  const DType gt = state_dtype_;  // gradients are kept in the optimizer's precision
  // Under ZeRO each group's buckets split into one shard per rank of that group.
  auto shards = [&](ReplicaGroup g) { return options_.zero >= 1 ? groups_.replicas_of(g).size() : 1; };
  plan_ = make_bucket_plan(store, shards, options_.bucket_mb,
                           shards_params() ? BucketBy::Unit : BucketBy::Size, dt);
  completed_.assign(store.units(), 0);
  // Every bucket's group has its communicator: refused here, not at the first reduction.
  for (size_t b = 0; b < plan_.buckets.size(); ++b) replicas(static_cast<int>(b));

  if (!shards_params()) flat_values_ = be_->zeros({plan_.total_size()}, dt, MemoryCategory::Parameters);
  if (!shards_grads()) flat_grads_ = be_->zeros({plan_.total_size()}, gt, MemoryCategory::Gradients);
  int64_t offset = 0;
  const bool tp_leader = groups_.tp->rank() == 0;
  for (size_t b = 0; b < plan_.buckets.size(); ++b) {
    const Bucket& bk = plan_.buckets[b];
    auto st = std::make_unique<BucketState>();
    if (shards_params()) {
      st->value_shard = be_->zeros({bk.shard_size}, dt, MemoryCategory::Parameters);
    } else {
      st->values = flat_values_.view(offset, {bk.size});
    }
    if (shards_grads()) {
      st->grad_shard = be_->zeros({bk.shard_size}, gt, MemoryCategory::Gradients);
    } else {
      st->grads = flat_grads_.view(offset, {bk.size});
    }
    buckets_.push_back(std::move(st));
    offset += bk.size;

    BucketState& s = *buckets_.back();
    const int64_t lo = owned_begin(static_cast<int>(b)), hi = lo + owned_size(static_cast<int>(b));
    std::vector<OptimizerSegment> segments;
    for (size_t i = 0; i < bk.params.size(); ++i) {
      const Parameter& p = *bk.params[i];
      OptimizerSegment seg;
      if (!intersect(bk.offsets[i], bk.offsets[i] + p.numel(), lo, hi, seg)) continue;
      seg.decay = p.spec.decay;
      segments.push_back(seg);
      // Each element counts once in the norm: replicas over tp on tp rank 0 only, tied copies never.
      if (!p.tied_copy && (p.spec.tp_split_dim >= 0 || tp_leader)) s.norm_segments.push_back(seg);
      if (p.spec.tp_grad == TpGrad::Partial) s.partial_segments.push_back(seg);
    }
    s.optim = std::make_unique<AdamW>(*state_be_, hi - lo, gt, std::move(segments), options_.adamw);
    if (has_master())
      s.master = state_be_->zeros({hi - lo}, gt, MemoryCategory::OptimizerState);
    if (state_be_ != be_)  // offload: the gradients' landing place on the host
      s.host_grads = state_be_->zeros({hi - lo}, gt, MemoryCategory::CommBuffers);
    if (!shards_params()) point_values(static_cast<int>(b), s.values);
    if (!shards_grads()) point_grads(static_cast<int>(b), s.grads);
  }
}

// Pending reductions are waited for, before the buffers they write go, by their Work's destructor,
// which never throws: this may run while an error unwinds, and a timeout here ends the job
// through the armed abort (comm/job_abort.h).
ModelState::~ModelState() { pending_.clear(); }

int64_t ModelState::owned_begin(int b) const {
  return options_.zero >= 1 ? replicas(b).rank() * plan_.buckets[b].shard_size : 0;
}

int64_t ModelState::owned_size(int b) const {
  return options_.zero >= 1 ? plan_.buckets[b].shard_size : plan_.buckets[b].size;
}

Tensor ModelState::owned_values(int b) {
  BucketState& s = bucket(b);
  return shards_params() ? s.value_shard : s.values.view(owned_begin(b), {owned_size(b)});
}

Tensor ModelState::owned_grads(int b) {
  BucketState& s = bucket(b);
  return options_.zero >= 1 ? s.grad_shard : s.grads;
}

void ModelState::point_values(int b, const Tensor& full) {
  const Bucket& bk = plan_.buckets[b];
  for (size_t i = 0; i < bk.params.size(); ++i)
    bk.params[i]->value = full.defined() ? full.view(bk.offsets[i], bk.params[i]->shape) : Tensor{};
}

void ModelState::point_grads(int b, const Tensor& full) {
  const Bucket& bk = plan_.buckets[b];
  for (size_t i = 0; i < bk.params.size(); ++i)
    bk.params[i]->grad = full.defined() ? full.view(bk.offsets[i], bk.params[i]->shape) : Tensor{};
}

// ---- ZeRO-3 parameter gathering ------------------------------------------------------------

void ModelState::start_gather(int b) {
  BucketState& s = bucket(b);
  const Bucket& bk = plan_.buckets[b];
  Tensor full = be_->empty({bk.size}, stage_->dtype(), MemoryCategory::CommBuffers);
  Tensor slot = full.view(owned_begin(b), {bk.shard_size});
  be_->copy(slot, s.value_shard);
  s.gather = replicas(b).all_gather(full, slot);
  s.values = full;
  s.gathering = true;
}

void ModelState::ensure_gathered(int b) {
  BucketState& s = bucket(b);
  if (!s.values.defined()) start_gather(b);
  if (s.gathering) {
    s.gather.wait();
    s.gathering = false;
    point_values(b, s.values);
  }
}

void ModelState::release(int b) {
  BucketState& s = bucket(b);
  if (s.gathering) {
    s.gather.wait();
    s.gathering = false;
  }
  s.values = Tensor{};
  point_values(b, Tensor{});
}

void ModelState::release_gathered() {
  if (!shards_params()) return;
  for (size_t b = 0; b < buckets_.size(); ++b)
    if (bucket(static_cast<int>(b)).pins == 0 && bucket(static_cast<int>(b)).values.defined())
      release(static_cast<int>(b));
}

}  // namespace meshtrain
