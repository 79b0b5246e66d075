#include "meshtrain/train/training_log.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "meshtrain/comm/agreement.h"
#include "meshtrain/io/run_directory.h"
#include "meshtrain/parallel/schedule_simulator.h"
#include "meshtrain/parallel/server_channel.h"
#include "meshtrain/train/straggler_report.h"

namespace meshtrain {

namespace {

std::string format_duration(double seconds) {
  const long s = std::lround(std::max(0.0, seconds));
  char buf[32];
  std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", s / 3600, (s / 60) % 60, s % 60);
  return buf;
}

}  // namespace

double median_seconds(std::vector<double> seconds) {
  std::nth_element(seconds.begin(), seconds.begin() + static_cast<std::ptrdiff_t>(seconds.size() / 2), seconds.end());
  return seconds[seconds.size() / 2];
}

TrainingLog::TrainingLog(const Config& config, ProcessGrid& grid)
    : cfg_(config), grid_(grid), leader_(grid.world_rank() == 0), metrics_(std::make_unique<MetricsWriter>("")) {}

TrainingLog::~TrainingLog() = default;

void TrainingLog::open() {
  agree(grid_.world(), [&] {
    if (!leader_) return;
    create_run_directory(cfg_.deck_path, cfg_.run.dir);
    // TensorBoard's folder first: a run refused for it leaves no metrics.jsonl behind.
    if (cfg_.run.tensorboard) tensorboard_ = std::make_unique<TensorBoardWriter>(cfg_.run.dir + "/tensorboard");
    metrics_ = std::make_unique<MetricsWriter>(cfg_.run.dir + "/metrics.jsonl");
  });
}

void TrainingLog::record(const MetricsRecord& fields) {
  metrics_->write(fields);
  if (tensorboard_) tensorboard_->write(fields);
}

// Passed on as the list: each writer builds its record out of line (GCC 12's bogus
// -Wmaybe-uninitialized on a vector of variants built here).
void TrainingLog::record(std::initializer_list<std::pair<const char*, MetricsWriter::Value>> fields) {
  metrics_->write(fields);
  if (tensorboard_) tensorboard_->write(fields);
}

void TrainingLog::start(const WorkPlan& work, const std::vector<ChunkRange>& partition, const Backend& backend,
                        const DataFeed& data) {
  if (!leader_) return;
  const ParallelOptions& p = cfg_.parallel;
  const ModelSpec& m = cfg_.model;
  const std::string cp = p.cp > 1 ? " x cp " + std::to_string(p.cp) : std::string();
  std::printf("meshtrain %s | run %s | %d ranks on %d node(s): dp %d x tp %d x pp %d%s (order %s)\n",
              MESHTRAIN_VERSION, cfg_.run.name.c_str(), grid_.world_size(), grid_.node_count(),
              p.dp, p.tp, p.pp, cp.c_str(), grid_.shape().order_string().c_str());
  std::printf("model: %d layers, d_model %ld, %ld heads, seq_len %ld, vocab %ld, %.2fM parameters%s\n",
              m.layers, static_cast<long>(m.d_model), static_cast<long>(m.heads),
              static_cast<long>(m.seq_len), static_cast<long>(m.vocab_size),
              static_cast<double>(m.parameter_count()) / 1e6, m.tie_embeddings ? " (tied embeddings)" : "");
  std::printf("schedule %s, %d micro-batch(es) of %d per step, virtual stages %d, zero %d, "
              "recompute %s, sequence parallel %s\n",
              std::string(schedule_name(p.schedule)).c_str(), data.microbatches(),
              cfg_.train.micro_batch, p.virtual_stages, p.zero,
              p.recompute == Recompute::None ? "none" : p.recompute == Recompute::Selective ? "selective" : "full",
              p.sequence_parallel ? "on" : "off");
  if (!work.rank_speeds.empty() || p.rebalance) {
    std::string speeds;
    for (size_t r = 0; r < work.rank_speeds.size(); ++r) {
      char buf[16];
      std::snprintf(buf, sizeof buf, "%s%.2f", r ? " " : "", work.rank_speeds[r]);
      speeds += buf;
    }
    std::printf("work balance %s%s: data-parallel shares %s micro-batches%s%s\n", work.source.c_str(),
                p.rebalance ? " (rebalanced from measured compute)" : "",
                describe_shares(work.shares).c_str(), speeds.empty() ? "" : "; rank speeds ",
                speeds.c_str());
  }
  if (p.async())
    std::printf("data parallelism asynchronous: %d parameter server(s) (ranks %d-%d) hold the optimizer; "
                "a gradient's parameters at most %d version(s) old\n",
                p.servers, grid_.world_size(), grid_.world_size() + p.servers - 1, p.staleness);
  std::printf("partition %s; backend %s\n", describe_partition(partition).c_str(),
              backend.describe().c_str());
  if (cfg_.run.replica_check_every > 0 && !p.async()) {  // what train/replica_check.h compares
    std::string what;
    const int replicas = grid_.replicas().size();
    if (p.zero < 3 && replicas > 1)
      what += "parameters" + std::string(p.zero == 0 ? " and optimizer state" : "") + " over " +
              std::to_string(replicas) + " data-parallel replicas";
    if (p.tp > 1)
      what += (what.empty() ? "" : ", ") + std::string("unsplit parameters over ") + std::to_string(p.tp) +
              " tensor ranks";
    if (p.pp > 1 && cfg_.model.tie_embeddings)
      what += (what.empty() ? "" : ", ") + std::string("the tied embedding on the first and last stage");
    if (what.empty())
      what = "nothing to compare: no state has copies in this layout (ZeRO 3 shards it over the "
             "data-parallel ranks; tp 1; no embedding tied across stages)";
    std::printf("replica check every %d steps: %s\n", cfg_.run.replica_check_every, what.c_str());
  }
  std::printf("data: train %s; val %s\n", data.describe_train().c_str(), data.describe_val().c_str());
  std::fflush(stdout);
}

void TrainingLog::step(const StepResult& r, double eta_seconds, const PipelineStage& stage, int microbatches) {
  if (!leader_) return;
  const ParallelOptions& p = cfg_.parallel;
  std::string bubble;
  if (p.pp > 1) {
    char buf[64];
    std::snprintf(buf, sizeof buf, " | bubble %.2f (theory %.2f)", r.bubble,
                  theoretical_bubble(p.schedule, p.pp, microbatches, p.virtual_stages));
    bubble = buf;
  }
  bubble += stage.progress_text(r.layer_statistics);
  const bool qk_clip = cfg_.train.qk_clip_threshold > 0;
  if (qk_clip) {
    char buf[96];
    std::snprintf(buf, sizeof buf, " | qk max logit %.2f, clipped %d", r.max_attention_logit,
                  r.clipped_heads);
    bubble += buf;
  }
  std::printf("step %5d/%d | loss %.4f | lr %.2e | grad_norm %.3f | %8.0f tok/s | %7.1f ms%s | eta %s\n",
              r.step, cfg_.train.steps, r.loss, r.lr, r.grad_norm, r.tokens_per_second,
              r.seconds * 1e3, bubble.c_str(), format_duration(eta_seconds).c_str());
  std::fflush(stdout);
  record({{"step", int64_t{r.step}},
                   {"loss", r.loss},
                   {"lr", r.lr},
                   {"grad_norm", r.grad_norm},
                   {"tokens_per_s", r.tokens_per_second},
                   {"step_ms", r.seconds * 1e3},
                   {"bubble", r.bubble}});
  if (qk_clip)
    metrics_->write({{"step", int64_t{r.step}},
                     {"qk_max_logit", r.max_attention_logit},
                     {"qk_clipped_heads", int64_t{r.clipped_heads}}});
  // What the layers report of the step (a mixture of experts' loads): lines of their own.
  for (const MetricsRecord& layers : stage.metrics_records(r.step, r.layer_statistics)) record(layers);
}

void TrainingLog::val_loss(int step, double val) {
  if (leader_) {
    std::printf("step %5d/%d | val_loss %.4f\n", step, cfg_.train.steps, val);
    std::fflush(stdout);
  }
  record({{"step", int64_t{step}}, {"val_loss", val}});
}

void TrainingLog::task_scores(int step, const std::vector<TaskScore>& scores) {
  for (const TaskScore& s : scores) {
    if (leader_)
      std::printf("step %5d/%d | task %s: acc %.4f acc_norm %.4f (%lld examples)\n", step,
                  cfg_.train.steps, s.name.c_str(), s.acc(), s.acc_norm(),
                  static_cast<long long>(s.examples));
    metrics_->write({{"step", int64_t{step}}, {"task", s.name}, {"acc", s.acc()},
                     {"acc_norm", s.acc_norm()}, {"examples", s.examples}});
  }
  if (leader_) std::fflush(stdout);
}

void TrainingLog::memory(const char* when, int step, const std::vector<MemoryPeaks>& all) {
  if (!leader_) return;
  std::printf("memory peaks %s (per rank; total = the sum at its highest moment):\n", when);
  for (const MemoryPeaks& p : all) {
    std::string line;
    for (size_t c = 0; c < kMemoryCategories; ++c)
      line += std::string(c ? ", " : "") + std::string(category_name(static_cast<MemoryCategory>(c))) +
              " " + format_bytes(static_cast<double>(p.peak[c]));
    const std::string cp = cfg_.parallel.cp > 1 ? " cp " + std::to_string(p.cp) : std::string();
    std::printf("  rank %d (dp %d tp %d pp %d%s): %s; total %s\n", p.world_rank, p.dp, p.tp, p.pp,
                cp.c_str(), line.c_str(), format_bytes(static_cast<double>(p.peak_total)).c_str());
    record({{"step", int64_t{step}},
                     {"memory_rank", int64_t{p.world_rank}},
                     {"parameters", static_cast<int64_t>(p.peak[0])},
                     {"gradients", static_cast<int64_t>(p.peak[1])},
                     {"optimizer", static_cast<int64_t>(p.peak[2])},
                     {"activations", static_cast<int64_t>(p.peak[3])},
                     {"comm", static_cast<int64_t>(p.peak[4])},
                     {"workspace", static_cast<int64_t>(p.peak[5])},
                     {"snapshot", static_cast<int64_t>(p.peak[6])},
                     {"peak_total", static_cast<int64_t>(p.peak_total)}});
  }
  std::fflush(stdout);
}

void TrainingLog::stragglers(const StragglerWindow& w, const std::vector<RankPlace>& places) {
  if (!leader_) return;
  for (int rank : w.stragglers)
    std::printf("%s\n", describe_straggler(w, rank, places[static_cast<size_t>(rank)]).c_str());
  std::fflush(stdout);
  record({{"step", int64_t{w.step}},
                   {"rank_compute_ms", w.compute_ms},
                   {"rank_wait_ms", w.wait_ms},
                   {"stragglers", std::vector<int64_t>(w.stragglers.begin(), w.stragglers.end())}});
}

void TrainingLog::rebalanced(const StragglerWindow& w, const std::vector<int>& before, const std::vector<int>& next) {
  if (!leader_) return;
  std::printf("rebalance at step %d: data-parallel shares %s -> %s micro-batches (from the measured "
              "compute of the last %d step(s))\n",
              w.step, describe_shares(before).c_str(), describe_shares(next).c_str(), w.steps);
  std::fflush(stdout);
  record({{"step", int64_t{w.step}}, {"shares", std::vector<int64_t>(next.begin(), next.end())}});
}

void TrainingLog::note(const std::string& text) {
  if (!leader_ || text.empty()) return;
  std::printf("%s\n", text.c_str());
  std::fflush(stdout);
}

void TrainingLog::resumed(const std::string& path, int step, const std::string& context_extension) {
  if (!leader_) return;
  std::printf("resumed from %s at step %d\n", path.c_str(), step);
  if (!context_extension.empty()) {
    // Where the run's context changed, so that its metrics before and after read apart.
    std::printf("context extension: %s (the checkpoint's -> the deck's)\n", context_extension.c_str());
    record({{"step", int64_t{step}}, {"resumed_from", path}, {"context_extension", context_extension}});
  }
  std::fflush(stdout);
}

void TrainingLog::nothing_to_train(const std::string& path, int step) {
  if (!leader_) return;
  std::printf("nothing to train: %s is at step %d and train.steps = %d (raise train.steps to "
              "train further)\n", path.c_str(), step, cfg_.train.steps);
  std::fflush(stdout);
}

void TrainingLog::checkpoint_saved(const CheckpointStats& s) {
  if (!leader_) return;
  char waited[64] = "";
  if (s.asynchronous) std::snprintf(waited, sizeof waited, "; training waited %.3f s in all", s.stall_seconds);
  std::printf("checkpoint %s (%.1f MB, %.2f s: write %.2f (%s), flush + verify %.2f; %.1f MB/s)%s%s\n",
              s.path.c_str(), s.bytes / 1e6, s.seconds, s.data_seconds,
              s.independent ? "independent" : "collective", s.verify_seconds,
              s.bytes / 1e6 / std::max(s.seconds, 1e-9),
              s.asynchronous ? " written in the background" : "", waited);
  std::fflush(stdout);
}

void TrainingLog::checkpoint_started(const CheckpointStats& s) {
  if (!leader_) return;
  std::printf("checkpoint %s: snapshot of %.1f MB started, training waited %.3f s; copying and writing in the "
              "background\n",
              s.path.c_str(), s.bytes / 1e6, s.stall_seconds);
  std::fflush(stdout);
}

void TrainingLog::stopping(int step, const std::string& reason) {
  if (!leader_) return;
  std::printf("stopping at step %d on %s: checkpoint written; run again (requeue) to resume\n", step,
              reason.c_str());
  std::fflush(stdout);
}

void TrainingLog::trace_written() {
  if (leader_) std::printf("trace written: %s/trace_rank<N>.json\n", cfg_.run.dir.c_str());
}

void TrainingLog::async_steps(const std::vector<LoggedStep>& steps, double bubble, const PipelineStage& stage,
                              int microbatches) {
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
    StepResult r;
    r.step = step;
    r.loss = l.loss_sum / tokens;
    r.lr = l.lr;
    r.grad_norm = l.grad_norm;
    r.seconds = l.seconds;
    r.tokens_per_second = tokens / std::max(l.seconds, 1e-9);
    r.bubble = bubble;  // this rank's last share: the replicas run apart
    this->step(r, median_seconds(async_times_) * (t.steps - step), stage, microbatches);
    const double mean = stale_shares_ ? stale_sum_ / stale_shares_ : 0.0;
    std::printf("step %5d/%d | staleness mean %.2f max %d (bound %d) over %d share(s)\n", step, t.steps, mean,
                stale_max_, cfg_.parallel.staleness, stale_shares_);
    std::fflush(stdout);
    record({{"step", int64_t{step}},
                     {"staleness_mean", mean},
                     {"staleness_max", int64_t{stale_max_}},
                     {"staleness_bound", int64_t{cfg_.parallel.staleness}},
                     {"shares", int64_t{stale_shares_}}});
    stale_sum_ = 0;
    stale_max_ = stale_shares_ = 0;
  }
}

}  // namespace meshtrain
