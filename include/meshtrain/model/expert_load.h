#pragma once
// The step's expert loads over the whole job, for the after-step update of the sigmoid router's
// bias (model/expert_bias.h), the log and metrics.jsonl: every rank's MoeLog (model/moe_log.h)
// as numbers that sum over the world (what the stage hands train/ as its step statistics:
// model/pipeline_stage.h), and the report made from their sums, per mixture-of-experts layer.
// The balance of a layer is its busiest expert's tokens over the mean (1: perfectly balanced;
// E / top_k at worst, every token on the same top_k experts).

#include <string>
#include <vector>

#include "meshtrain/model/model_spec.h"
#include "meshtrain/model/moe_log.h"
#include "meshtrain/model/pipeline_stage.h"

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

// Takes this rank's log as (layers, E + 5) numbers: per mixture-of-experts layer of `spec`, its
// E token counts, the two balancing losses' sums and what each was summed over, the dropped
// choices (zeros for another stage's layer). Empty for a dense model.
std::vector<double> take_expert_load_sums(MoeLog& log, const ModelSpec& spec);
// The report of those numbers summed over the world (empty for empty sums).
ExpertLoadReport expert_load_report(const std::vector<double>& job_sums, const ModelSpec& spec);
// The progress line's part (" | experts max/mean 1.02", and the dropped choices where
// model.moe_capacity_factor drops any) and the step's metrics.jsonl line: (layers x experts)
// tokens flattened, the balances and the losses. Nothing for an empty report.
std::string expert_load_progress(const ExpertLoadReport& report, const ModelSpec& spec);
std::vector<MetricsRecord> expert_load_records(int step, const ExpertLoadReport& report, const ModelSpec& spec);

}  // namespace meshtrain
