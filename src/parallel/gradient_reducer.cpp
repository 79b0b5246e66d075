// GradientReducer: per-bucket reductions launched as backward completes them, their overlap with
// the rest of backward, and the sums that finish a backward.
#include "meshtrain/parallel/gradient_reducer.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>

namespace meshtrain {

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// All-reduces `pieces` over `comm` as one packed buffer (one collective, not one per piece).
void all_reduce_packed(Backend& be, DType dtype, Communicator& comm, std::vector<Tensor>& pieces) {
  int64_t total = 0;
  for (const Tensor& t : pieces) total += t.numel();
  Tensor packed = be.empty({total}, dtype, MemoryCategory::CommBuffers);
  int64_t off = 0;
  for (const Tensor& t : pieces) {
    Tensor dst = packed.view(off, {t.numel()});
    be.copy(dst, t);
    off += t.numel();
  }
  comm.all_reduce(packed).wait();
  off = 0;
  for (Tensor& t : pieces) {
    be.copy(t, packed.view(off, {t.numel()}));
    off += t.numel();
  }
}

}  // namespace

GradientReducer::GradientReducer(StateLayout& layout, ZeroGather& gather)
    : layout_(&layout),
      gather_(&gather),
      microbatches_(layout.options().microbatches),
      reduced_(static_cast<size_t>(layout.buckets()), 0),
      completed_(static_cast<size_t>(layout.stage().params().units()), 0),
      progress_thread_(!layout.device().planning()) {}

void GradientReducer::begin_step() {
  std::fill(completed_.begin(), completed_.end(), 0);
  exposed_comm_seconds_ = 0;
  for (int b = 0; b < layout_->buckets(); ++b) {
    BucketBuffers& s = layout_->bucket(b);
    if (!layout_->shards_grads()) mark_unwritten(b);
    reduced_[b] = 0;
    if (layout_->zero() == 1) s.grad_shard = Tensor{};
    if (layout_->shards_grads()) layout_->device().fill(s.grad_shard, 0.0);
  }
}

void GradientReducer::stage_gradients(int unit) {
  if (!layout_->shards_grads()) return;
  for (int b : layout_->plan().unit_buckets[unit]) {
    BucketBuffers& s = layout_->bucket(b);
    if (s.grads.defined()) continue;
    s.grads = layout_->device().empty({layout_->plan().buckets[b].size}, layout_->state_dtype(),
                                      MemoryCategory::CommBuffers);
    layout_->point_grads(b, s.grads);
    mark_unwritten(b);
  }
}

// No pass fills a step's gradient buffers with zeros: each parameter's first writer assigns
// its gradient or zeroes it (Parameter::grad_unwritten). What no unit wrote is zeroed before
// the bucket is reduced.
void GradientReducer::mark_unwritten(int b) {
  for (Parameter* p : layout_->plan().buckets[b].params) p->grad_unwritten = true;
}

void GradientReducer::zero_unwritten(int b) {
  for (Parameter* p : layout_->plan().buckets[b].params) p->zero_grad_if_unwritten(layout_->device());
}

void GradientReducer::zero_unwritten_gradients() {
  for (int b = 0; b < layout_->buckets(); ++b)
    if (layout_->bucket(b).grads.defined()) zero_unwritten(b);
}

void GradientReducer::gradients_final(int unit) {
  ++completed_[unit];
  ++generation_;
  for (int b : layout_->plan().unit_buckets[unit]) maybe_reduce(b);
  if (layout_->shards_grads()) retire_older_than(generation_);
}

void GradientReducer::maybe_reduce(int b) {
  const std::vector<int>& units = layout_->plan().buckets[b].units;
  const int first = completed_[units.front()];
  for (int u : units)
    if (completed_[u] != first) return;
  if (layout_->shards_grads()) {
    if (layout_->bucket(b).grads.defined()) launch_reduction(b);
  } else if (!reduced_[b] && first == microbatches_) {
    launch_reduction(b);
  }
}

void GradientReducer::launch_reduction(int b) {
  BucketBuffers& s = layout_->bucket(b);
  zero_unwritten(b);
  Communicator& dp = layout_->replicas(b);
  Backend& be = layout_->device();
  const int64_t shard_size = layout_->plan().buckets[b].shard_size;
  switch (layout_->zero()) {
    case 0:
      if (layout_->options().reduce_over_dp)
        pending_.push_back({b, dp.all_reduce(s.grads), {}, {}, false, generation_});
      reduced_[b] = 1;
      break;
    case 1:
      s.grad_shard = be.empty({shard_size}, layout_->state_dtype(), MemoryCategory::CommBuffers);
      pending_.push_back({b, dp.reduce_scatter(s.grad_shard, s.grads), {}, {}, false, generation_});
      reduced_[b] = 1;
      break;
    default: {
      Tensor out = be.empty({shard_size}, layout_->state_dtype(), MemoryCategory::CommBuffers);
      Work w = dp.reduce_scatter(out, s.grads);
      pending_.push_back({b, std::move(w), s.grads, out, true, generation_});
      s.grads = Tensor{};
      layout_->point_grads(b, Tensor{});
    }
  }
}

void GradientReducer::complete(Pending& p) {
  if (p.accumulate) layout_->device().add_inplace(layout_->bucket(p.bucket).grad_shard, p.out);
}

// ZeRO 2/3 reductions hold a staging buffer (a full bucket of gradients) until they complete.
// They are retired at a fixed point — the end of the next unit's backward — not whenever a
// poll happens to see them done: each still overlaps one unit of compute (double buffering),
// the staging memory in use is the same in every run (what the planner predicts), and each
// bucket's micro-batch results are added into its shard in launch order — floating-point
// addition does not reassociate, so any other order would make a run depend on MPI's timing.
void GradientReducer::retire_older_than(int generation) {
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
  exposed_comm_seconds_ += seconds_since(start);
}

void GradientReducer::progress() {
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

void GradientReducer::finish_backward() {
  check_all_reduced();
  wait_for_reductions();
  gather_->release_unpinned();
  if (layout_->groups().tp->size() > 1) sum_partial_gradients_over_tp();
  if (layout_->stage().ties_embeddings() && layout_->groups().embedding->size() > 1)
    sum_tied_embedding_copies();
}

void GradientReducer::check_all_reduced() const {
  for (int b = 0; b < layout_->buckets(); ++b) {
    const bool missing = layout_->shards_grads() ? layout_->bucket(b).grads.defined() : !reduced_[b];
    if (missing)
      throw std::logic_error("ModelState: bucket " + std::to_string(b) + " (" +
                             layout_->plan().buckets[b].params.front()->spec.name +
                             ", ...) was not reduced: its units did not all finish backward");
  }
}

void GradientReducer::wait_for_reductions() {
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
  reductions_done_time_ = now_seconds();
  exposed_comm_seconds_ += seconds_since(wait_start);
}

// Sequence parallelism leaves each tp rank a partial gradient of the parameters applied to its
// part of the sequence (layer norms): the owned pieces of those add up over tp.
void GradientReducer::sum_partial_gradients_over_tp() {
  std::vector<Tensor> pieces;
  for (int b = 0; b < layout_->buckets(); ++b) {
    Tensor g = layout_->owned_grads(b);
    for (const OptimizerSegment& seg : layout_->bucket(b).partial_segments)
      pieces.push_back(g.view(seg.offset, {seg.count}));
  }
  if (!pieces.empty())
    all_reduce_packed(layout_->device(), layout_->state_dtype(), *layout_->groups().tp, pieces);
}

// Tied embeddings over a pipeline: the first stage's wte and the last stage's copy each hold
// part of the gradient; both get the sum.
void GradientReducer::sum_tied_embedding_copies() {
  for (int b = 0; b < layout_->buckets(); ++b) {
    if (layout_->plan().buckets[b].params.front()->spec.role != ParamRole::TokenEmbedding) continue;
    Tensor g = layout_->owned_grads(b);
    layout_->groups().embedding->all_reduce(g).wait();
  }
}

}  // namespace meshtrain
