// Trainer, asynchronous data parallelism (parallel.data_sync = "async"): each replica takes
// shares of steps from the parameter servers at its own pace, pushes its gradients and pulls
// newer parameters (train/parameter_client.h); evaluation, samples, checkpoints and stops happen
// at fences, where every replica holds the same version (parallel/share_scheduler.h).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "meshtrain/train/checkpoint_cadence.h"
#include "meshtrain/train/parameter_client.h"
#include "meshtrain/train/step_schedule.h"
#include "meshtrain/train/stop_request.h"
#include "meshtrain/train/text_sample.h"
#include "meshtrain/train/trainer.h"
#include "meshtrain/train/training_log.h"

namespace meshtrain {

void Trainer::attach_servers(MPI_Comm channel) {
  servers_ = std::make_unique<ParameterClient>(cfg_, grid_, *state_, channel);
}

ShareReport Trainer::train_share(const Assignment& share) {
  TraceWriter::Scope span(trace_, "share " + std::to_string(share.step + 1) + "." + std::to_string(share.share),
                          "step", TraceWriter::Step);
  const double tokens = static_cast<double>(cfg_.train.global_batch) * static_cast<double>(cfg_.model.seq_len);
  data_->set_replica(share.share);
  const std::vector<MicroBatchData> batch = data_->train_batch(static_cast<int>(share.step));
  state_->begin_step();
  executor_->run(schedule_->train(), batch, Pass::Train, 1.0 / tokens, *state_);
  state_->finish_backward();
  const double local_loss = model_->loss().take();
  ShareReport r;
  r.step = share.step;
  r.share = share.share;
  r.version = servers_->version();
  // The head runs on every tensor rank of the last stage: its loss counts once.
  r.loss_sum = servers_->replica_sum(grid_.rank(Axis::Tensor) == 0 ? local_loss : 0.0);
  servers_->push(share);
  return r;
}

int Trainer::staleness_seen() const { return log_->staleness_seen(); }

bool Trainer::at_fence(int f, RunEnd& end) {
  const TrainOptions& t = cfg_.train;
  servers_->ensure_version(f);
  step_ = f;
  const bool last = f == t.steps;
  data_->set_replica(grid_.rank(Axis::Data));  // evaluation reads this replica's own samples
  if (data_->has_val() && ((t.eval_every > 0 && f % t.eval_every == 0) || last)) log_->val_loss(f, evaluate());
  if (sample_) sample_->after_step(f, *model_, grid_.comm(Axis::Pipeline));
  const bool scheduled = checkpoints_->scheduled(f, last);
  const int request = static_cast<int>(grid_.world().all_reduce_scalar(stop_request(), ReduceOp::Max));
  if (scheduled || (request != 0 && !last)) {
    servers_->pull_state(f);
    checkpoints_->save(*state_, step_, false, data_->blend_position(step_));
  }
  if (request != 0) consume_stop_file();
  if (request != 0 && !last) {
    log_->stopping(f, stop_reason(request));
    log_memory("over the run", step_);
    end = RunEnd::Stopped;
    return true;
  }
  if (!last) return false;
  log_memory("over the run", step_);
  end = RunEnd::Finished;
  return true;
}

RunEnd Trainer::run_async() {
  if (!servers_) throw std::logic_error("Trainer::run_async: no parameter servers attached");
  servers_->upload(step_);
  reset_memory_peaks();
  ShareReport report;
  std::vector<LoggedStep> logged;
  for (;;) {
    const Assignment a = servers_->next(report, logged);
    log_->async_steps(logged, executor_->stats().bubble(), *model_, data_->microbatches());
    report = ShareReport{};
    if (a.kind == AssignmentKind::Fence) {
      RunEnd end;
      if (at_fence(static_cast<int>(a.step), end)) return end;
      continue;
    }
    servers_->ensure_version(a.min_version);
    report = train_share(a);
  }
}

}  // namespace meshtrain
