// StepSchedule (train/step_schedule.h). ZB-V re-planned for the costs measured in the second step (zero_bubble_costs.h; the
// first is slower, with allocations and first touches). make_zb_v plans on a unit clock; after
// that step every rank knows how long each of its chunks' forwards, input gradients and weight
// gradients really took and how long the step's pipeline took (which fits the transfer time:
// fit_send_time), the job agrees on one table (each chunk's slowest report, over tensor and
// data-parallel copies: every pipeline group must run the same schedule, since under ZeRO 2 and
// 3 weight gradients start collectives over the replicas), and every rank plans the same
// schedule from it. What a step computes does not
// change (the schedule keeps every gradient sum's order), only when each part runs.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "meshtrain/parallel/schedule_cache.h"
#include "meshtrain/train/step_schedule.h"

namespace meshtrain {

namespace {

// Whole microseconds, so that every rank plans from the same numbers bit for bit.
double median_micros(std::vector<double> seconds) {
  std::nth_element(seconds.begin(), seconds.begin() + static_cast<std::ptrdiff_t>(seconds.size() / 2), seconds.end());
  return std::max(1.0, std::round(seconds[seconds.size() / 2] * 1e6));
}

}  // namespace

StepSchedule::StepSchedule(const Config& config, ProcessGrid& grid, const Backend& backend)
    : cfg_(config), grid_(grid), be_(backend) {}

void StepSchedule::plan(int microbatches) {
  const ParallelOptions& p = cfg_.parallel;
  const int M = microbatches;
  const int rank = grid_.rank(Axis::Pipeline);
  const auto shape = pipeline_schedules(p.schedule, p.pp, M, p.virtual_stages);
  eval_ = shape->eval[static_cast<size_t>(rank)];
  if (!costs_) {
    train_ = shape->train[static_cast<size_t>(rank)];
    return;
  }
  const Schedule compute = make_zb_v_for_costs(p.pp, M, *costs_, cfg_.model.tie_embeddings).compute;
  train_ = insert_communication(compute, p.pp, p.virtual_stages, schedule_placement(p.schedule))[rank];
}

void StepSchedule::after_step(const PipelineStats& stats, int microbatches) {
  // Re-planned once, after the second step (the first is slowed by allocations).
  if (steps_timed_ < 2 && replans_for_costs() && ++steps_timed_ == 2) replan_for_measured_costs(stats, microbatches);
}

bool StepSchedule::replans_for_costs() const {
  const ParallelOptions& p = cfg_.parallel;
  // A host clock around an action measures its compute only where kernels run synchronously
  // (the CPU backend); CUDA kernels are queued and would be timed at their launch.
  return p.schedule == ScheduleKind::ZeroBubbleV && p.measured_schedule_costs && p.pp > 1 &&
         be_.device() == Device::Cpu && !be_.planning();
}

void StepSchedule::replan_for_measured_costs(const PipelineStats& stats, int microbatches) {
  const ParallelOptions& p = cfg_.parallel;
  const int chunks = 2 * p.pp;
  std::ostringstream mine;
  // The step's pipeline time, to fit the transfer time to: the slowest rank's (the makespan)
  // among those with this rank's micro-batch count (replicas may take uneven shares).
  const int M = microbatches;
  mine << "-1 " << M << ' ' << std::round(stats.total_seconds * 1e6) << '\n';
  for (const auto& [chunk, kinds] : stats.chunk_seconds)
    for (int kind = 0; kind < 3; ++kind)
      if (!kinds[static_cast<size_t>(kind)].empty())
        mine << chunk << ' ' << kind << ' ' << median_micros(kinds[static_cast<size_t>(kind)]) << '\n';
  ChunkActionCosts costs;
  std::vector<double>* tables[3] = {&costs.forward, &costs.input, &costs.weight};
  for (std::vector<double>* t : tables) t->assign(static_cast<size_t>(chunks), 0.0);
  double makespan = 0;
  for (const std::string& report : grid_.world().all_gather_bytes(mine.str())) {
    std::istringstream in(report);
    int chunk = 0, kind = 0;
    double micros = 0;
    while (in >> chunk >> kind >> micros) {
      if (chunk == -1 && kind == M) makespan = std::max(makespan, micros);
      if (chunk < 0 || chunk >= chunks || kind < 0 || kind > 2) continue;
      double& slot = (*tables[kind])[static_cast<size_t>(chunk)];
      slot = std::max(slot, micros);
    }
  }
  for (std::vector<double>* t : tables)
    if (std::count(t->begin(), t->end(), 0.0) > 0) return;  // a chunk ran no action: nothing to plan
  costs.send = fit_send_time(p.pp, M, costs, makespan);
  const CostedSchedule s = make_zb_v_for_costs(p.pp, M, costs, cfg_.model.tie_embeddings);
  char line[160];
  std::snprintf(line, sizeof line, "simulated bubble %.3f -> %.3f", s.unit_bubble, s.bubble);
  if (!s.replanned) {
    note_ = "zb-v: the unit-clock schedule kept for the measured costs (" +
                     format_chunk_costs(costs) + "): no candidate beats it";
    return;
  }
  costs_ = costs;
  train_ = insert_communication(s.compute, p.pp, p.virtual_stages, ChunkPlacement::V)
      [static_cast<size_t>(grid_.rank(Axis::Pipeline))];
  note_ = "zb-v: re-planned for the measured costs (" + format_chunk_costs(costs) +
                   "): " + line;
}

}  // namespace meshtrain
