#pragma once
// The pipeline schedule of this rank's steps: the training and evaluation action lists
// (parallel/schedule.h) for the current micro-batch count, and ZB-V re-planned once for the
// costs measured in the second step (parallel/zero_bubble_costs.h; step_schedule.cpp says how).
// What a step computes never depends on it (every gradient sum keeps its order), only when
// each part runs.

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "meshtrain/backend/backend.h"
#include "meshtrain/config/config.h"
#include "meshtrain/parallel/pipeline_executor.h"
#include "meshtrain/parallel/process_grid.h"
#include "meshtrain/parallel/schedule.h"
#include "meshtrain/parallel/zero_bubble_costs.h"

namespace meshtrain {

class StepSchedule {
 public:
  StepSchedule(const Config& config, ProcessGrid& grid, const Backend& backend);

  // Plans both lists for `microbatches` per step (measured costs, once taken, plan the new
  // count too). Every rank of a pipeline group with the same count.
  void plan(int microbatches);
  const std::vector<Action>& train() const { return train_; }
  const std::vector<Action>& eval() const { return eval_; }
  // After each step, with the executor's timings of it: the second step re-plans ZB-V where
  // the run does (a collective over the world: every rank calls it after every step).
  void after_step(const PipelineStats& stats, int microbatches);
  // What the re-planning did, for the log, once ("" before it and after it is taken).
  std::string take_note() { return std::exchange(note_, std::string()); }

 private:
  bool replans_for_costs() const;
  void replan_for_measured_costs(const PipelineStats& stats, int microbatches);

  const Config& cfg_;
  ProcessGrid& grid_;
  const Backend& be_;
  std::vector<Action> train_, eval_;
  int steps_timed_ = 0;                    // steps run, up to 2: then re-planned (zb-v)
  std::optional<ChunkActionCosts> costs_;  // set where they gave a better schedule
  std::string note_;
};

}  // namespace meshtrain
