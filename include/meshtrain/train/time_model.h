#pragma once
// The time half of the planner: predicts the step time of a layout on a machine described by
// a MachineProfile (config/machine_profile.h), without running it.
//
// Each model chunk's forward and backward on one micro-batch is priced from the GEMMs and the
// memory-bound work its layers do on this rank's shard (tensor parallel and sequence parallel
// shrink both), plus its tensor-parallel collectives, which sit on the compute path. The
// pipeline is then the real schedule (make_schedule + insert_communication) run by the
// schedule simulator with those per-chunk costs and the pipeline transfers' time; what is
// simulated is one pipeline (pp ranks), since every data-parallel and tensor-parallel copy of
// a stage does the same work at the same time. After the stage's last backward comes the part
// of its data-parallel gradient reduction that backward did not hide, the optimizer step and,
// for ZeRO 1 and 2, the parameter all-gather. The slowest stage sets the step.
//
// Which link a group's collective crosses follows the rank order (parallel.order) and block
// placement of ranks_per_node consecutive ranks per node: a group whose ranks all fall in one
// node uses the intra-node link, any other the inter-node link.

#include <string>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/config/machine_profile.h"

namespace meshtrain {

// What one pipeline stage spends, per step.
struct StageTime {
  int pp_rank = 0;
  double compute_s = 0;     // forward + backward + recomputation, all micro-batches
  double tp_comm_s = 0;     // tensor-parallel collectives (on the compute path)
  double ep_comm_s = 0;     // expert parallelism's all_to_all exchanges (on the compute path)
  double pipeline_end_s = 0;// when its last backward ended in the simulated schedule
  double dp_comm_s = 0;     // data-parallel / ZeRO communication in total
  double dp_exposed_s = 0;  // the part of it backward or forward did not hide
  double optimizer_s = 0;
  double end_s = 0;         // pipeline_end_s + dp_exposed_s + optimizer_s
};

struct StepTimePrediction {
  double step_s = 0;
  // The breakdown of the slowest stage's step: step_s = compute + tp_comm + ep_comm + bubble +
  // dp_exposed + optimizer.
  int critical_stage = 0;
  double compute_s = 0, tp_comm_s = 0, ep_comm_s = 0, bubble_s = 0, dp_exposed_s = 0, optimizer_s = 0;
  double model_flops = 0;  // per step, ModelSpec::flops_per_token convention
  double mfu = 0;          // model_flops / (world x peak x step_s)
  std::vector<StageTime> stages;
  std::vector<std::string> caveats;  // assumptions the prediction rests on, for the user
};

// Predicts `config`'s step time (its parallel layout, dp resolved, already checked with
// check_layout) on `profile`'s machine. Throws DeckError if the profile lacks what the layout
// needs (the precision's GEMM rates; link measurements for a layout with communication).
StepTimePrediction predict_step_time(const Config& config, const MachineProfile& profile);

// A lower bound of predict_step_time(config, profile).step_s, in a fraction of its time: each
// stage's own work (sped up at most by the cores ranks idle in a bubble lend) and what follows
// it, without simulating the pipeline's schedule. The strategy advisor simulates only the layouts
// whose bound could still beat those it lists (layout_advisor.h).
double step_time_lower_bound(const Config& config, const MachineProfile& profile);

// "dp 2 tp 1 pp 4 ...: 123.4 ms (compute 80%, tp 5%, bubble 10%, dp 3%, optimizer 2%), MFU 41%"
// (", ep N%" after the bubble where expert parallelism exchanges rows)
std::string describe_prediction(const StepTimePrediction& p);

}  // namespace meshtrain
