#pragma once
// When a training run reads and writes checkpoints: the one checkpoint.resume names, loaded
// before the first step; one every checkpoint.every steps and at the end, in the background
// with checkpoint.async (a stop and the end save in the foreground: the job ends right after);
// a background save collected after each step, its line printed then. The Checkpointer
// (checkpoint/checkpointer.h) knows how; this class knows when, and says what happened
// (train/training_log.h). Every method is collective over the world.

#include <memory>
#include <optional>
#include <string>

#include "meshtrain/checkpoint/checkpointer.h"
#include "meshtrain/config/config.h"
#include "meshtrain/parallel/model_state.h"
#include "meshtrain/parallel/process_grid.h"
#include "meshtrain/train/training_log.h"

namespace meshtrain {

class CheckpointCadence {
 public:
  // memory: where a background save's snapshot is counted (the tracker the memory report reads).
  CheckpointCadence(const Config& config, ProcessGrid& grid, TrainingLog& log, MemoryTracker& memory);
  ~CheckpointCadence();

  // Before the first step: loads the checkpoint checkpoint.resume names (if any) into `state`
  // and returns its step (nothing when the run starts afresh). Refuses (AgreedError) a
  // checkpoint past train.steps; one at train.steps is said to leave nothing to train.
  std::optional<int> resume(ModelState& state);
  // After resume: the loaded checkpoint's path and blend position ("" if none).
  const std::string& resumed_path() const { return resumed_path_; }
  const std::string& resumed_data_blend() const { return resumed_data_blend_; }
  // Whether step `step` (completed; `last`: train.steps) is one checkpoint.every saves at.
  bool scheduled(int step, bool last) const;
  // Writes `state` at `step` now; `in_background` (checkpoint.async): returns after the
  // snapshot, and report(false) collects the write later.
  // `data_blend`: the blend position the file records ("" for one source).
  void save(ModelState& state, int step, bool in_background, const std::string& data_blend);
  // Reports a background save that has ended: the one still running if `wait`, else only one
  // every rank has finished.
  void report(bool wait);

 private:
  const Config& cfg_;
  ProcessGrid& grid_;
  TrainingLog& log_;
  MemoryTracker& memory_;
  std::unique_ptr<Checkpointer> checkpointer_;
  std::string resumed_path_, resumed_data_blend_;
};

}  // namespace meshtrain
