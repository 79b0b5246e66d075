#pragma once
// The communicating schedules of one pipeline shape, built once per process. A pipeline's
// schedule depends only on its shape (kind, stages, micro-batches, virtual stages), yet every
// stage of a planned layout (planner.h dry-runs one Trainer per stage) and every layout the time
// model prices with that shape would rebuild all ranks' actions: for Megatron's 1T layout (64
// stages, 512 micro-batches, 2 chunks a rank) that was 64 rebuilds of ~130,000 actions, most of
// a `plan`'s time. Thread-safe (the advisor prices layouts on several threads); bounded by the
// actions held.

#include <memory>

#include "meshtrain/parallel/schedule.h"

namespace meshtrain {

struct PipelineSchedules {
  Schedule train;  // insert_communication(make_schedule(...)), every rank's
  Schedule eval;   // make_forward_only(...), every rank's
};

std::shared_ptr<const PipelineSchedules> pipeline_schedules(ScheduleKind kind, int stages, int microbatches,
                                                            int virtual_stages);

}  // namespace meshtrain
