// ModelState, the gradient reducer: the hooks that follow each unit's forward and backward
// (pinning ZeRO-3's gathered values, handing out ZeRO-2/3 staging buffers), each bucket's
// reduction over its replica group once every unit writing it is done (all-reduce under ZeRO 0,
// reduce-scatter above), overlapped with the rest of backward, and the sums that finish a
// backward (sequence-parallel partial gradients over tp, the tied embedding's two copies).
#include "meshtrain/parallel/model_state.h"

#include "model_state_internal.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>

namespace meshtrain {

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
  s.grads = be_->empty({plan_.buckets[b].size}, state_dtype_, MemoryCategory::CommBuffers);
  point_grads(b, s.grads);
  mark_unwritten(b);
}

// No pass fills a step's gradient buffers with zeros: each parameter's first writer assigns
// its gradient or zeroes it (Parameter::grad_unwritten). What no unit wrote is zeroed before
// the bucket is reduced.
void ModelState::mark_unwritten(int b) {
  for (Parameter* p : plan_.buckets[b].params) p->grad_unwritten = true;
}

void ModelState::zero_unwritten(int b) {
  for (Parameter* p : plan_.buckets[b].params) p->zero_grad_if_unwritten(*be_);
}

void ModelState::zero_unwritten_gradients() {
  for (size_t b = 0; b < buckets_.size(); ++b)
    if (bucket(static_cast<int>(b)).grads.defined()) zero_unwritten(static_cast<int>(b));
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
  zero_unwritten(b);
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
  for (size_t b = 0; b < buckets_.size(); ++b) {
    BucketState& s = bucket(static_cast<int>(b));
    if (flat_grads_.defined()) mark_unwritten(static_cast<int>(b));
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
