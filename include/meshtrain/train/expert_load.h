#pragma once
// The step's expert loads over the whole job, for the log and metrics.jsonl: every rank's
// MoeLog (model/moe_log.h) summed over the world, per mixture-of-experts layer. The balance of a
// layer is its busiest expert's tokens over the mean (1: perfectly balanced; E / top_k at worst,
// every token on the same top_k experts).

#include <string>
#include <vector>

#include "meshtrain/backend/backend.h"
#include "meshtrain/comm/communicator.h"
#include "meshtrain/model/model_spec.h"
#include "meshtrain/model/moe_log.h"

namespace meshtrain {

struct ExpertLoadReport {
  std::vector<int> layers;             // the mixture-of-experts layers, in order
  int64_t experts = 0;
  std::vector<double> tokens;          // (layers, experts) tokens routed, over the step
  // Per layer: the load-balancing loss's mean over the step's sequences, the z-loss's over its
  // tokens (what the step's loss holds of them).
  std::vector<double> load_balance_loss, z_loss;
  std::vector<double> max_over_mean;   // per layer
  std::vector<double> dropped;         // per layer: choices dropped for capacity over the step

  bool empty() const { return layers.empty(); }
  // The largest balance of any layer (the step line's summary).
  double worst_balance() const;
  double total_dropped() const;
};

// Takes this rank's log and sums it over `world`, an MPI communicator (a collective: every rank
// calls it, each step of a model with mixture-of-experts layers); empty for a dense model,
// without communicating. `be` lends the host buffer.
ExpertLoadReport gather_expert_loads(MoeLog& log, const ModelSpec& spec, Communicator& world,
                                     Backend& be);

}  // namespace meshtrain
