#pragma once
// Runs one rank's pipeline actions (schedule.h) for one step: forward and backward of its model
// chunks, activations and gradients exchanged with its pipeline neighbours in the schedule's
// transfer steps (Communicator::exchange: one MPI post of each request, or one NCCL group).
// A receive is waited for only when the compute that needs it starts; sends complete in the
// background and are all finished before run() returns. Time spent computing versus waiting is measured for the bubble report.
// A split backward (zero-bubble schedules) keeps its weight gradients in the micro-batch's slot
// from BackwardInput to BackwardWeight; a rank about to wait for a transfer runs its next
// weight gradient first when it can, once the transfer has had a short grace (see run()).

#include <array>
#include <functional>
#include <map>
#include <vector>

#include "meshtrain/comm/communicator.h"
#include "meshtrain/io/trace_writer.h"
#include "meshtrain/model/pipeline_stage.h"
#include "meshtrain/parallel/schedule.h"

namespace meshtrain {

struct PipelineStats {
  double compute_seconds = 0;  // inside forward/backward actions (with an emulated slowdown's
                               // padding, parallel/slowdown.h)
  double total_seconds = 0;    // the whole run
  double longest_action_seconds = 0;  // the longest forward or backward action (padded)
  // Per model chunk of this rank: how long each forward, input gradient and weight gradient
  // took in this run, in run order (split backwards only; with a slowdown's padding). Read by
  // the trainer to re-plan ZB-V for measured costs (zero_bubble_costs.h).
  enum ActionKind { kForward, kInput, kWeight };
  std::map<int, std::array<std::vector<double>, 3>> chunk_seconds;
  double bubble() const { return total_seconds > 0 ? 1.0 - compute_seconds / total_seconds : 0.0; }
};

class PipelineExecutor {
 public:
  // early_weights: whether a weight gradient may run before its place in the list while a
  // transfer is awaited. Only where its hooks start no collective whose order must match other
  // ranks' (the caller knows: ZeRO 2 and 3 reduce over the data-parallel group in them).
  // placement: where the chunks live (schedule.h; the schedule's schedule_placement); the
  // stage's chunks are this rank's rank_chunks in model order.
  PipelineExecutor(PipelineStage& stage, Communicator& pipeline, int virtual_stages, Recompute recompute,
                   TraceWriter& trace, bool early_weights = false,
                   ChunkPlacement placement = ChunkPlacement::Looped);

  // Runs `actions` over `microbatches` (indexed by micro-batch). Returns the loss summed over the
  // micro-batches whose head ran on this rank (0 on other stages) when the model reads its loss
  // per micro-batch (LossReadout::PerMicroBatch); with LossReadout::PerStep, as the Trainer sets
  // it, the loss stays on the device (the model's loss accumulator) and this returns 0.
  double run(const std::vector<Action>& actions, const std::vector<MicroBatchData>& microbatches,
             Pass pass, double dloss, UnitHooks& hooks);
  const PipelineStats& stats() const { return stats_; }

 private:
  struct Slot;
  class StepRun;  // one run()'s state and steps (pipeline_executor.cpp)
  int owner(int chunk) const { return chunk_owner(chunk, stages_, placement_); }
  int tag(int dest_chunk, int microbatch, int direction) const;

  PipelineStage* stage_;
  Communicator* pp_;
  int stages_, virtual_stages_;
  Recompute recompute_;
  TraceWriter* trace_;
  bool early_weights_;
  ChunkPlacement placement_;
  PipelineStats stats_;
  int microbatches_ = 0;
  // The last weight gradient's time (any step's): a late transfer's grace before one is pulled
  // in is kPullGrace of it (see run()).
  static constexpr double kPullGrace = 0.25;
  double last_weight_seconds_ = 0;
};

}  // namespace meshtrain
