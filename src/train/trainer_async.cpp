// Trainer, asynchronous data parallelism (parallel.data_sync = "async"): each replica takes
// shares of steps from the parameter servers at its own pace, pushes its gradients and pulls
// newer parameters (train/parameter_client.h); evaluation, samples, checkpoints and stops happen
// at fences, where every replica holds the same version (parallel/share_scheduler.h).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "meshtrain/checkpoint/checkpointer.h"
#include "meshtrain/train/parameter_client.h"
#include "meshtrain/train/stop_request.h"
#include "meshtrain/train/text_sample.h"
#include "meshtrain/train/trainer.h"

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
  executor_->run(train_actions_, batch, Pass::Train, 1.0 / tokens, *state_);
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

void Trainer::log_async(const std::vector<LoggedStep>& steps) {
  if (!leader_) return;
  const TrainOptions& t = cfg_.train;
  const double tokens = static_cast<double>(t.global_batch) * static_cast<double>(cfg_.model.seq_len);
  for (const LoggedStep& l : steps) {
    const int step = static_cast<int>(l.step) + 1;
    stale_sum_ += l.staleness_mean * l.shares;
    stale_shares_ += l.shares;
    stale_max_ = std::max(stale_max_, static_cast<int>(l.staleness_max));
    stale_max_run_ = std::max(stale_max_run_, stale_max_);
    async_times_.push_back(l.seconds);
    if (step % cfg_.run.log_every != 0 && step != 1 && step != t.steps) continue;
    std::vector<double> sorted = async_times_;
    std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
    StepResult r;
    r.step = step;
    r.loss = l.loss_sum / tokens;
    r.lr = l.lr;
    r.grad_norm = l.grad_norm;
    r.seconds = l.seconds;
    r.tokens_per_second = tokens / std::max(l.seconds, 1e-9);
    r.bubble = executor_->stats().bubble();  // this rank's last share: the replicas run apart
    log_step(r, sorted[sorted.size() / 2] * (t.steps - step));
    const double mean = stale_shares_ ? stale_sum_ / stale_shares_ : 0.0;
    std::printf("step %5d/%d | staleness mean %.2f max %d (bound %d) over %d share(s)\n", step, t.steps, mean,
                stale_max_, cfg_.parallel.staleness, stale_shares_);
    std::fflush(stdout);
    metrics_->write({{"step", int64_t{step}},
                     {"staleness_mean", mean},
                     {"staleness_max", int64_t{stale_max_}},
                     {"staleness_bound", int64_t{cfg_.parallel.staleness}},
                     {"shares", int64_t{stale_shares_}}});
    stale_sum_ = 0;
    stale_max_ = stale_shares_ = 0;
  }
}

bool Trainer::at_fence(int f, RunEnd& end) {
  const TrainOptions& t = cfg_.train;
  servers_->ensure_version(f);
  step_ = f;
  const bool last = f == t.steps;
  data_->set_replica(grid_.rank(Axis::Data));  // evaluation reads this replica's own samples
  if (data_->has_val() && ((t.eval_every > 0 && f % t.eval_every == 0) || last)) {
    const double val = evaluate();
    if (leader_) {
      std::printf("step %5d/%d | val_loss %.4f\n", f, t.steps, val);
      std::fflush(stdout);
    }
    metrics_->write({{"step", int64_t{f}}, {"val_loss", val}});
  }
  if (sample_) sample_->after_step(f, *model_, grid_.comm(Axis::Pipeline));
  const int every = cfg_.checkpoint.every;
  const bool scheduled = every > 0 && (f % every == 0 || last);
  const int request = static_cast<int>(grid_.world().all_reduce_scalar(stop_request(), ReduceOp::Max));
  if (scheduled || (request != 0 && !last)) {
    servers_->pull_state(f);
    save_checkpoint();
  }
  if (request != 0) consume_stop_file();
  if (request != 0 && !last) {
    if (leader_) {
      std::printf("stopping at step %d on %s: checkpoint written; run again (requeue) to resume\n", f,
                  stop_reason(request).c_str());
      std::fflush(stdout);
    }
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
    log_async(logged);
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
