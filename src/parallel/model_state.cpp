#include "meshtrain/parallel/model_state.h"

#include "model_state_internal.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>

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
      options_(options) {
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

// ---- hooks ---------------------------------------------------------------------------------

void ModelState::before_forward(int unit) {
  progress();
  if (!shards_params()) return;
  for (int b : plan_.unit_buckets[unit]) {
    ensure_gathered(b);
    ++bucket(b).pins;
  }
  if (unit + 1 < static_cast<int>(plan_.unit_buckets.size()))  // prefetch the next unit
    for (int b : plan_.unit_buckets[unit + 1])
      if (!bucket(b).values.defined()) start_gather(b);
}

void ModelState::after_forward(int unit) {
  if (shards_params())
    for (int b : plan_.unit_buckets[unit])
      if (--bucket(b).pins == 0) release(b);
  progress();
}

void ModelState::before_backward(int unit) {
  progress();
  if (shards_params()) {
    for (int b : plan_.unit_buckets[unit]) {
      ensure_gathered(b);
      ++bucket(b).pins;
    }
    if (unit > 0)  // backward runs units in reverse: prefetch the previous one
      for (int b : plan_.unit_buckets[unit - 1])
        if (!bucket(b).values.defined()) start_gather(b);
  }
  if (shards_grads())
    for (int b : plan_.unit_buckets[unit]) acquire_staging(b);
}

void ModelState::after_backward(int unit) {
  gradients_final(unit);
  unpin(unit);
  progress();
}

// A split backward (zero-bubble schedules): the input-gradient part no longer needs the
// parameters; the weight-gradient part needs only gradient buffers, and ends the unit's
// backward for its micro-batch.
void ModelState::after_input_backward(int unit) {
  unpin(unit);
  progress();
}

void ModelState::before_weight_backward(int unit) {
  progress();
  if (shards_grads())
    for (int b : plan_.unit_buckets[unit]) acquire_staging(b);
}

void ModelState::after_weight_backward(int unit) {
  gradients_final(unit);
  progress();
}

void ModelState::gradients_final(int unit) {
  ++completed_[unit];
  ++generation_;
  for (int b : plan_.unit_buckets[unit]) maybe_reduce(b);
  if (shards_grads()) retire_older_than(generation_);
}

void ModelState::unpin(int unit) {
  if (shards_params())
    for (int b : plan_.unit_buckets[unit])
      if (--bucket(b).pins == 0) release(b);
}

// ---- gradient reduction --------------------------------------------------------------------

void ModelState::acquire_staging(int b) {
  BucketState& s = bucket(b);
  if (s.grads.defined()) return;
  s.grads = be_->zeros({plan_.buckets[b].size}, state_dtype_, MemoryCategory::CommBuffers);
  point_grads(b, s.grads);
}

void ModelState::maybe_reduce(int b) {
  const std::vector<int>& units = plan_.buckets[b].units;
  const int first = completed_[units.front()];
  for (int u : units)
    if (completed_[u] != first) return;
  BucketState& s = bucket(b);
  if (shards_grads()) {
    if (s.grads.defined()) launch_reduction(b);
  } else if (!s.reduced && first == options_.microbatches) {
    launch_reduction(b);
  }
}

void ModelState::launch_reduction(int b) {
  BucketState& s = bucket(b);
  Communicator& dp = replicas(b);
  const DType dt = state_dtype_;
  switch (options_.zero) {
    case 0:
      if (options_.reduce_over_dp) pending_.push_back({b, dp.all_reduce(s.grads), {}, {}, false, generation_});
      s.reduced = true;
      break;
    case 1:
      s.grad_shard = be_->empty({plan_.buckets[b].shard_size}, dt, MemoryCategory::CommBuffers);
      pending_.push_back({b, dp.reduce_scatter(s.grad_shard, s.grads), {}, {}, false, generation_});
      s.reduced = true;
      break;
    default: {
      Tensor out = be_->empty({plan_.buckets[b].shard_size}, dt, MemoryCategory::CommBuffers);
      Work w = dp.reduce_scatter(out, s.grads);
      pending_.push_back({b, std::move(w), s.grads, out, true, generation_});
      s.grads = Tensor{};
      point_grads(b, Tensor{});
    }
  }
}

void ModelState::complete(Pending& p) {
  if (p.accumulate) be_->add_inplace(bucket(p.bucket).grad_shard, p.out);
}

// ZeRO 2/3 reductions hold a staging buffer (a full bucket of gradients) until they complete.
// They are retired at a fixed point — the end of the next unit's backward — not whenever a
// poll happens to see them done: each still overlaps one unit of compute (double buffering),
// the staging memory in use is the same in every run (what the planner predicts), and each
// bucket's micro-batch results are added into its shard in launch order — floating-point
// addition does not reassociate, so any other order would make a run depend on MPI's timing.
void ModelState::retire_older_than(int generation) {
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < pending_.size();) {
    if (pending_[i].generation < generation) {
      pending_[i].work.wait();
      complete(pending_[i]);
      pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
  exposed_comm_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void ModelState::progress() {
  for (size_t i = 0; i < pending_.size();) {
    if (!pending_[i].accumulate && pending_[i].work.test()) {
      complete(pending_[i]);
      pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
  // The progress thread runs exactly while reductions are in flight.
  if (pending_.empty() == progress_active_) {
    progress_active_ = !pending_.empty();
    if (progress_active_) progress_thread_.begin();
    else progress_thread_.end();
  }
}

void ModelState::begin_step() {
  std::fill(completed_.begin(), completed_.end(), 0);
  exposed_comm_seconds_ = 0;
  if (flat_grads_.defined()) be_->fill(flat_grads_, 0.0);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    BucketState& s = bucket(static_cast<int>(b));
    s.reduced = false;
    if (options_.zero == 1) s.grad_shard = Tensor{};
    if (shards_grads()) be_->fill(s.grad_shard, 0.0);
  }
}

void ModelState::finish_backward() {
  for (size_t b = 0; b < buckets_.size(); ++b) {
    BucketState& s = bucket(static_cast<int>(b));
    const bool missing = shards_grads() ? s.grads.defined() : !s.reduced;
    if (missing)
      throw std::logic_error("ModelState: bucket " + std::to_string(b) + " (" +
                             plan_.buckets[b].params.front()->spec.name +
                             ", ...) was not reduced: its units did not all finish backward");
  }
  const auto wait_start = std::chrono::steady_clock::now();
  backward_end_time_ = std::chrono::duration<double>(wait_start.time_since_epoch()).count();
  // The training thread now drives MPI itself: a second thread polling would only contend for
  // MPI's progress lock.
  if (progress_active_) {
    progress_thread_.end();
    progress_active_ = false;
  }
  for (Pending& p : pending_) {
    p.work.wait();
    complete(p);
  }
  pending_.clear();
  reductions_done_time_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  exposed_comm_seconds_ +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wait_start).count();
  release_gathered();

  if (groups_.tp->size() > 1) {
    std::vector<Tensor> pieces;
    for (size_t b = 0; b < buckets_.size(); ++b) {
      Tensor g = owned_grads(static_cast<int>(b));
      for (const OptimizerSegment& seg : bucket(static_cast<int>(b)).partial_segments)
        pieces.push_back(g.view(seg.offset, {seg.count}));
    }
    if (!pieces.empty()) all_reduce_segments(*groups_.tp, pieces);
  }
  // Tied embeddings over a pipeline: the first stage's wte and the last stage's copy each hold
  // part of the gradient; both get the sum.
  if (stage_->ties_embeddings() && groups_.embedding->size() > 1) {
    for (size_t b = 0; b < buckets_.size(); ++b) {
      if (plan_.buckets[b].params.front()->spec.role != ParamRole::TokenEmbedding) continue;
      Tensor g = owned_grads(static_cast<int>(b));
      groups_.embedding->all_reduce(g).wait();
    }
  }
}

void ModelState::all_reduce_segments(Communicator& comm, std::vector<Tensor>& pieces) {
  int64_t total = 0;
  for (const Tensor& t : pieces) total += t.numel();
  Tensor packed = be_->empty({total}, state_dtype_, MemoryCategory::CommBuffers);
  int64_t off = 0;
  for (const Tensor& t : pieces) {
    Tensor dst = packed.view(off, {t.numel()});
    be_->copy(dst, t);
    off += t.numel();
  }
  comm.all_reduce(packed).wait();
  off = 0;
  for (Tensor& t : pieces) {
    be_->copy(t, packed.view(off, {t.numel()}));
    off += t.numel();
  }
}

}  // namespace meshtrain
