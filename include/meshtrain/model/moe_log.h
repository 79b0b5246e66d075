#pragma once
// What the mixture-of-experts layers of this rank report over a step, for metrics.jsonl: per
// layer, the tokens each expert received and the balancing losses, summed over the step's
// micro-batches. A layer logs a micro-batch once (not again when recomputed), and only where its
// numbers are the micro-batch's whole ones and not a copy (tensor rank 0 and context rank 0: the
// sums are taken over those groups first), so that summing every rank's log over the world
// counts each micro-batch once.

#include <map>
#include <vector>

namespace meshtrain {

struct ExpertLoad {
  std::vector<double> tokens;  // (experts) tokens routed to each expert
  // The balancing losses summed over the sequences (load balance) and the tokens (z-loss) they
  // were taken over, and those numbers: their means are the losses the step's loss holds.
  double load_balance_loss = 0, sequences = 0;
  double z_loss = 0, routed_tokens = 0;
  double dropped = 0;  // choices dropped for capacity (model.moe_capacity_factor)
};

class MoeLog {
 public:
  void add(int layer, const std::vector<double>& counts, double load_balance_loss,
           double sequences, double z_loss, double tokens, double dropped = 0);
  // The step's entries by layer, and empties.
  std::map<int, ExpertLoad> take();
  bool empty() const { return layers_.empty(); }

 private:
  std::map<int, ExpertLoad> layers_;
};

}  // namespace meshtrain
