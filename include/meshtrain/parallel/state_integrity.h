#pragma once
// StateIntegrity: which of this rank's state other ranks hold copies of, hashed for the replica
// check (train/replica_check.h: silent data corruption shows as copies that stopped being
// equal), the gradient's hash for a step's re-run, and the fault-injection hooks
// (config/fault_injection.h) that corrupt one bit. Reads ModelState's parts; changes nothing but
// the bits it is asked to flip.

#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/parallel/sharded_optimizer.h"
#include "meshtrain/parallel/state_layout.h"

namespace meshtrain {

// Which copies of this rank's state exist elsewhere in the grid, i.e. which other ranks must
// hold the same bits (the replica check, train/replica_check.h):
//   Replicas   the data-parallel (x context-parallel) group: every parameter's values under
//              ZeRO 0-2 (after the update's all-gather), and under ZeRO 0 the optimizer's
//              master weights and moments too. ZeRO 3 leaves nothing replicated here.
//   Tensor     the tensor group: parameters not split over it (layer norms, row-parallel
//              biases): their values and the optimizer's pieces of them, under every stage.
//   Embedding  the first and last pipeline stage with tied embeddings: wte's values (ZeRO 0-2)
//              and, under ZeRO 0, its optimizer state (other stages shard it differently).
//   Experts    the expert-data group (parallel.ep): the expert weights, which the Replicas
//              scope leaves out, as Replicas holds the others (values under ZeRO 0-2, and under
//              ZeRO 0 the optimizer's state).
enum class ReplicaScope { Replicas, Tensor, Embedding, Experts };

// One replicated piece of state and a hash of its bits; `what` names it the same way on every
// rank that holds a copy ("h.0.ln1.weight[0] values", "... state @0+64").
struct ReplicaRecord {
  std::string what;
  uint64_t hash = 0;
};

class StateIntegrity {
 public:
  StateIntegrity(StateLayout& layout, ShardedOptimizer& optimizer)
      : layout_(&layout), optimizer_(&optimizer) {}

  // This rank's copies of state replicated over `scope`, in an order every holder shares
  // (parameter order, then owned pieces). Copies to the host: a check every so many steps.
  std::vector<ReplicaRecord> replica_records(ReplicaScope scope);
  // A hash of this rank's owned gradients after finish_backward (a step's re-run compares it).
  uint64_t gradient_hash();
  // Flips bit `bit` of element `index` of this rank's slice of parameter `name` ("" the first)
  // in every copy this rank holds: the layers' values and, where separate, the optimizer's.
  // False when this rank holds no such element.
  bool flip_parameter_bit(const std::string& name, int64_t index, int bit);
  // Flips bit `bit` of element `index` (modulo their count) of this rank's owned gradients
  // among those its share of the gradient norm counts.
  void flip_gradient_bit(int64_t index, int bit);

 private:
  bool in_scope(ReplicaScope scope, const Parameter& p, bool optimizer_state) const;
  bool flip_optimizer_bit(const Parameter& p, int64_t index, int bit);

  StateLayout* layout_;
  ShardedOptimizer* optimizer_;
};

}  // namespace meshtrain
