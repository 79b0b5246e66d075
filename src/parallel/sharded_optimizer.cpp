// ShardedOptimizer: initial values, the global gradient norm, the AdamW step with master weights
// and the offloaded update.
#include "meshtrain/parallel/sharded_optimizer.h"

#include <cmath>
#include <future>
#include <vector>

#include "meshtrain/optim/muon.h"

namespace meshtrain {

ShardedOptimizer::ShardedOptimizer(StateLayout& layout, ZeroGather& gather)
    : layout_(&layout), gather_(&gather) {
  Backend& state_be = layout.state_backend();
  const DType dt = layout.state_dtype();
  for (int b = 0; b < layout.buckets(); ++b) {
    const int64_t owned = layout.owned_size(b);
    adamw_.push_back(std::make_unique<AdamW>(state_be, owned, dt, adamw_segments(layout, b),
                                             layout.options().adamw));
    master_.push_back(layout.has_master() ? state_be.zeros({owned}, dt, MemoryCategory::OptimizerState)
                                          : Tensor{});
    host_grads_.push_back(layout.offloaded() ? state_be.zeros({owned}, dt, MemoryCategory::CommBuffers)
                                             : Tensor{});
  }
  muon_ = meshtrain::muon_matrices(layout);
}

Tensor ShardedOptimizer::values(int b) {
  return layout_->has_master() ? master_[b] : layout_->owned_values(b);
}

// Master weights (state dtype, on the state backend) -> the parameters' owned range (parameter
// dtype, on the device). A cast on the device, or a host cast then a copy when offloaded.
void ShardedOptimizer::upload_master(int b) {
  Backend& be = layout_->device();
  Tensor dst = layout_->owned_values(b);
  const Tensor& master = master_[b];
  if (!layout_->offloaded()) {
    be.cast(dst, master);
    return;
  }
  if (dst.dtype() == master.dtype()) {
    be.copy_from_host(dst, master.raw());
    return;
  }
  Tensor host = layout_->state_backend().empty(master.shape(), dst.dtype(), MemoryCategory::CommBuffers);
  layout_->state_backend().cast(host, master);
  be.copy_from_host(dst, host.raw());
}

void ShardedOptimizer::pass_update_fence() {
  if (!update_fence_) return;
  const std::function<void()> fence = std::move(update_fence_);
  update_fence_ = nullptr;
  fence();
}

void ShardedOptimizer::initialize(uint64_t seed) {
  pass_update_fence();
  for (int b = 0; b < layout_->buckets(); ++b) initialize_bucket(b, seed);
}

void ShardedOptimizer::initialize_bucket(int b, uint64_t seed) {
  const Bucket& bk = layout_->plan().buckets[b];
  BucketBuffers& s = layout_->bucket(b);
  Backend& be = layout_->device();
  const DType st = layout_->state_dtype();
  const auto elem = static_cast<int64_t>(dtype_size(st));
  // The whole bucket in the optimizer's precision on the host, then where it belongs.
  std::vector<char> host(static_cast<size_t>(bk.size) * dtype_size(st), 0);
  for (size_t i = 0; i < bk.params.size(); ++i) {
    const std::vector<char> v = initial_values(*bk.params[i], seed, st);
    std::copy(v.begin(), v.end(), host.begin() + bk.offsets[i] * elem);
  }
  const int64_t lo = layout_->owned_begin(b);
  if (layout_->has_master()) {
    layout_->state_backend().copy_from_host(master_[b], host.data() + lo * elem);
    if (!layout_->shards_params()) {  // every rank holds the full bucket of parameters
      Tensor full = be.empty({bk.size}, st, MemoryCategory::Workspace);
      be.copy_from_host(full, host.data());
      be.cast(s.values, full);
    } else {
      upload_master(b);
    }
  } else if (!layout_->shards_params()) {
    be.copy_from_host(s.values, host.data());
  } else {
    const DType dt = layout_->stage().dtype();
    be.copy_from_host(s.value_shard, host.data() + lo * static_cast<int64_t>(dtype_size(dt)));
  }
}

// Every segment's sum of squares goes into one slot of a device buffer, read with one copy:
// reading each segment's value as it is computed would drain the device once per segment
// (hundreds per step for a real model), and a bucket's segments go to the device together. The
// host then adds the slots in segment order, as the per-segment reads did, so the norm keeps its
// bits.
double ShardedOptimizer::grad_norm() {
  Backend& be = layout_->device();
  int64_t segments = 0;
  for (int b = 0; b < layout_->buckets(); ++b)
    segments += static_cast<int64_t>(layout_->bucket(b).norm_segments.size());
  std::vector<double> squares(static_cast<size_t>(segments), 0.0);
  if (segments > 0) {
    Tensor slots = be.empty({segments}, DType::F64, MemoryCategory::Workspace);
    int64_t slot = 0;
    for (int b = 0; b < layout_->buckets(); ++b) {
      std::vector<FlatPiece> pieces;
      for (const OptimizerSegment& seg : layout_->bucket(b).norm_segments)
        pieces.push_back({seg.offset, seg.count});
      be.reduce_pieces_into(slots, slot, layout_->owned_grads(b), pieces, Reduction::SumSquares);
      slot += static_cast<int64_t>(pieces.size());
    }
    be.copy_to_host(squares.data(), slots);
  }
  // The slots in segment order, the experts' apart: under ZeRO 0 those differ between the
  // expert ranks (each holds its own experts) and add up over the expert group.
  double local = 0, experts = 0;
  size_t slot_index = 0;
  for (int b = 0; b < layout_->buckets(); ++b) {
    const bool expert = layout_->plan().buckets[b].group == ReplicaGroup::ExpertData;
    for (size_t i = 0; i < layout_->bucket(b).norm_segments.size(); ++i)
      (expert ? experts : local) += squares[slot_index++];
  }
  const StateGroups& groups = layout_->groups();
  if (layout_->zero() == 0 && groups.expert) experts = groups.expert->all_reduce_scalar(experts);
  local += experts;
  // Under ZeRO each element is owned by one rank of its replica group, and every group's ranks
  // lie within the data group (an expert-data group is a part of it, the expert group's ranks
  // holding the others' experts), so one sum over the data group counts each element once,
  // whatever its group.
  if (layout_->zero() >= 1) local = groups.dp->all_reduce_scalar(local);
  local = groups.tp->all_reduce_scalar(local);
  local = groups.pp->all_reduce_scalar(local);
  return std::sqrt(local);
}

void ShardedOptimizer::step(double lr, double grad_scale) {
  pass_update_fence();
  if (!layout_->offloaded()) {
    // Under bf16 the update writes the parameters from the masters as it goes: one pass over
    // the bucket, not an update then a cast (upload_master) that reads the masters again.
    for (int b = 0; b < layout_->buckets(); ++b) {
      Tensor optimizer_values = values(b);
      Tensor rounded = layout_->has_master() ? layout_->owned_values(b) : Tensor{};
      adamw_[b]->step(optimizer_values, layout_->owned_grads(b), lr, grad_scale,
                      layout_->has_master() ? &rounded : nullptr);
    }
  } else {
    step_offloaded(lr, grad_scale);
  }
  if (!muon_.empty()) step_muon(lr, grad_scale);
  gather_->gather_updated_shards();
  if (layout_->zero() == 1)
    for (int b = 0; b < layout_->buckets(); ++b) layout_->bucket(b).grad_shard = Tensor{};
}

// Offload, pipelined over buckets: while the host updates bucket b, the training thread copies
// bucket b+1's gradients down and bucket b-1's new parameters up.
void ShardedOptimizer::step_offloaded(double lr, double grad_scale) {
  const int n = layout_->buckets();
  std::future<void> updating;
  for (int b = 0; b <= n; ++b) {
    if (b < n) layout_->device().copy_to_host(host_grads_[b].raw(), layout_->owned_grads(b));
    if (updating.valid()) {
      updating.get();
      upload_master(b - 1);
    }
    if (b < n)
      updating = std::async(std::launch::async, [this, b, lr, grad_scale] {
        adamw_[b]->step(master_[b], host_grads_[b], lr, grad_scale);
      });
  }
}

namespace {

// This rank's piece (rows, cols) of m into the whole matrix (global_rows, global_cols), and back.
void place_piece(Backend& be, Tensor& whole, const Tensor& piece, const MuonMatrix& m) {
  if (m.tp_dim == 1) {
    be.copy_columns(whole, m.tp_begin, piece, 0, m.cols);
    return;
  }
  Tensor rows = whole.view(m.tp_dim == 0 ? m.tp_begin * m.global_cols : 0, {m.rows, m.cols});
  be.copy(rows, piece);
}

void take_piece(Backend& be, Tensor& piece, const Tensor& whole, const MuonMatrix& m) {
  if (m.tp_dim == 1) {
    be.copy_columns(piece, 0, whole, m.tp_begin, m.cols);
    return;
  }
  be.copy(piece, whole.view(m.tp_dim == 0 ? m.tp_begin * m.global_cols : 0, {m.rows, m.cols}));
}

}  // namespace

// Muon's matrices, bucket by bucket (parallel/muon_matrices.h has the plan and why): the
// momenta of the owned range, the whole bucket's updates on every replica, each matrix
// orthogonalised by its owner, every rank's share of the updates, applied to its owned range.
void ShardedOptimizer::step_muon(double lr, double grad_scale) {
  Backend& be = layout_->device();
  const MuonHyper& hyper = layout_->options().muon;
  size_t next = 0;
  for (int b = 0; b < layout_->buckets() && next < muon_.size(); ++b) {
    size_t end = next;
    while (end < muon_.size() && muon_[end].bucket == b) ++end;
    if (end == next) continue;
    Tensor updates = muon_momenta(b, next, end, grad_scale);
    orthogonalise(b, next, end, updates);
    Tensor share = share_updates(b, updates);
    Tensor optimizer_values = values(b);
    const int64_t lo = layout_->owned_begin(b), hi = lo + layout_->owned_size(b);
    for (size_t i = next; i < end; ++i) {
      const MuonMatrix& m = muon_[i];
      OptimizerSegment piece;
      if (!intersect(m.offset, m.offset + m.rows * m.cols, lo, hi, piece)) continue;
      Tensor value = optimizer_values.view(piece.offset, {piece.count});
      Tensor update = share.view(piece.offset, {piece.count});
      muon_apply(be, value, update, lr, m.global_rows, m.global_cols, hyper);
      if (layout_->has_master()) {
        Tensor rounded = layout_->owned_values(b).view(piece.offset, {piece.count});
        be.cast(rounded, value);
      }
    }
    next = end;
  }
}

// Each rank moves the momentum of its owned range's pieces of the matrices (an element-wise
// update, held in exp_avg at the same places) into a buffer of its owned range; under ZeRO the
// replicas' buffers are then all-gathered, so every replica holds the whole bucket's updates
// (the pieces of its tensor rank), as every replica does under ZeRO 0.
Tensor ShardedOptimizer::muon_momenta(int b, size_t first, size_t end, double grad_scale) {
  Backend& be = layout_->device();
  const DType dt = layout_->state_dtype();
  Tensor mine = be.zeros({layout_->owned_size(b)}, dt, MemoryCategory::Workspace);
  Tensor grads = layout_->owned_grads(b);
  const int64_t lo = layout_->owned_begin(b), hi = lo + layout_->owned_size(b);
  for (size_t i = first; i < end; ++i) {
    const MuonMatrix& m = muon_[i];
    OptimizerSegment piece;
    if (!intersect(m.offset, m.offset + m.rows * m.cols, lo, hi, piece)) continue;
    Tensor momentum = adamw_[b]->exp_avg().view(piece.offset, {piece.count});
    Tensor update = mine.view(piece.offset, {piece.count});
    muon_momentum(be, momentum, grads.view(piece.offset, {piece.count}), grad_scale,
                  layout_->options().muon, update);
  }
  Communicator& replicas = layout_->replicas(b);
  if (layout_->zero() == 0 || replicas.size() == 1) return mine;
  Tensor updates = be.empty({layout_->plan().buckets[b].size}, dt, MemoryCategory::Workspace);
  replicas.all_gather(updates, mine).wait();
  return updates;
}

// Each matrix of `updates` (the whole bucket, this tensor rank's pieces) becomes its
// orthogonalisation at its owner and zero elsewhere. With tp > 1 the pieces are first summed
// into whole matrices over the tensor group (each rank adds its piece to zeros), and the owner's
// result goes back the same way.
void ShardedOptimizer::orthogonalise(int b, size_t first, size_t end, Tensor& updates) {
  Backend& be = layout_->device();
  const MuonHyper& hyper = layout_->options().muon;
  const int me = owner_index(*layout_, b);
  Communicator& tp = *layout_->groups().tp;
  if (tp.size() == 1) {
    for (size_t i = first; i < end; ++i) {
      Tensor update = updates.view(muon_[i].offset, {muon_[i].rows, muon_[i].cols});
      if (muon_[i].owner == me) newton_schulz(be, update, hyper);
      else be.fill(update, 0.0);
    }
    return;
  }
  Tensor wholes = be.zeros({whole_matrix_elements(muon_, b)}, updates.dtype(), MemoryCategory::Workspace);
  auto whole_of = [&](const MuonMatrix& m) { return wholes.view(m.whole_offset, {m.global_rows, m.global_cols}); };
  auto piece_of = [&](const MuonMatrix& m) { return updates.view(m.offset, {m.rows, m.cols}); };
  for (size_t i = first; i < end; ++i) {
    Tensor whole = whole_of(muon_[i]);
    if (muon_[i].tp_dim >= 0) place_piece(be, whole, piece_of(muon_[i]), muon_[i]);
  }
  tp.all_reduce(wholes).wait();
  for (size_t i = first; i < end; ++i) {
    const MuonMatrix& m = muon_[i];
    Tensor whole = whole_of(m);
    if (m.owner != me) {
      be.fill(whole, 0.0);
      continue;
    }
    if (m.tp_dim < 0) be.copy(whole, piece_of(m));  // whole on every tensor rank already
    newton_schulz(be, whole, hyper);
  }
  tp.all_reduce(wholes).wait();
  for (size_t i = first; i < end; ++i) {
    Tensor piece = piece_of(muon_[i]);
    take_piece(be, piece, whole_of(muon_[i]), muon_[i]);
  }
}

// Every rank's share of the bucket's orthogonalised updates, each matrix's nonzero at one
// replica only, so the sums are exact: the whole bucket under ZeRO 0, the owned range under ZeRO.
Tensor ShardedOptimizer::share_updates(int b, Tensor& updates) {
  Communicator& replicas = layout_->replicas(b);
  if (replicas.size() == 1) return updates;
  if (layout_->zero() == 0) {
    replicas.all_reduce(updates).wait();
    return updates;
  }
  Tensor mine = layout_->device().empty({layout_->owned_size(b)}, updates.dtype(), MemoryCategory::Workspace);
  replicas.reduce_scatter(mine, updates).wait();
  return mine;
}

void ShardedOptimizer::sync_after_load() {
  pass_update_fence();
  if (layout_->has_master())
    for (int b = 0; b < layout_->buckets(); ++b) upload_master(b);
  gather_->gather_updated_shards();
}

int64_t ShardedOptimizer::steps_taken() const {
  return adamw_.empty() ? 0 : adamw_.front()->steps_taken();
}

void ShardedOptimizer::set_steps_taken(int64_t steps) {
  for (auto& a : adamw_) a->set_steps_taken(steps);
}

}  // namespace meshtrain
