#include "meshtrain/model/expert_load.h"

#include <algorithm>
#include <cstdio>
#include <map>

namespace meshtrain {

namespace {

// The numbers per layer after its E token counts: the two losses' sums and what they were
// summed over, the dropped choices.
constexpr int64_t kSumsAfterCounts = 5;

std::vector<int> moe_layers(const ModelSpec& spec) {
  std::vector<int> layers;
  // The multi-token prediction depths' blocks (model/mtp_module.h) are layers layers + k.
  for (int l = 0; l < spec.layers + spec.mtp_layers; ++l)
    if (spec.moe_layer(l)) layers.push_back(l);
  return layers;
}

}  // namespace

double ExpertLoadReport::worst_balance() const {
  return max_over_mean.empty() ? 0.0 : *std::max_element(max_over_mean.begin(), max_over_mean.end());
}

double ExpertLoadReport::total_dropped() const {
  double n = 0;
  for (double d : dropped) n += d;
  return n;
}

std::vector<double> take_expert_load_sums(MoeLog& log, const ModelSpec& spec) {
  const std::map<int, ExpertLoad> mine = log.take();
  const std::vector<int> layers = moe_layers(spec);
  if (layers.empty()) return {};
  const int64_t E = spec.moe.experts, L = static_cast<int64_t>(layers.size());
  const int64_t row = E + kSumsAfterCounts;
  std::vector<double> flat(static_cast<size_t>(L * row), 0.0);
  for (int64_t i = 0; i < L; ++i) {
    const auto it = mine.find(layers[static_cast<size_t>(i)]);
    if (it == mine.end()) continue;  // another stage's layer, or not this rank's to count
    double* out = flat.data() + i * row;
    std::copy(it->second.tokens.begin(), it->second.tokens.end(), out);
    out[E] = it->second.load_balance_loss;
    out[E + 1] = it->second.sequences;
    out[E + 2] = it->second.z_loss;
    out[E + 3] = it->second.routed_tokens;
    out[E + 4] = it->second.dropped;
  }
  return flat;
}

ExpertLoadReport expert_load_report(const std::vector<double>& job_sums, const ModelSpec& spec) {
  ExpertLoadReport r;
  if (job_sums.empty()) return r;
  r.layers = moe_layers(spec);
  const int64_t E = spec.moe.experts, L = static_cast<int64_t>(r.layers.size());
  const int64_t row = E + kSumsAfterCounts;
  r.experts = E;
  for (int64_t i = 0; i < L; ++i) {
    const double* in = job_sums.data() + i * row;
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

std::string expert_load_progress(const ExpertLoadReport& report, const ModelSpec& spec) {
  if (report.empty()) return {};
  char buf[64];
  std::snprintf(buf, sizeof buf, " | experts max/mean %.2f", report.worst_balance());
  std::string text = buf;
  if (spec.moe.capacity_factor > 0) {
    std::snprintf(buf, sizeof buf, " | dropped %.0f", report.total_dropped());
    text += buf;
  }
  return text;
}

std::vector<MetricsRecord> expert_load_records(int step, const ExpertLoadReport& report, const ModelSpec& spec) {
  if (report.empty()) return {};
  // Built by push_back: from an initializer list of variants, GCC 12 reports a bogus
  // -Wmaybe-uninitialized on its temporaries.
  MetricsRecord record;
  record.push_back({"step", int64_t{step}});
  record.push_back({"moe_layers", std::vector<int64_t>(report.layers.begin(), report.layers.end())});
  record.push_back({"experts", report.experts});
  record.push_back({"expert_tokens", report.tokens});
  record.push_back({"expert_balance", report.max_over_mean});
  record.push_back({"moe_load_balance_loss", report.load_balance_loss});
  record.push_back({"moe_z_loss", report.z_loss});
  // Choices dropped for capacity, per layer: dropless runs (the default) have none to count.
  if (spec.moe.capacity_factor > 0) record.push_back({"expert_dropped", report.dropped});
  return {record};
}

}  // namespace meshtrain
