// ModelState, the sharded optimizer: initial values, the global gradient norm, the AdamW step
// on this rank's shard of each bucket (ZeRO 1-3; everything under ZeRO 0), with fp32 master
// weights under bf16 and the host update when the optimizer is offloaded, the all-gather of the
// updated shards, and the owned pieces a checkpoint reads and writes.

#include <cmath>
#include <future>
#include <vector>

#include "meshtrain/parallel/model_state.h"
#include "model_state_internal.h"

namespace meshtrain {

Tensor ModelState::optimizer_values(int b) {
  return has_master() ? bucket(b).master : owned_values(b);
}

// Master weights (state dtype, on the state backend) -> the parameters' owned range (parameter
// dtype, on the device). A cast on the device, or a host cast then a copy when offloaded.
void ModelState::upload_master(int b) {
  Tensor dst = owned_values(b);
  const Tensor& master = bucket(b).master;
  if (state_be_ == be_) {
    be_->cast(dst, master);
    return;
  }
  if (dst.dtype() == master.dtype()) {
    be_->copy_from_host(dst, master.raw());
    return;
  }
  Tensor host = state_be_->empty(master.shape(), dst.dtype(), MemoryCategory::CommBuffers);
  state_be_->cast(host, master);
  be_->copy_from_host(dst, host.raw());
}

void ModelState::pass_update_fence() {
  if (!update_fence_) return;
  const std::function<void()> fence = std::move(update_fence_);
  update_fence_ = nullptr;
  fence();
}

void ModelState::initialize(uint64_t seed) {
  pass_update_fence();
  const DType dt = stage_->dtype();
  for (size_t b = 0; b < plan_.buckets.size(); ++b) {
    const Bucket& bk = plan_.buckets[b];
    BucketState& s = bucket(static_cast<int>(b));
    // The whole bucket in the optimizer's precision on the host, then where it belongs.
    std::vector<char> host(static_cast<size_t>(bk.size) * dtype_size(state_dtype_), 0);
    for (size_t i = 0; i < bk.params.size(); ++i) {
      const std::vector<char> v = initial_values(*bk.params[i], seed, state_dtype_);
      std::copy(v.begin(), v.end(), host.begin() + bk.offsets[i] * static_cast<int64_t>(dtype_size(state_dtype_)));
    }
    const int64_t lo = owned_begin(static_cast<int>(b));
    if (has_master()) {
      state_be_->copy_from_host(s.master, host.data() + lo * static_cast<int64_t>(dtype_size(state_dtype_)));
      if (!shards_params()) {  // every rank holds the full bucket of parameters
        Tensor full = be_->empty({bk.size}, state_dtype_, MemoryCategory::Workspace);
        be_->copy_from_host(full, host.data());
        be_->cast(s.values, full);
      } else {
        upload_master(static_cast<int>(b));
      }
    } else if (!shards_params()) {
      be_->copy_from_host(s.values, host.data());
    } else {
      be_->copy_from_host(s.value_shard, host.data() + lo * static_cast<int64_t>(dtype_size(dt)));
    }
  }
}

// Every segment's sum of squares goes into one slot of a device buffer, read with one copy:
// reading each segment's value as it is computed would drain the device once per segment
// (hundreds per step for a real model), and a bucket's segments go to the device together. The host then adds the slots in segment order, as the
// per-segment reads did, so the norm keeps its bits.
double ModelState::grad_norm() {
  int64_t segments = 0;
  for (const auto& s : buckets_) segments += static_cast<int64_t>(s->norm_segments.size());
  std::vector<double> squares(static_cast<size_t>(segments), 0.0);
  if (segments > 0) {
    Tensor slots = be_->empty({segments}, DType::F64, MemoryCategory::Workspace);
    int64_t slot = 0;
    for (size_t b = 0; b < buckets_.size(); ++b) {
      const std::vector<OptimizerSegment>& segs = bucket(static_cast<int>(b)).norm_segments;
      std::vector<FlatPiece> pieces;
      for (const OptimizerSegment& seg : segs) pieces.push_back({seg.offset, seg.count});
      be_->reduce_pieces_into(slots, slot, owned_grads(static_cast<int>(b)), pieces,
                              Reduction::SumSquares);
      slot += static_cast<int64_t>(pieces.size());
    }
    be_->copy_to_host(squares.data(), slots);
  }
  // The slots in segment order, the experts' apart: under ZeRO 0 those differ between the
  // expert ranks (each holds its own experts) and add up over the expert group.
  double local = 0, experts = 0;
  size_t slot_index = 0;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const bool expert = plan_.buckets[b].group == ReplicaGroup::ExpertData;
    for (size_t i = 0; i < bucket(static_cast<int>(b)).norm_segments.size(); ++i)
      (expert ? experts : local) += squares[slot_index++];
  }
  if (options_.zero == 0 && groups_.expert) experts = groups_.expert->all_reduce_scalar(experts);
  local += experts;
  // Under ZeRO each element is owned by one rank of its replica group, and every group's ranks
  // lie within the data group (an expert-data group is a part of it, the expert group's ranks
  // holding the others' experts), so one sum over the data group counts each element once,
  // whatever its group.
  if (options_.zero >= 1) local = groups_.dp->all_reduce_scalar(local);
  local = groups_.tp->all_reduce_scalar(local);
  local = groups_.pp->all_reduce_scalar(local);
  return std::sqrt(local);
}

void ModelState::optimizer_step(double lr, double grad_scale) {
  pass_update_fence();
  const int n = static_cast<int>(buckets_.size());
  if (state_be_ == be_) {
    // Under bf16 the update writes the parameters from the masters as it goes: one pass over
    // the bucket, not an update then a cast (upload_master) that reads the masters again.
    for (int b = 0; b < n; ++b) {
      Tensor values = optimizer_values(b);
      Tensor rounded = has_master() ? owned_values(b) : Tensor{};
      bucket(b).optim->step(values, owned_grads(b), lr, grad_scale,
                            has_master() ? &rounded : nullptr);
    }
  } else {
    // Offload, pipelined over buckets: while the host updates bucket b, the training thread
    // copies bucket b+1's gradients down and bucket b-1's new parameters up.
    std::future<void> updating;
    for (int b = 0; b <= n; ++b) {
      if (b < n) be_->copy_to_host(bucket(b).host_grads.raw(), owned_grads(b));
      if (updating.valid()) {
        updating.get();
        upload_master(b - 1);
      }
      if (b < n)
        updating = std::async(std::launch::async, [this, b, lr, grad_scale] {
          BucketState& s = bucket(b);
          s.optim->step(s.master, s.host_grads, lr, grad_scale);
        });
    }
  }
  gather_parameters();
  if (options_.zero == 1)
    for (auto& s : buckets_) s->grad_shard = Tensor{};
}

void ModelState::sync_after_load() {
  pass_update_fence();
  if (has_master())
    for (size_t b = 0; b < buckets_.size(); ++b) upload_master(static_cast<int>(b));
  gather_parameters();
}

// ZeRO 1/2: every rank updated its shard of the parameters; all-gather the buckets in place.
void ModelState::gather_parameters() {
  if (options_.zero != 1 && options_.zero != 2) return;
  std::vector<Work> gathers;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    BucketState& s = bucket(static_cast<int>(b));
    gathers.push_back(replicas(static_cast<int>(b)).all_gather(s.values, owned_values(static_cast<int>(b))));
  }
  wait_all(gathers);
}

int64_t ModelState::steps_taken() const {
  return buckets_.empty() ? 0 : buckets_.front()->optim->steps_taken();
}

void ModelState::set_steps_taken(int64_t steps) {
  for (auto& s : buckets_) s->optim->set_steps_taken(steps);
}

std::vector<OwnedPiece> ModelState::owned_pieces() {
  std::vector<OwnedPiece> out;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const Bucket& bk = plan_.buckets[b];
    BucketState& s = bucket(static_cast<int>(b));
    const int64_t lo = owned_begin(static_cast<int>(b)), hi = lo + owned_size(static_cast<int>(b));
    Tensor values = optimizer_values(static_cast<int>(b));
    for (size_t i = 0; i < bk.params.size(); ++i) {
      OptimizerSegment seg;
      if (!intersect(bk.offsets[i], bk.offsets[i] + bk.params[i]->numel(), lo, hi, seg)) continue;
      OwnedPiece piece;
      piece.param = bk.params[i];
      piece.local_begin = lo + seg.offset - bk.offsets[i];
      piece.count = seg.count;
      piece.value = values.view(seg.offset, {seg.count});
      piece.exp_avg = s.optim->exp_avg().view(seg.offset, {seg.count});
      piece.exp_avg_sq = s.optim->exp_avg_sq().view(seg.offset, {seg.count});
      piece.backend = state_be_;
      const Parameter& p = *bk.params[i];
      piece.primary = (options_.zero >= 1 || replicas(static_cast<int>(b)).rank() == 0) &&
                      (p.spec.tp_split_dim >= 0 || groups_.tp->rank() == 0) && !p.tied_copy;
      out.push_back(piece);
    }
  }
  return out;
}

}  // namespace meshtrain
