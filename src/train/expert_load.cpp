#include "meshtrain/train/expert_load.h"

#include <algorithm>
#include <map>

namespace meshtrain {

double ExpertLoadReport::worst_balance() const {
  return max_over_mean.empty() ? 0.0 : *std::max_element(max_over_mean.begin(), max_over_mean.end());
}

double ExpertLoadReport::total_dropped() const {
  double n = 0;
  for (double d : dropped) n += d;
  return n;
}

ExpertLoadReport gather_expert_loads(MoeLog& log, const ModelSpec& spec, Communicator& world,
                                     Backend& be) {
  ExpertLoadReport r;
  const std::map<int, ExpertLoad> mine = log.take();
  for (int l = 0; l < spec.layers; ++l)
    if (spec.moe_layer(l)) r.layers.push_back(l);
  if (r.layers.empty()) return r;
  const int64_t E = spec.moe.experts, L = static_cast<int64_t>(r.layers.size());
  r.experts = E;
  // Per layer: E token counts, the two losses' sums and what they were summed over, the
  // dropped choices.
  const int64_t row = E + 5;
  std::vector<double> flat(static_cast<size_t>(L * row), 0.0);
  for (int64_t i = 0; i < L; ++i) {
    const auto it = mine.find(r.layers[static_cast<size_t>(i)]);
    if (it == mine.end()) continue;  // another stage's layer, or not this rank's to count
    double* out = flat.data() + i * row;
    std::copy(it->second.tokens.begin(), it->second.tokens.end(), out);
    out[E] = it->second.load_balance_loss;
    out[E + 1] = it->second.sequences;
    out[E + 2] = it->second.z_loss;
    out[E + 3] = it->second.routed_tokens;
    out[E + 4] = it->second.dropped;
  }
  // The world communicator is MPI's, on host memory, whatever the device.
  Tensor t = be.empty_host({L * row}, DType::F64, MemoryCategory::Workspace);
  std::copy(flat.begin(), flat.end(), t.data<double>());
  world.all_reduce(t).wait();
  std::copy_n(t.data<double>(), flat.size(), flat.begin());
  for (int64_t i = 0; i < L; ++i) {
    const double* in = flat.data() + i * row;
    r.tokens.insert(r.tokens.end(), in, in + E);
    r.load_balance_loss.push_back(in[E] / std::max(in[E + 1], 1.0));
    r.z_loss.push_back(in[E + 2] / std::max(in[E + 3], 1.0));
    r.dropped.push_back(in[E + 4]);
    double total = 0, most = 0;
    for (int64_t e = 0; e < E; ++e) {
      total += in[e];
      most = std::max(most, in[e]);
    }
    r.max_over_mean.push_back(total > 0 ? most / (total / static_cast<double>(E)) : 0.0);
  }
  return r;
}

}  // namespace meshtrain
