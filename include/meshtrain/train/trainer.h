#pragma once
// The training loop of one rank: builds its model chunks and their sharded state from the
// Config, then steps — pipeline schedule over its micro-batches, gradient reduction, global
// gradient-norm clipping, AdamW with warm-up + cosine learning rate — evaluates, logs
// (rank 0: a progress line on stdout, metrics.jsonl in the run directory) and traces.

#include <mpi.h>

#include <array>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "meshtrain/backend/backend.h"
#include "meshtrain/config/config.h"
#include "meshtrain/io/metrics_writer.h"
#include "meshtrain/io/trace_writer.h"
#include "meshtrain/model/pipeline_stage.h"
#include "meshtrain/parallel/model_state.h"
#include "meshtrain/parallel/pipeline_executor.h"
#include "meshtrain/parallel/process_grid.h"
#include "meshtrain/parallel/zero_bubble_costs.h"
#include "meshtrain/train/data_feed.h"
#include "meshtrain/train/step_rerun.h"
#include "meshtrain/train/work_balance.h"

namespace meshtrain {

class Checkpointer;
class ParameterClient;
struct Assignment;
struct LoggedStep;
struct ShareReport;
class PeriodicSample;
class StragglerMonitor;
struct StragglerWindow;

struct StepResult {
  int step = 0;  // optimizer steps completed
  double loss = 0, lr = 0, grad_norm = 0;
  double seconds = 0, tokens_per_second = 0;
  double bubble = 0;  // measured, mean over ranks
  // This rank's pipeline phase (the executor's forward and backward): its compute and its
  // length; bubble is 1 - their ratio, averaged over the ranks.
  double pipeline_compute_seconds = 0, pipeline_seconds = 0;
  double pipeline_longest_action_seconds = 0;  // this rank's longest compute action (padded)
  // This rank's compute: forward and backward (the executor's), and the optimizer step (with
  // ZeRO's parameter all-gather, which the ranks reach together: the loss and gradient-norm
  // reductions before it synchronise them). Host wall-clock time: with asynchronous kernels
  // (CUDA), only what the host waits for inside these calls.
  double compute_seconds = 0;
  // The statistics the stage's layers asked for (PipelineStage::take_step_statistics: a mixture
  // of experts' loads and balancing losses), summed over the world; empty where none did.
  std::vector<double> layer_statistics;
};

// Per-category peaks of one rank's memory, as reported in the log and metrics.jsonl.
struct MemoryPeaks {
  int world_rank = 0, dp = 0, tp = 0, pp = 0, cp = 0;
  std::array<size_t, kMemoryCategories> peak{};  // per category
  size_t peak_total = 0;                          // of the sum, at its highest moment
};

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
  // Writes a checkpoint of the current state now (collective; checkpoint/checkpointer.h), e.g. on
  // request from a signal handler; run() calls it every checkpoint.every steps. With
  // `in_background` (checkpoint.async) it returns after the snapshot and the write goes on
  // while training does; run() reports it when it ends.
  void save_checkpoint(bool in_background = false);
  // Reports an asynchronous save that has ended (collective): the one still running if `wait`,
  // else only one every rank has finished.
  void report_background_save(bool wait);
  // parallel.data_sync = "async" (collective over the workers): the parameter servers listen on
  // `channel` (a duplicate of the job's world; train/parameter_client.h). Before run().
  void attach_servers(MPI_Comm channel);
  // Async: the largest staleness of any share so far, as the servers recorded it (world rank 0;
  // 0 elsewhere).
  int staleness_seen() const { return stale_max_run_; }
  // ZB-V after the second step (trainer_replan.cpp): what the re-planning did, for the log, once
  // ("" before it and after it is taken).
  std::string take_schedule_note() { return std::exchange(schedule_note_, std::string()); }

 private:
  std::function<void()> started_;  // on_started
  // Asynchronous data parallelism (trainer_async.cpp): shares until the last fence.
  RunEnd run_async();
  ShareReport train_share(const Assignment& share);
  // At a fence (every replica at version f): evaluation, sample, checkpoint, stop. True when
  // the run ends here, with `end`.
  bool at_fence(int f, RunEnd& end);
  void log_async(const std::vector<LoggedStep>& steps);

  // ZB-V re-planned for measured costs (trainer_replan.cpp): whether this run does it, and the
  // collective that does (every rank, after the second step).
  bool replans_for_costs() const;
  void replan_for_measured_costs();

  double world_sum(double local);
  // Each of `local`'s numbers summed over the world (collective; nothing for none).
  std::vector<double> world_sums(std::vector<double> local);
  // One attempt of step `step` (0-based): forward, backward and reductions into the gradients,
  // then the world's loss and the largest gradient norm of any rank into r (the flip_grad fault
  // strikes the first attempt only). No update.
  StepAttempt compute_gradients(int step, const std::vector<MicroBatchData>& batch, bool first,
                                StepResult& r);
  // The replica check (train/replica_check.h) after step `step`, unless it ran there already.
  void check_replicas_at(int step);
  void log_memory(const char* when, int step);
  void log_start();
  void log_step(const StepResult& r, double eta_seconds);
  void log_stragglers(const StragglerWindow& w);

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
  std::vector<Action> train_actions_, eval_actions_;
  int steps_timed_ = 0;                       // steps run, up to 2: then re-planned (zb-v)
  std::optional<ChunkActionCosts> costs_;     // set where they gave a better schedule
  std::string schedule_note_;
  TraceWriter trace_;
  std::unique_ptr<PipelineExecutor> executor_;
  std::unique_ptr<MetricsWriter> metrics_;
  std::unique_ptr<Checkpointer> checkpointer_;
  std::unique_ptr<PeriodicSample> sample_;  // train.sample_every
  std::unique_ptr<StragglerMonitor> stragglers_;  // run.straggler_threshold; made by run()
  int step_ = 0;
  GradNormHistory grad_norms_;  // the steps taken, for run.rerun_spike_factor
  int replicas_agreed_ = 0;     // the last step at which the replica check passed (or the start)
  std::unique_ptr<ParameterClient> servers_;
  // Staleness over the current log interval (async), and the steps' median time for the ETA.
  double stale_sum_ = 0;
  int stale_max_ = 0, stale_shares_ = 0, stale_max_run_ = 0;
  std::vector<double> async_times_;
};

}  // namespace meshtrain
