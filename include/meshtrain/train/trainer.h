#pragma once
// The training loop of one rank: builds its pipeline stage (model/stage_builder.h) and its
// sharded state from the Config, then steps — pipeline schedule over its micro-batches, gradient
// reduction, global gradient-norm clipping, AdamW with warm-up + cosine learning rate, the
// stage's after-step hook — and evaluates. Around the steps (trainer_run.cpp): what it says
// (train/training_log.h), when it checkpoints (train/checkpoint_cadence.h), replica checks,
// stragglers and stops. The schedule and its re-planning: train/step_schedule.h; rebalancing:
// rebalance() and train/work_balance.h; asynchronous data
// parallelism through the parameter servers: trainer_async.cpp (train/parameter_client.h).

#include <mpi.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "meshtrain/backend/backend.h"
#include "meshtrain/config/config.h"
#include "meshtrain/io/trace_writer.h"
#include "meshtrain/model/pipeline_stage.h"
#include "meshtrain/parallel/model_state.h"
#include "meshtrain/parallel/pipeline_executor.h"
#include "meshtrain/parallel/process_grid.h"
#include "meshtrain/parallel/zero_bubble_costs.h"
#include "meshtrain/train/data_feed.h"
#include "meshtrain/train/step_result.h"
#include "meshtrain/train/step_rerun.h"
#include "meshtrain/train/work_balance.h"

namespace meshtrain {

class CheckpointCadence;
class ChoiceEvaluation;
class ParameterClient;
struct Assignment;
struct LoggedStep;
struct ShareReport;
class PeriodicSample;
class StepSchedule;
class StragglerMonitor;
struct StragglerWindow;
class TrainingLog;

// How run() ended: all train.steps done, or stopped early on SIGUSR1/SIGTERM after writing a
// checkpoint (stop_request.h).
enum class RunEnd { Finished, Stopped };

class Trainer {
 public:
  // DataMode::ShapesOnly builds the run without data or initial values: the planner's dry run.
  Trainer(const Config& config, ProcessGrid& grid, Backend& backend,
          DataMode data = DataMode::Load);
  ~Trainer();

  // Trains from the current step (after resuming per checkpoint.resume) to train.steps, with
  // evaluation, logging and checkpoints; stops early, at a checkpoint, on a stop signal.
  RunEnd run();
  // Called once by run() when start-up can no longer be refused (the checkpoint it resumes, if
  // any, loaded and accepted), before the first step: train publishes its flight records there.
  void on_started(std::function<void()> hook) { started_ = std::move(hook); }
  // One optimizer step (0-based `step`).
  StepResult train_step(int step);
  // Mean validation loss per token over train.eval_batches global batches.
  double evaluate();
  // train.eval_tasks at an evaluation step: scored and logged (nothing without tasks).
  void evaluate_tasks(int step);
  // Every rank's memory peaks since the last reset_memory_peaks(), gathered on all ranks.
  std::vector<MemoryPeaks> memory_peaks();
  void reset_memory_peaks() { be_.memory().reset_peaks(); }

  PipelineStage& model() { return *model_; }
  ProcessGrid& grid() { return grid_; }
  ModelState& state() { return *state_; }
  const std::vector<ChunkRange>& partition() const { return partition_; }
  // How the work is divided (train/work_balance.h): this run's data-parallel shares and partition.
  const WorkPlan& work() const { return work_; }
  // Takes new data-parallel shares from the next step on (every rank, the same shares).
  void set_shares(const std::vector<int>& shares);
  // parallel.rebalance (run() calls it at each log window after the first step): new shares
  // from a closed straggler window's measured compute, when they make the slowest replica 10%
  // faster at the replicas' paces averaged over windows. Every rank alike (the window is
  // all-gathered).
  void rebalance(const StragglerWindow& w);
  int step() const { return step_; }
  void set_step(int step) { step_ = step; }
  // The straggler report's last closed window, the same on every rank (train/straggler_report.h);
  // null before run() or with run.straggler_threshold = 0.
  const StragglerWindow* straggler_window() const;
  // parallel.data_sync = "async" (collective over the workers): the parameter servers listen on
  // `channel` (a duplicate of the job's world; train/parameter_client.h). Before run().
  void attach_servers(MPI_Comm channel);
  // Async: the largest staleness of any share so far, as the servers recorded it (world rank 0;
  // 0 elsewhere).
  int staleness_seen() const;
  // ZB-V after the second step (train/step_schedule.h): what the re-planning did, for the log,
  // once ("" before it and after it is taken).
  std::string take_schedule_note();

 private:
  std::function<void()> started_;  // on_started
  // Asynchronous data parallelism (trainer_async.cpp): shares until the last fence.
  RunEnd run_async();
  ShareReport train_share(const Assignment& share);
  // At a fence (every replica at version f): evaluation, sample, checkpoint, stop. True when
  // the run ends here, with `end`.
  bool at_fence(int f, RunEnd& end);


  double world_sum(double local);
  // Each of `local`'s numbers summed over the world (collective; nothing for none).
  std::vector<double> world_sums(std::vector<double> local, ReduceOp op = ReduceOp::Sum);
  // QK-clip after the optimizer step (model/qk_clip.h): the heads over train.qk_clip_threshold
  // scaled back, counted into r.
  void clip_attention_logits(StepResult& r);
  // One attempt of step `step` (0-based): forward, backward and reductions into the gradients,
  // then the world's loss and the largest gradient norm of any rank into r (the flip_grad fault
  // strikes the first attempt only). No update.
  StepAttempt compute_gradients(int step, const std::vector<MicroBatchData>& batch, bool first,
                                StepResult& r);
  // A step whose loss or gradient norm is not finite, or spikes (run.rerun_spike_factor), runs
  // again on `batch` (train/step_rerun.h): the same bits everywhere is a real spike, taken (or
  // divergence, thrown); a difference is a hardware fault, thrown. Updates `r` from the re-run.
  void rerun_if_suspect(int step, const std::vector<MicroBatchData>& batch, StepAttempt& attempt, StepResult& r);
  // The flip_param faults of config/fault_injection.h after step `step` (1-based).
  void inject_parameter_flips(int step);
  // The replica check (train/replica_check.h) after step `step`, unless it ran there already.
  void check_replicas_at(int step);
  void log_memory(const char* when, int step);

  // The step loop (trainer_run.cpp). Before the first step: resumes (checkpoint.resume); false
  // when the checkpoint leaves nothing to train.
  bool start_run();
  // After step r: checks, log, evaluation, sample, checkpoint, stop request; `times`: the
  // steps' seconds so far. Returns whether the run stops here (on a request).
  bool after_step(const StepResult& r, const std::vector<double>& times);
  void log_window(const StepResult& r, const std::vector<double>& times);
  void finish_run(bool stepped);
  // Set-up (trainer.cpp).
  void build_state(DataMode data);
  void open_data(DataMode data);

  const Config& cfg_;
  ProcessGrid& grid_;
  Backend& be_;
  bool leader_;
  WorkPlan work_;
  std::vector<double> pace_;  // parallel.rebalance: each replica's seconds per micro-batch, averaged
  std::vector<ChunkRange> partition_;
  std::unique_ptr<PipelineStage> model_;
  std::unique_ptr<Backend> host_backend_;  // the offloaded optimizer's (parallel.offload)
  std::unique_ptr<ModelState> state_;
  std::unique_ptr<DataFeed> data_;
  std::unique_ptr<StepSchedule> schedule_;
  TraceWriter trace_;
  std::unique_ptr<PipelineExecutor> executor_;
  std::unique_ptr<TrainingLog> log_;
  std::unique_ptr<CheckpointCadence> checkpoints_;  // null in a planner's dry run
  std::unique_ptr<PeriodicSample> sample_;  // train.sample_every
  std::unique_ptr<ChoiceEvaluation> tasks_;  // train.eval_tasks
  std::unique_ptr<StragglerMonitor> stragglers_;  // run.straggler_threshold; made by run()
  int step_ = 0;
  GradNormHistory grad_norms_;  // the steps taken, for run.rerun_spike_factor
  int replicas_agreed_ = 0;     // the last step at which the replica check passed (or the start)
  std::unique_ptr<ParameterClient> servers_;
};

}  // namespace meshtrain
