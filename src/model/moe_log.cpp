#include "meshtrain/model/moe_log.h"

#include <cstddef>
#include <utility>

namespace meshtrain {

void MoeLog::add(int layer, const std::vector<double>& counts, double load_balance_loss,
                 double sequences, double z_loss, double tokens, double dropped) {
  ExpertLoad& l = layers_[layer];
  if (l.tokens.size() < counts.size()) l.tokens.resize(counts.size(), 0.0);
  for (std::size_t e = 0; e < counts.size(); ++e) l.tokens[e] += counts[e];
  l.load_balance_loss += load_balance_loss;
  l.sequences += sequences;
  l.z_loss += z_loss;
  l.routed_tokens += tokens;
  l.dropped += dropped;
}

std::map<int, ExpertLoad> MoeLog::take() { return std::exchange(layers_, {}); }

}  // namespace meshtrain
