#pragma once
// What a training run tells its user: the start-up summary, each logged step's progress line,
// evaluation, memory peaks, straggler windows, rebalancing, checkpoints, stops and the
// asynchronous run's staleness, on stdout and as metrics.jsonl records (io/metrics_writer.h),
// whose scalars also go to TensorBoard where run.tensorboard is on (io/tensorboard_writer.h).
// Every rank holds one and calls it alike; only world rank 0 (the leader) prints and writes.
// It reports what the trainer measured and decides nothing: the formats live here, once.

#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/checkpoint/checkpointer.h"
#include "meshtrain/config/config.h"
#include "meshtrain/io/metrics_writer.h"
#include "meshtrain/io/tensorboard_writer.h"
#include "meshtrain/model/partition.h"
#include "meshtrain/model/pipeline_stage.h"
#include "meshtrain/parallel/process_grid.h"
#include "meshtrain/train/data_feed.h"
#include "meshtrain/train/choice_scoring.h"
#include "meshtrain/train/step_result.h"
#include "meshtrain/train/work_balance.h"

namespace meshtrain {

struct LoggedStep;
struct RankPlace;
struct StragglerWindow;

class TrainingLog {
 public:
  TrainingLog(const Config& config, ProcessGrid& grid);
  ~TrainingLog();

  bool leader() const { return leader_; }
  // Collective (agreed): the leader creates the run directory and opens metrics.jsonl there
  // (and, with run.tensorboard, a new TensorBoard event file in its tensorboard/ folder).
  // Until then (and in a planner's dry run, which never opens it) records go nowhere.
  void open();
  MetricsWriter& metrics() { return *metrics_; }

  // The run's layout, model, schedule, balance, backend, checks and data.
  void start(const WorkPlan& work, const std::vector<ChunkRange>& partition, const Backend& backend,
             const DataFeed& data);
  // A step's progress line and records: `stage` adds what its layers report of the step
  // (PipelineStage::progress_text, metrics_records); `microbatches`: this rank's, for the
  // theoretical bubble.
  void step(const StepResult& r, double eta_seconds, const PipelineStage& stage, int microbatches);
  void val_loss(int step, double val);
  // train.eval_tasks: a line per task (acc, acc_norm) and a metrics record per task.
  void task_scores(int step, const std::vector<TaskScore>& scores);
  // Every rank's memory peaks (gathered: Trainer::memory_peaks) at `step`, `when` ("after the
  // first step").
  void memory(const char* when, int step, const std::vector<MemoryPeaks>& all);
  void stragglers(const StragglerWindow& w, const std::vector<RankPlace>& places);
  void rebalanced(const StragglerWindow& w, const std::vector<int>& before, const std::vector<int>& next);
  // A line of its own (the schedule's re-planning), if not empty.
  void note(const std::string& text);

  // `context_extension` (CheckpointStats::context_extension): printed and recorded when not empty.
  void resumed(const std::string& path, int step, const std::string& context_extension);
  void nothing_to_train(const std::string& path, int step);
  void checkpoint_saved(const CheckpointStats& s);
  void checkpoint_started(const CheckpointStats& s);  // checkpoint.async: the snapshot taken
  void stopping(int step, const std::string& reason);
  void trace_written();

  // Asynchronous data parallelism: the servers' logged steps, with the staleness over each log
  // interval; `bubble`: this rank's last share's (the replicas run apart).
  void async_steps(const std::vector<LoggedStep>& steps, double bubble, const PipelineStage& stage,
                   int microbatches);
  // The largest staleness of any share so far (the leader's count; 0 elsewhere).
  int staleness_seen() const { return stale_max_run_; }

 private:
  // One record to metrics.jsonl and, where on, to TensorBoard.
  void record(const MetricsRecord& fields);
  void record(std::initializer_list<std::pair<const char*, MetricsWriter::Value>> fields);

  const Config& cfg_;
  ProcessGrid& grid_;
  bool leader_;
  std::unique_ptr<MetricsWriter> metrics_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;  // null unless run.tensorboard, on the leader
  // Staleness over the current log interval (async), and the steps' times for the ETA.
  double stale_sum_ = 0;
  int stale_max_ = 0, stale_shares_ = 0, stale_max_run_ = 0;
  std::vector<double> async_times_;
};

// The median of `seconds` (not empty), for the remaining time's estimate.
double median_seconds(std::vector<double> seconds);

}  // namespace meshtrain
