// Trainer: the step loop (synchronous data parallelism; the asynchronous one is
// trainer_async.cpp). Around each step it runs what the run's cadences ask for — replica
// checks, the log window with the straggler report and rebalancing, evaluation, samples,
// checkpoints — and agrees on stop requests, in the same order on every rank.

#include <cstdio>
#include <string>

#include "meshtrain/comm/agreement.h"
#include "meshtrain/train/checkpoint_cadence.h"
#include "meshtrain/train/stop_request.h"
#include "meshtrain/train/straggler_report.h"
#include "meshtrain/train/text_sample.h"
#include "meshtrain/train/trainer.h"
#include "meshtrain/train/training_log.h"

namespace meshtrain {

RunEnd Trainer::run() {
  log_->start(work_, partition_, be_, *data_);
  if (!start_run()) return RunEnd::Finished;
  if (started_) started_();
  if (cfg_.parallel.async()) return run_async();
  // Rebalancing reads the report's windows even when the report itself is off.
  const double threshold = cfg_.run.straggler_threshold;
  if (threshold > 0 || (cfg_.parallel.rebalance && cfg_.parallel.dp > 1))  // collective: nodes, coordinates
    stragglers_ = std::make_unique<StragglerMonitor>(grid_, threshold > 0 ? threshold : 1.25);
  reset_memory_peaks();  // peaks of the training steps, not of set-up
  replicas_agreed_ = step_;  // initialised or loaded alike on every copy
  std::vector<double> times;
  while (step_ < cfg_.train.steps) {
    const StepResult r = train_step(step_);
    times.push_back(r.seconds);
    if (after_step(r, times)) return RunEnd::Stopped;
  }
  finish_run(!times.empty());
  return RunEnd::Finished;
}

bool Trainer::start_run() {
  const std::optional<int> resumed = checkpoints_->resume(*state_);
  if (resumed) step_ = *resumed;
  // The same checkpoint and deck on every rank: the same verdict.
  agree(grid_.world(), [&] {
    data_->start_at(step_, checkpoints_->resumed_data_blend(), checkpoints_->resumed_path());
  });
  return step_ < cfg_.train.steps;  // at train.steps: a finished run started again (past it is refused)
}

bool Trainer::after_step(const StepResult& r, const std::vector<double>& times) {
  const TrainOptions& t = cfg_.train;
  const int check_every = cfg_.run.replica_check_every;
  if (check_every > 0 && r.step % check_every == 0) check_replicas_at(r.step);
  if (stragglers_) stragglers_->add_step(r.compute_seconds, r.seconds);
  if (times.size() == 1) log_memory("after the first step", r.step);
  log_->note(take_schedule_note());
  const bool last = r.step == t.steps;
  if (r.step % cfg_.run.log_every == 0 || r.step == 1 || last) log_window(r, times);
  if (data_->has_val() && ((t.eval_every > 0 && r.step % t.eval_every == 0) || last))
    log_->val_loss(r.step, evaluate());
  if ((t.eval_every > 0 && r.step % t.eval_every == 0) || last) evaluate_tasks(r.step);
  if (sample_) sample_->after_step(r.step, *model_, grid_.comm(Axis::Pipeline));
  const bool scheduled = checkpoints_->scheduled(r.step, last);
  // A stop request may reach the ranks in different steps: agree on it after every step.
  const int request = static_cast<int>(grid_.world().all_reduce_scalar(stop_request(), ReduceOp::Max));
  const bool stop = request != 0 && !last;
  checkpoints_->report(false);
  // No checkpoint stores copies that disagree: checked before each save (with the check on).
  if (check_every > 0 && (scheduled || stop)) check_replicas_at(r.step);
  // A stop and the end of the run save in the foreground: the job ends right after.
  if (scheduled || stop)
    checkpoints_->save(*state_, step_, cfg_.checkpoint.async && request == 0 && !last, data_->blend_position(step_));
  if (request != 0) consume_stop_file();  // served, by this stop or by the end of training
  if (!stop) return false;
  log_->stopping(r.step, stop_reason(request));
  log_memory("over the run", step_);
  return true;
}

void Trainer::log_window(const StepResult& r, const std::vector<double>& times) {
  log_->step(r, median_seconds(times) * (cfg_.train.steps - r.step), *model_, data_->microbatches());
  if (!stragglers_) return;
  // Every rank logs at this step: one all-gather closes the window everywhere.
  const StragglerWindow& w = stragglers_->close_window(grid_.world(), r.step);
  if (cfg_.run.straggler_threshold > 0) log_->stragglers(w, stragglers_->places());
  // The first step's window holds one-time costs (allocation, first-touch): not a speed.
  if (cfg_.parallel.rebalance && r.step > 1 && r.step != cfg_.train.steps) rebalance(w);
}

void Trainer::finish_run(bool stepped) {
  checkpoints_->report(true);  // train.steps not a multiple of checkpoint.every: none is left
  if (stepped) log_memory("over the run", step_);
  if (!cfg_.run.trace) return;
  const std::string path = cfg_.run.dir + "/trace_rank" + std::to_string(grid_.world_rank()) + ".json";
  agree(grid_.world(), [&] { trace_.write(path); });
  log_->trace_written();
}

}  // namespace meshtrain
