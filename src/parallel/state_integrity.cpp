// StateIntegrity: replica hashes, the gradient's hash, and fault injection's bit flips.

#include "meshtrain/parallel/state_integrity.h"

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "meshtrain/parallel/owned_pieces.h"

namespace meshtrain {

namespace {

std::string host_bytes(Backend& be, const Tensor& t) {
  std::string bytes(t.nbytes(), '\0');
  if (t.numel() > 0) be.copy_to_host(bytes.data(), t);
  return bytes;
}

uint64_t hash_bytes(const std::string& bytes) { return std::hash<std::string>{}(bytes); }

// Flips one bit of element `i` of `t` where it lives (a device round trip of one element).
void flip_bit(Backend& be, Tensor t, int64_t i, int bit) {
  Tensor element = t.view(i, {1});
  const size_t size = dtype_size(t.dtype());
  if (static_cast<size_t>(bit) >= 8 * size) bit %= static_cast<int>(8 * size);
  unsigned char bytes[8] = {};
  be.copy_to_host(bytes, element);
  bytes[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));  // little-endian element
  be.copy_from_host(element, bytes);
}

std::string slice_name(const Parameter& p) {
  return p.spec.name + "[" + std::to_string(p.split_begin) + "]";
}

}  // namespace

bool StateIntegrity::in_scope(ReplicaScope scope, const Parameter& p, bool optimizer_state) const {
  const bool zero0 = layout_->zero() == 0;
  switch (scope) {
    case ReplicaScope::Replicas:
      return p.spec.group == ReplicaGroup::Data && (!optimizer_state || zero0);
    case ReplicaScope::Experts:
      return p.spec.group == ReplicaGroup::ExpertData && (!optimizer_state || zero0);
    case ReplicaScope::Tensor: return p.spec.tp_split_dim < 0;
    case ReplicaScope::Embedding:
      return layout_->stage().ties_embeddings() && p.spec.role == ParamRole::TokenEmbedding &&
             (!optimizer_state || zero0);
  }
  return false;
}

std::vector<ReplicaRecord> StateIntegrity::replica_records(ReplicaScope scope) {
  std::vector<ReplicaRecord> out;
  // Under ZeRO 3 the layers' values exist only while gathered: the optimizer's pieces below
  // are the copy that persists.
  if (!layout_->shards_params()) {
    for (const Parameter* p : layout_->stage().params().params()) {
      if (!in_scope(scope, *p, false) || !p->value.defined()) continue;
      out.push_back({slice_name(*p) + " values", hash_bytes(host_bytes(layout_->device(), p->value))});
    }
  }
  for (const OwnedPiece& piece : owned_pieces(*layout_, *optimizer_)) {
    if (!in_scope(scope, *piece.param, true)) continue;
    const std::string bits = host_bytes(*piece.backend, piece.value) +
                             host_bytes(*piece.backend, piece.exp_avg) +
                             host_bytes(*piece.backend, piece.exp_avg_sq);
    out.push_back({slice_name(*piece.param) + " optimizer state @" + std::to_string(piece.local_begin) +
                       "+" + std::to_string(piece.count),
                   hash_bytes(bits)});
  }
  return out;
}

uint64_t StateIntegrity::gradient_hash() {
  std::string bits;
  for (int b = 0; b < layout_->buckets(); ++b) bits += host_bytes(layout_->device(), layout_->owned_grads(b));
  return hash_bytes(bits);
}

bool StateIntegrity::flip_parameter_bit(const std::string& name, int64_t index, int bit) {
  Parameter* p = nullptr;
  for (Parameter* q : layout_->stage().params().params())
    if (name.empty() ? !q->tied_copy : q->spec.name == name) {
      p = q;
      break;
    }
  if (p == nullptr || index >= p->numel()) return false;
  bool flipped = false;
  if (p->value.defined()) {
    flip_bit(layout_->device(), p->value.reshape({p->numel()}), index, bit);
    flipped = true;
  }
  // The optimizer's copy, where it is not the layers' values themselves (master weights, or
  // the ZeRO-3 shard): the element, if this rank owns it.
  if (!layout_->has_master() && !layout_->shards_params()) return flipped;
  return flip_optimizer_bit(*p, index, bit) || flipped;
}

// The optimizer's copy of element `index` of `p`, if this rank owns it.
bool StateIntegrity::flip_optimizer_bit(const Parameter& p, int64_t index, int bit) {
  const BucketPlan& plan = layout_->plan();
  for (int b = 0; b < layout_->buckets(); ++b) {
    const Bucket& bk = plan.buckets[b];
    for (size_t i = 0; i < bk.params.size(); ++i) {
      if (bk.params[i] != &p) continue;
      const int64_t at = bk.offsets[i] + index, lo = layout_->owned_begin(b);
      if (at < lo || at >= lo + layout_->owned_size(b)) return false;
      flip_bit(layout_->state_backend(), optimizer_->values(b), at - lo, bit);
      return true;
    }
  }
  return false;
}

void StateIntegrity::flip_gradient_bit(int64_t index, int bit) {
  // Among the elements this rank's share of the norm counts (tp copies of an unsplit parameter
  // count on tp rank 0 only): a flip there always reaches the norm, on any rank.
  int64_t counted = 0;
  for (int b = 0; b < layout_->buckets(); ++b)
    for (const OptimizerSegment& seg : layout_->bucket(b).norm_segments) counted += seg.count;
  if (counted == 0) return;
  index %= counted;
  for (int b = 0; b < layout_->buckets(); ++b)
    for (const OptimizerSegment& seg : layout_->bucket(b).norm_segments) {
      if (index < seg.count) {
        flip_bit(layout_->device(), layout_->owned_grads(b), seg.offset + index, bit);
        return;
      }
      index -= seg.count;
    }
}

}  // namespace meshtrain
