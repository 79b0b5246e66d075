#include "meshtrain/train/trainer.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/checkpoint/checkpointer.h"
#include "meshtrain/comm/agreement.h"
#include "meshtrain/config/fault_injection.h"
#include "meshtrain/io/data_error.h"
#include "meshtrain/io/run_directory.h"
#include "meshtrain/model/stage_builder.h"
#include "meshtrain/parallel/schedule_cache.h"
#include "meshtrain/parallel/schedule_simulator.h"
#include "meshtrain/train/divergence.h"
#include "meshtrain/train/lr_schedule.h"
#include "meshtrain/train/parameter_client.h"
#include "meshtrain/train/replica_check.h"
#include "meshtrain/train/step_rerun.h"
#include "meshtrain/train/stop_request.h"
#include "meshtrain/train/straggler_report.h"
#include "meshtrain/train/text_sample.h"

namespace meshtrain {

namespace {

// This rank's chunks in model order, where the schedule places them (schedule.h rank_chunks).
std::vector<ChunkRange> my_chunks(const std::vector<ChunkRange>& all, const ParallelOptions& p,
                                  int rank) {
  std::vector<ChunkRange> mine;
  for (int k : rank_chunks(rank, p.pp, p.virtual_stages, schedule_placement(p.schedule)))
    mine.push_back(all[static_cast<size_t>(k)]);
  return mine;
}

std::string format_duration(double seconds) {
  const long s = std::lround(std::max(0.0, seconds));
  char buf[32];
  std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", s / 3600, (s / 60) % 60, s % 60);
  return buf;
}

}  // namespace

Trainer::Trainer(const Config& config, ProcessGrid& grid, Backend& backend, DataMode data)
    : cfg_(config),
      grid_(grid),
      be_(backend),
      leader_(grid.world_rank() == 0),
      trace_(grid.world_rank(), config.run.trace) {
  const ParallelOptions& p = config.parallel;
  agree(grid.world(), [&] { work_ = plan_work(config, grid, backend); });
  partition_ = work_.partition;
  const TensorParallel tp{&grid.comm(Axis::Tensor),
                          p.sequence_parallel ? SequenceParallel::On : SequenceParallel::Off};
  const ContextParallel cp{p.cp > 1 ? &grid.comm(Axis::Context) : nullptr};
  model_ = build_stage(backend, config.model, my_chunks(partition_, p, grid.rank(Axis::Pipeline)),
                       config.train.precision, tp, cp, grid.expert());

  ModelStateOptions so;
  so.zero = p.zero;
  so.bucket_mb = p.bucket_mb;
  so.adamw = {config.train.beta1, config.train.beta2, config.train.eps, config.train.weight_decay};
  so.microbatches = work_.shares[grid.rank(Axis::Data)];
  so.reduce_over_dp = !p.async();  // the parameter servers sum the replicas' gradients
  if (p.offload == Offload::Optimizer) {
    host_backend_ = backend.planning()
                        ? std::make_unique<CpuBackend>(config.run.threads, Execution::Plan)
                        : std::make_unique<CpuBackend>(config.run.threads, backend.make_host_allocator());
    so.offload = host_backend_.get();
  }
  state_ = std::make_unique<ModelState>(
      *model_,
      // The parameters' replicas are dp x cp ranks: a cp rank's gradient covers its part of
      // every sequence, and the loss is scaled by the global batch's tokens, so summing over
      // them gives the gradient of the whole batch.
      // The experts (parallel.ep) are replicated over a part of them, the expert-data group.
      StateGroups{&grid.replicas(), &grid.comm(Axis::Tensor), &grid.comm(Axis::Pipeline),
                  &grid.embedding(), &grid.expert_data(), grid.expert()},
      so);
  if (data == DataMode::Load) {
    state_->initialize(config.run.seed);
    check_stop_during_startup(grid.world(), "initialising the model");
  }

  agree(grid.world(), [&] {
    data_ = std::make_unique<DataFeed>(config, backend, grid.rank(Axis::Data), p.dp, data);
    data_->set_context_rank(grid.rank(Axis::Context));
    data_->set_shares(work_.shares);
    data_->verify(grid.world_rank(), grid.world_size());
  });
  // An interrupted feed means a stop signal here, so every rank throws at this check.
  if (data == DataMode::Load) check_stop_during_startup(grid.world(), "opening the data");

  set_shares(work_.shares);
  // Under ZeRO 2 and 3 a weight gradient launches a reduction over the replicas (and ZeRO-3
  // prefetches parameters over them in other actions): pulled forward by one replica's timing,
  // it would reorder that group's collectives against another replica's.
  // ZB-V places its weight gradients where they fill and has no slack: a pulled one delays the
  // chain of forwards or input gradients behind the awaited transfer by up to a whole action;
  // zb-h1, whose plan leaves slack, loses nothing by pulling (what each cost, measured:
  // docs/benchmarks.md, "Pipeline schedules: zero-bubble").
  const bool early_weights =
      (p.zero < 2 || grid.replicas().size() == 1) && p.schedule != ScheduleKind::ZeroBubbleV;
  executor_ = std::make_unique<PipelineExecutor>(*model_, grid.comm(Axis::Pipeline),
                                                 p.virtual_stages, p.recompute, trace_,
                                                 early_weights, schedule_placement(p.schedule));
  // The loss stays on the device until the step (or evaluation) has queued all its work and is
  // read once then: the executor's own per-micro-batch sum is not used.
  model_->loss().set_readout(LossReadout::PerStep);
  metrics_ = std::make_unique<MetricsWriter>("");
  if (data == DataMode::Load) {
    agree(grid.world(), [&] {
      if (!leader_) return;
      create_run_directory(config.deck_path, config.run.dir);
      metrics_ = std::make_unique<MetricsWriter>(config.run.dir + "/metrics.jsonl");
    });
  }
  if (data == DataMode::Load) checkpointer_ = std::make_unique<Checkpointer>(config, grid);
  if (data == DataMode::Load) sample_ = std::make_unique<PeriodicSample>(config, leader_);
}

Trainer::~Trainer() = default;

void Trainer::set_shares(const std::vector<int>& shares) {
  const ParallelOptions& p = cfg_.parallel;
  work_.shares = shares;
  data_->set_shares(shares);
  const int M = data_->microbatches();
  state_->set_microbatches(M);
  // Measured costs (trainer_replan.cpp) plan the new micro-batch count too.
  const int rank = grid_.rank(Axis::Pipeline);
  const auto shape = pipeline_schedules(p.schedule, p.pp, M, p.virtual_stages);
  eval_actions_ = shape->eval[static_cast<size_t>(rank)];
  if (!costs_) {
    train_actions_ = shape->train[static_cast<size_t>(rank)];
    return;
  }
  const Schedule compute = make_zb_v_for_costs(p.pp, M, *costs_, cfg_.model.tie_embeddings).compute;
  train_actions_ = insert_communication(compute, p.pp, p.virtual_stages, schedule_placement(p.schedule))[rank];
}

double Trainer::world_sum(double local) { return grid_.world().all_reduce_scalar(local); }

std::vector<double> Trainer::world_sums(std::vector<double> local) {
  if (local.empty()) return local;
  // The world communicator is MPI's, on host memory, whatever the device.
  Tensor t = be_.empty_host({static_cast<int64_t>(local.size())}, DType::F64, MemoryCategory::Workspace);
  std::copy(local.begin(), local.end(), t.data<double>());
  grid_.world().all_reduce(t).wait();
  std::copy_n(t.data<double>(), local.size(), local.begin());
  return local;
}

StepAttempt Trainer::compute_gradients(int step, const std::vector<MicroBatchData>& batch, bool first,
                                       StepResult& r) {
  const double tokens = static_cast<double>(cfg_.train.global_batch) * static_cast<double>(cfg_.model.seq_len);
  state_->begin_step();
  executor_->run(train_actions_, batch, Pass::Train, 1.0 / tokens, *state_);
  state_->finish_backward();
  if (first)
    for (const Fault& f : flips_at(Fault::Kind::FlipGrad, grid_.world_rank(), step + 1)) {
      state_->flip_gradient_bit(f.index, f.bit);
      std::fprintf(stderr, "meshtrain: rank %d: injected fault: flipped bit %d of gradient element %lld in "
                   "the first attempt of step %d\n", grid_.world_rank(), f.bit,
                   static_cast<long long>(f.index), step + 1);
      std::fflush(stderr);
    }

  // Two host reads per step, whatever the micro-batches and parameters: the gradient norm's
  // segment sums (one copy) and the loss sums (one copy).
  StepAttempt attempt;
  r.grad_norm = state_->grad_norm();
  attempt.local_loss = model_->loss().take();
  // The head runs on every tensor rank of the last stage: count its loss once.
  // A non-finite gradient norm on any rank turns the world's loss into NaN: every rank then
  // decides alike, in the same step.
  const double poison = std::isfinite(r.grad_norm) ? 0.0 : std::nan("");
  r.loss = world_sum((grid_.rank(Axis::Tensor) == 0 ? attempt.local_loss : 0.0) + poison) / tokens;
  r.layer_statistics = world_sums(model_->take_step_statistics());
  // The largest norm of any rank: the ranks' norms are equal on healthy hardware (reduced, or
  // computed from replicated gradients), and a corrupted replica's must re-run every rank.
  if (std::isfinite(r.grad_norm))
    r.grad_norm = grid_.world().all_reduce_scalar(r.grad_norm, ReduceOp::Max);
  else
    grid_.world().all_reduce_scalar(std::numeric_limits<double>::infinity(), ReduceOp::Max);
  return attempt;
}

StepResult Trainer::train_step(int step) {
  TraceWriter::Scope span(trace_, "step " + std::to_string(step + 1), "step", TraceWriter::Step);
  // Agreed: a shard that fails under the run (truncated since start-up) stops every rank with
  // one message naming it, not the first rank to read there with an abort. One scalar
  // all-reduce per step, beside the step's own; before the injected faults, which emulate a
  // rank failing inside the step's own work.
  std::vector<MicroBatchData> batch;
  agree(grid_.world(), [&] { batch = data_->train_batch(step); });
  inject_faults(grid_.world_rank(), step + 1);
  const auto t0 = std::chrono::steady_clock::now();
  const TrainOptions& t = cfg_.train;
  const double tokens = static_cast<double>(t.global_batch) * static_cast<double>(cfg_.model.seq_len);

  StepResult r;
  r.step = step + 1;
  StepAttempt attempt = compute_gradients(step, batch, true, r);
  // Decided before the optimizer update (nothing of the parameters has changed yet): a step
  // that looks like divergence is run again on the same data (train/step_rerun.h).
  const bool finite = std::isfinite(r.loss) && std::isfinite(r.grad_norm);
  if (!finite || grad_norms_.spike(r.grad_norm, cfg_.run.rerun_spike_factor)) {
    std::ostringstream why;
    if (!finite)
      why << "its loss or gradient norm was not finite (loss " << r.loss << ", gradient norm " << r.grad_norm << ")";
    else
      why << "its gradient norm " << r.grad_norm << " was over " << cfg_.run.rerun_spike_factor
          << " times the median of the last steps' (" << grad_norms_.median() << "; run.rerun_spike_factor)";
    attempt.gradient_hash = state_->gradient_hash();
    StepAttempt again = compute_gradients(step, batch, false, r);
    again.gradient_hash = state_->gradient_hash();
    compare_attempts(cfg_, grid_, r.step, why.str(), attempt, again);
    if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm)) throw diverged(cfg_, r.step, r.loss, r.grad_norm);
    if (leader_) {
      std::printf("step %d: %s; its re-run gave the same bits on every rank: a real spike, not a "
                  "hardware fault; training takes it%s\n",
                  r.step, why.str().c_str(), t.grad_clip > 0 ? " (clipped to train.grad_clip)" : "");
      std::fflush(stdout);
    }
  }
  grad_norms_.add(r.grad_norm);
  const double scale = t.grad_clip > 0 && r.grad_norm > t.grad_clip ? t.grad_clip / (r.grad_norm + 1e-6) : 1.0;
  r.lr = learning_rate(t, step);
  const auto optimizer_start = std::chrono::steady_clock::now();
  state_->optimizer_step(r.lr, scale);
  // Every rank receives the same sums, so what the layers update from them stays equal.
  model_->after_optimizer_step(r.layer_statistics);
  for (const Fault& f : flips_at(Fault::Kind::FlipParam, grid_.world_rank(), r.step))
    if (state_->flip_parameter_bit(f.param, f.index, f.bit)) {
      std::fprintf(stderr, "meshtrain: rank %d: injected fault: flipped bit %d of element %lld of %s after step %d\n",
                   grid_.world_rank(), f.bit, static_cast<long long>(f.index),
                   f.param.empty() ? "its first parameter" : f.param.c_str(), r.step);
      std::fflush(stderr);
    }
  r.compute_seconds = executor_->stats().compute_seconds +
                      std::chrono::duration<double>(std::chrono::steady_clock::now() - optimizer_start).count();

  r.bubble = world_sum(executor_->stats().bubble()) / grid_.world_size();
  r.pipeline_compute_seconds = executor_->stats().compute_seconds;
  r.pipeline_seconds = executor_->stats().total_seconds;
  r.pipeline_longest_action_seconds = executor_->stats().longest_action_seconds;
  // Re-planned once, after the second step (the first is slowed by allocations).
  if (steps_timed_ < 2 && replans_for_costs() && ++steps_timed_ == 2) replan_for_measured_costs();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Rank 0's clock is the job's: every step ends in collectives that all ranks take part in.
  r.seconds = grid_.world().all_reduce_scalar(r.seconds, ReduceOp::Max);
  r.tokens_per_second = tokens / r.seconds;
  step_ = step + 1;
  return r;
}

double Trainer::evaluate() {
  TraceWriter::Scope span(trace_, "eval", "step", TraceWriter::Step);
  if (!data_->has_val()) return std::nan("");
  for (int e = 0; e < cfg_.train.eval_batches; ++e) {
    std::vector<MicroBatchData> batch;
    agree(grid_.world(), [&] { batch = data_->val_batch(e); });  // as train_step's
    executor_->run(eval_actions_, batch, Pass::Eval, 0.0, *state_);
  }
  const double local = model_->loss().take();  // one host read for the whole evaluation
  state_->release_gathered();
  const double tokens = static_cast<double>(cfg_.train.eval_batches) * cfg_.train.global_batch *
                        static_cast<double>(cfg_.model.seq_len);
  return world_sum(grid_.rank(Axis::Tensor) == 0 ? local : 0.0) / tokens;
}

std::vector<MemoryPeaks> Trainer::memory_peaks() {
  const MemoryTracker& m = be_.memory();
  MemoryPeaks mine;
  mine.world_rank = grid_.world_rank();
  mine.dp = grid_.rank(Axis::Data);
  mine.tp = grid_.rank(Axis::Tensor);
  mine.pp = grid_.rank(Axis::Pipeline);
  mine.cp = grid_.rank(Axis::Context);
  for (size_t c = 0; c < kMemoryCategories; ++c) mine.peak[c] = m.peak(static_cast<MemoryCategory>(c));
  mine.peak_total = m.peak_total();
  const std::string bytes(reinterpret_cast<const char*>(&mine), sizeof mine);
  std::vector<MemoryPeaks> all;
  for (const std::string& b : grid_.world().all_gather_bytes(bytes)) {
    MemoryPeaks p;
    std::memcpy(&p, b.data(), sizeof p);
    all.push_back(p);
  }
  return all;
}

void Trainer::log_memory(const char* when, int step) {
  const std::vector<MemoryPeaks> all = memory_peaks();
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
    metrics_->write({{"step", int64_t{step}},
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

void Trainer::log_start() {
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
              std::string(schedule_name(p.schedule)).c_str(), data_->microbatches(),
              cfg_.train.micro_batch, p.virtual_stages, p.zero,
              p.recompute == Recompute::None ? "none" : p.recompute == Recompute::Selective ? "selective" : "full",
              p.sequence_parallel ? "on" : "off");
  if (!work_.rank_speeds.empty() || p.rebalance) {
    std::string speeds;
    for (size_t r = 0; r < work_.rank_speeds.size(); ++r) {
      char buf[16];
      std::snprintf(buf, sizeof buf, "%s%.2f", r ? " " : "", work_.rank_speeds[r]);
      speeds += buf;
    }
    std::printf("work balance %s%s: data-parallel shares %s micro-batches%s%s\n", work_.source.c_str(),
                p.rebalance ? " (rebalanced from measured compute)" : "",
                describe_shares(work_.shares).c_str(), speeds.empty() ? "" : "; rank speeds ",
                speeds.c_str());
  }
  if (p.async())
    std::printf("data parallelism asynchronous: %d parameter server(s) (ranks %d-%d) hold the optimizer; "
                "a gradient's parameters at most %d version(s) old\n",
                p.servers, grid_.world_size(), grid_.world_size() + p.servers - 1, p.staleness);
  std::printf("partition %s; backend %s\n", describe_partition(partition_).c_str(),
              be_.describe().c_str());
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
  std::printf("data: train %s; val %s\n", data_->train().describe().c_str(),
              data_->has_val() ? data_->val()->describe().c_str() : "none");
  std::fflush(stdout);
}

void Trainer::log_step(const StepResult& r, double eta_seconds) {
  if (!leader_) return;
  const ParallelOptions& p = cfg_.parallel;
  std::string bubble;
  if (p.pp > 1) {
    char buf[64];
    std::snprintf(buf, sizeof buf, " | bubble %.2f (theory %.2f)", r.bubble,
                  theoretical_bubble(p.schedule, p.pp, data_->microbatches(), p.virtual_stages));
    bubble = buf;
  }
  bubble += model_->progress_text(r.layer_statistics);
  std::printf("step %5d/%d | loss %.4f | lr %.2e | grad_norm %.3f | %8.0f tok/s | %7.1f ms%s | eta %s\n",
              r.step, cfg_.train.steps, r.loss, r.lr, r.grad_norm, r.tokens_per_second,
              r.seconds * 1e3, bubble.c_str(), format_duration(eta_seconds).c_str());
  std::fflush(stdout);
  metrics_->write({{"step", int64_t{r.step}},
                   {"loss", r.loss},
                   {"lr", r.lr},
                   {"grad_norm", r.grad_norm},
                   {"tokens_per_s", r.tokens_per_second},
                   {"step_ms", r.seconds * 1e3},
                   {"bubble", r.bubble}});
  // What the layers report of the step (a mixture of experts' loads): lines of their own.
  for (const MetricsRecord& record : model_->metrics_records(r.step, r.layer_statistics)) metrics_->write(record);
}

const StragglerWindow* Trainer::straggler_window() const {
  return stragglers_ && stragglers_->last_window().steps > 0 ? &stragglers_->last_window() : nullptr;
}

void Trainer::log_stragglers(const StragglerWindow& w) {
  if (!leader_) return;
  for (int rank : w.stragglers)
    std::printf("%s\n", describe_straggler(w, rank, stragglers_->places()[static_cast<size_t>(rank)]).c_str());
  std::fflush(stdout);
  metrics_->write({{"step", int64_t{w.step}},
                   {"rank_compute_ms", w.compute_ms},
                   {"rank_wait_ms", w.wait_ms},
                   {"stragglers", std::vector<int64_t>(w.stragglers.begin(), w.stragglers.end())}});
}

void Trainer::rebalance(const StragglerWindow& w) {
  std::vector<double> compute(w.compute_ms.size());
  for (size_t r = 0; r < compute.size(); ++r) compute[r] = w.compute_ms[r] / 1e3;
  const std::vector<int> before = work_.shares;
  // Paces averaged over windows (exponentially, half weight to the newest): one window of a
  // shared, noisy machine must not move the shares back and forth.
  const std::vector<double> pace = replica_pace(before, compute, grid_.shape());
  if (pace_.empty()) pace_ = pace;
  for (size_t d = 0; d < pace_.size(); ++d) pace_[d] = 0.5 * pace_[d] + 0.5 * pace[d];
  const std::vector<int> next = rebalanced_shares(before, pace_, work_.granule);
  if (next == before) return;
  set_shares(next);
  if (!leader_) return;
  std::printf("rebalance at step %d: data-parallel shares %s -> %s micro-batches (from the measured "
              "compute of the last %d step(s))\n",
              w.step, describe_shares(before).c_str(), describe_shares(next).c_str(), w.steps);
  std::fflush(stdout);
  metrics_->write({{"step", int64_t{w.step}}, {"shares", std::vector<int64_t>(next.begin(), next.end())}});
}

namespace {

void print_saved(const CheckpointStats& s) {
  char waited[64] = "";
  if (s.asynchronous) std::snprintf(waited, sizeof waited, "; training waited %.3f s in all", s.stall_seconds);
  std::printf("checkpoint %s (%.1f MB, %.2f s: write %.2f (%s), flush + verify %.2f; %.1f MB/s)%s%s\n",
              s.path.c_str(), s.bytes / 1e6, s.seconds, s.data_seconds,
              s.independent ? "independent" : "collective", s.verify_seconds,
              s.bytes / 1e6 / std::max(s.seconds, 1e-9),
              s.asynchronous ? " written in the background" : "", waited);
  std::fflush(stdout);
}

}  // namespace

void Trainer::save_checkpoint(bool in_background) {
  if (!in_background) {
    if (const std::optional<CheckpointStats> previous = checkpointer_->wait_for_save(); previous && leader_)
      print_saved(*previous);
    const CheckpointStats s = checkpointer_->save(*state_, step_);
    if (leader_) print_saved(s);
    return;
  }
  const CheckpointStats s = checkpointer_->start_save(*state_, step_, be_.memory());
  if (leader_) {
    std::printf("checkpoint %s: snapshot of %.1f MB started, training waited %.3f s; copying and writing in the "
                "background\n",
                s.path.c_str(), s.bytes / 1e6, s.stall_seconds);
    std::fflush(stdout);
  }
}

void Trainer::report_background_save(bool wait) {
  if (!checkpointer_ || !checkpointer_->save_in_progress()) return;
  const std::optional<CheckpointStats> s = wait ? checkpointer_->wait_for_save() : checkpointer_->poll();
  if (s && leader_) print_saved(*s);
}

void Trainer::check_replicas_at(int step) {
  if (replicas_agreed_ == step) return;
  check_replicas(cfg_, grid_, *state_, step, replicas_agreed_);
  replicas_agreed_ = step;
}

RunEnd Trainer::run() {
  log_start();
  const TrainOptions& t = cfg_.train;
  if (const std::string path = checkpointer_->begin_run(); !path.empty()) {
    step_ = static_cast<int>(checkpointer_->load(*state_, path).step);
    if (leader_) {
      std::printf("resumed from %s at step %d\n", path.c_str(), step_);
      std::fflush(stdout);
    }
    check_stop_during_startup(grid_.world(), "loading the checkpoint");
    // Every rank loaded the same step: the same verdict everywhere.
    if (step_ > t.steps)
      throw AgreedError(path + ": the checkpoint is at step " + std::to_string(step_) + ", past train.steps = " +
                        std::to_string(t.steps) + ": nothing to train (raise train.steps above " +
                        std::to_string(step_) + " to train further, or resume an earlier checkpoint "
                        "with checkpoint.resume = \"<path>\")");
    if (step_ == t.steps) {  // a finished run started again (e.g. a requeued job): not an error
      if (leader_) {
        std::printf("nothing to train: %s is at step %d and train.steps = %d (raise train.steps to "
                    "train further)\n", path.c_str(), step_, t.steps);
        std::fflush(stdout);
      }
      return RunEnd::Finished;
    }
  }
  if (started_) started_();
  if (cfg_.parallel.async()) return run_async();
  std::vector<double> times;
  // Rebalancing reads the report's windows even when the report itself is off.
  const bool report = cfg_.run.straggler_threshold > 0;
  if (report || (cfg_.parallel.rebalance && cfg_.parallel.dp > 1))  // collective: nodes, coordinates
    stragglers_ = std::make_unique<StragglerMonitor>(grid_, report ? cfg_.run.straggler_threshold : 1.25);
  reset_memory_peaks();  // peaks of the training steps, not of set-up
  replicas_agreed_ = step_;  // initialised or loaded alike on every copy
  const int check_every = cfg_.run.replica_check_every;
  while (step_ < t.steps) {
    const StepResult r = train_step(step_);
    if (check_every > 0 && r.step % check_every == 0) check_replicas_at(r.step);
    times.push_back(r.seconds);
    if (stragglers_) stragglers_->add_step(r.compute_seconds, r.seconds);
    if (times.size() == 1) log_memory("after the first step", r.step);
    if (const std::string note = take_schedule_note(); leader_ && !note.empty()) {
      std::printf("%s\n", note.c_str());
      std::fflush(stdout);
    }
    const bool last = r.step == t.steps;
    if (r.step % cfg_.run.log_every == 0 || r.step == 1 || last) {
      std::vector<double> sorted = times;
      std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
      log_step(r, sorted[sorted.size() / 2] * (t.steps - r.step));
      // Every rank logs at this step: one all-gather closes the window everywhere.
      if (stragglers_) {
        const StragglerWindow& w = stragglers_->close_window(grid_.world(), r.step);
        if (report) log_stragglers(w);
        // The first step's window holds one-time costs (allocation, first-touch): not a speed.
        if (cfg_.parallel.rebalance && r.step > 1 && !last) rebalance(w);
      }
    }
    if (data_->has_val() && ((t.eval_every > 0 && r.step % t.eval_every == 0) || last)) {
      const double val = evaluate();
      if (leader_) {
        std::printf("step %5d/%d | val_loss %.4f\n", r.step, t.steps, val);
        std::fflush(stdout);
      }
      metrics_->write({{"step", int64_t{r.step}}, {"val_loss", val}});
    }
    if (sample_) sample_->after_step(r.step, *model_, grid_.comm(Axis::Pipeline));
    const int every = cfg_.checkpoint.every;
    const bool scheduled = every > 0 && (r.step % every == 0 || last);
    // A stop request may reach the ranks in different steps: agree on it after every step.
    const int request = static_cast<int>(grid_.world().all_reduce_scalar(stop_request(), ReduceOp::Max));
    report_background_save(false);
    // No checkpoint stores copies that disagree: checked before each save (with the check on).
    if (check_every > 0 && (scheduled || (request != 0 && !last))) check_replicas_at(r.step);
    // A stop and the end of the run save in the foreground: the job ends right after.
    if (scheduled || (request != 0 && !last)) save_checkpoint(cfg_.checkpoint.async && request == 0 && !last);
    if (request != 0) consume_stop_file();  // served, by this stop or by the end of training
    if (request != 0 && !last) {
      if (leader_) {
        std::printf("stopping at step %d on %s: checkpoint written; run again (requeue) to resume\n",
                    r.step, stop_reason(request).c_str());
        std::fflush(stdout);
      }
      log_memory("over the run", step_);
      return RunEnd::Stopped;
    }
  }
  report_background_save(true);  // train.steps not a multiple of checkpoint.every: none is left
  if (!times.empty()) log_memory("over the run", step_);
  if (cfg_.run.trace) {
    const std::string path = cfg_.run.dir + "/trace_rank" + std::to_string(grid_.world_rank()) + ".json";
    agree(grid_.world(), [&] { trace_.write(path); });
    if (leader_) std::printf("trace written: %s/trace_rank<N>.json\n", cfg_.run.dir.c_str());
  }
  return RunEnd::Finished;
}

}  // namespace meshtrain
