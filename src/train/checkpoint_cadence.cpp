#include "meshtrain/train/checkpoint_cadence.h"

#include "meshtrain/comm/agreement.h"
#include "meshtrain/train/stop_request.h"

namespace meshtrain {

CheckpointCadence::CheckpointCadence(const Config& config, ProcessGrid& grid, TrainingLog& log,
                                     MemoryTracker& memory)
    : cfg_(config), grid_(grid), log_(log), memory_(memory), checkpointer_(std::make_unique<Checkpointer>(config, grid)) {}

CheckpointCadence::~CheckpointCadence() = default;

std::optional<int> CheckpointCadence::resume(ModelState& state) {
  const std::string path = checkpointer_->begin_run();
  if (path.empty()) return std::nullopt;
  const CheckpointStats loaded = checkpointer_->load(state, path);
  const int step = static_cast<int>(loaded.step);
  resumed_path_ = path;
  resumed_data_blend_ = loaded.data_blend;
  log_.resumed(path, step, loaded.context_extension);
  check_stop_during_startup(grid_.world(), "loading the checkpoint");
  // Every rank loaded the same step: the same verdict everywhere.
  const int steps = cfg_.train.steps;
  if (step > steps)
    throw AgreedError(path + ": the checkpoint is at step " + std::to_string(step) + ", past train.steps = " +
                      std::to_string(steps) + ": nothing to train (raise train.steps above " +
                      std::to_string(step) + " to train further, or resume an earlier checkpoint "
                      "with checkpoint.resume = \"<path>\")");
  // A finished run started again (e.g. a requeued job): not an error.
  if (step == steps) log_.nothing_to_train(path, step);
  return step;
}

bool CheckpointCadence::scheduled(int step, bool last) const {
  const int every = cfg_.checkpoint.every;
  return every > 0 && (step % every == 0 || last);
}

void CheckpointCadence::save(ModelState& state, int step, bool in_background, const std::string& data_blend) {
  if (!in_background) {
    if (const std::optional<CheckpointStats> previous = checkpointer_->wait_for_save()) log_.checkpoint_saved(*previous);
    log_.checkpoint_saved(checkpointer_->save(state, step, data_blend));
    return;
  }
  log_.checkpoint_started(checkpointer_->start_save(state, step, memory_, data_blend));
}

void CheckpointCadence::report(bool wait) {
  if (!checkpointer_->save_in_progress()) return;
  const std::optional<CheckpointStats> s = wait ? checkpointer_->wait_for_save() : checkpointer_->poll();
  if (s) log_.checkpoint_saved(*s);
}

}  // namespace meshtrain
