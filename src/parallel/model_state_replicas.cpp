// ModelState, replicas: which of this rank's state other ranks hold copies of, hashed for the
// replica check (silent data corruption shows as copies that stopped being equal), the
// gradient's hash for a step's re-run, and the fault-injection hooks that corrupt one bit.

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "meshtrain/parallel/model_state.h"
#include "model_state_internal.h"

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

std::vector<ReplicaRecord> ModelState::replica_records(ReplicaScope scope) {
  const bool tied = stage_->ties_embeddings();
  auto in_scope = [&](const Parameter& p, bool state) {
    switch (scope) {
      case ReplicaScope::Replicas:
        return p.spec.group == ReplicaGroup::Data && (!state || options_.zero == 0);
      case ReplicaScope::Experts:
        return p.spec.group == ReplicaGroup::ExpertData && (!state || options_.zero == 0);
      case ReplicaScope::Tensor: return p.spec.tp_split_dim < 0;
      case ReplicaScope::Embedding:
        return tied && p.spec.role == ParamRole::TokenEmbedding && (!state || options_.zero == 0);
    }
    return false;
  };
  std::vector<ReplicaRecord> out;
  // Under ZeRO 3 the layers' values exist only while gathered: the optimizer's pieces below
  // are the copy that persists.
  if (!shards_params()) {
    for (const Parameter* p : stage_->params().params()) {
      if (!in_scope(*p, false) || !p->value.defined()) continue;
      out.push_back({slice_name(*p) + " values", hash_bytes(host_bytes(*be_, p->value))});
    }
  }
  for (const OwnedPiece& piece : owned_pieces()) {
    if (!in_scope(*piece.param, true)) continue;
    const std::string bits = host_bytes(*piece.backend, piece.value) +
                             host_bytes(*piece.backend, piece.exp_avg) +
                             host_bytes(*piece.backend, piece.exp_avg_sq);
    out.push_back({slice_name(*piece.param) + " optimizer state @" + std::to_string(piece.local_begin) +
                       "+" + std::to_string(piece.count),
                   hash_bytes(bits)});
  }
  return out;
}

uint64_t ModelState::gradient_hash() {
  std::string bits;
  for (size_t b = 0; b < buckets_.size(); ++b) bits += host_bytes(*be_, owned_grads(static_cast<int>(b)));
  return hash_bytes(bits);
}

bool ModelState::flip_parameter_bit(const std::string& name, int64_t index, int bit) {
  Parameter* p = nullptr;
  for (Parameter* q : stage_->params().params())
    if (name.empty() ? !q->tied_copy : q->spec.name == name) {
      p = q;
      break;
    }
  if (p == nullptr || index >= p->numel()) return false;
  bool flipped = false;
  if (p->value.defined()) {
    flip_bit(*be_, p->value.reshape({p->numel()}), index, bit);
    flipped = true;
  }
  // The optimizer's copy, where it is not the layers' values themselves (master weights, or
  // the ZeRO-3 shard): the element, if this rank owns it.
  if (!has_master() && !shards_params()) return flipped;
  for (size_t b = 0; b < plan_.buckets.size(); ++b) {
    const Bucket& bk = plan_.buckets[b];
    for (size_t i = 0; i < bk.params.size(); ++i) {
      if (bk.params[i] != p) continue;
      const int64_t at = bk.offsets[i] + index, lo = owned_begin(static_cast<int>(b));
      if (at < lo || at >= lo + owned_size(static_cast<int>(b))) return flipped;
      flip_bit(*state_be_, optimizer_values(static_cast<int>(b)), at - lo, bit);
      return true;
    }
  }
  return flipped;
}

void ModelState::flip_gradient_bit(int64_t index, int bit) {
  // Among the elements this rank's share of the norm counts (tp copies of an unsplit parameter
  // count on tp rank 0 only): a flip there always reaches the norm, on any rank.
  int64_t counted = 0;
  for (const auto& s : buckets_)
    for (const OptimizerSegment& seg : s->norm_segments) counted += seg.count;
  if (counted == 0) return;
  index %= counted;
  for (size_t b = 0; b < buckets_.size(); ++b)
    for (const OptimizerSegment& seg : bucket(static_cast<int>(b)).norm_segments) {
      if (index < seg.count) {
        flip_bit(*be_, owned_grads(static_cast<int>(b)), seg.offset + index, bit);
        return;
      }
      index -= seg.count;
    }
}

}  // namespace meshtrain
