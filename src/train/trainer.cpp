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
#include "meshtrain/comm/agreement.h"
#include "meshtrain/config/fault_injection.h"
#include "meshtrain/io/data_error.h"
#include "meshtrain/model/qk_clip.h"
#include "meshtrain/model/stage_builder.h"
#include "meshtrain/config/deck_error.h"
#include "meshtrain/train/checkpoint_cadence.h"
#include "meshtrain/train/choice_scoring.h"
#include "meshtrain/train/divergence.h"
#include "meshtrain/train/lr_schedule.h"
#include "meshtrain/train/parameter_client.h"
#include "meshtrain/train/replica_check.h"
#include "meshtrain/train/step_rerun.h"
#include "meshtrain/train/step_schedule.h"
#include "meshtrain/train/stop_request.h"
#include "meshtrain/train/straggler_report.h"
#include "meshtrain/train/text_sample.h"
#include "meshtrain/train/training_log.h"

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

// train.eval_tasks read and tokenized (collective), or null without tasks.
std::unique_ptr<ChoiceEvaluation> open_eval_tasks(const Config& config, ProcessGrid& grid) {
  if (config.train.eval_tasks.empty()) return nullptr;
  // Refused up front, not skipped: a run asked for its scores.
  if (const std::string why = generation_unsupported(config); !why.empty())
    throw DeckError(config.deck_path + ": train.eval_tasks scores with the generator: " + why);
  if (config.parallel.async())
    throw DeckError(config.deck_path + ": train.eval_tasks: not under parallel.data_sync = "
                    "\"async\" (its replicas differ by design; score a checkpoint with `meshtrain "
                    "eval --task` instead)");
  std::unique_ptr<Tokenizer> tokenizer;
  agree(grid.world(), [&] { tokenizer = open_tokenizer(config.data.tokenizer); });
  return std::make_unique<ChoiceEvaluation>(config.train.eval_tasks, *tokenizer, config.model,
                                            grid.world());
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
  if (config.train.qk_clip_threshold > 0) model_->record_attention_logits();
  schedule_ = std::make_unique<StepSchedule>(config, grid, backend);
  build_state(data);
  open_data(data);
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
  log_ = std::make_unique<TrainingLog>(config, grid);
  if (data == DataMode::Load) {
    log_->open();
    checkpoints_ = std::make_unique<CheckpointCadence>(config, grid, *log_, backend.memory());
    sample_ = std::make_unique<PeriodicSample>(config, leader_);
    tasks_ = open_eval_tasks(config, grid);
  }
}

void Trainer::evaluate_tasks(int step) {
  if (!tasks_) return;
  TraceWriter::Scope span(trace_, "eval tasks", "step", TraceWriter::Step);
  log_->task_scores(step, tasks_->run(*model_, grid_, cfg_.parallel));
}

Trainer::~Trainer() = default;

void Trainer::build_state(DataMode data) {
  const Config& config = cfg_;
  const ParallelOptions& p = config.parallel;
  ProcessGrid& grid = grid_;
  ModelStateOptions so;
  so.zero = p.zero;
  so.bucket_mb = p.bucket_mb;
  so.adamw = {config.train.beta1, config.train.beta2, config.train.eps, config.train.weight_decay};
  so.optimizer = config.train.optimizer;
  so.muon = config.train.muon;
  so.muon.weight_decay = config.train.weight_decay;
  so.microbatches = work_.shares[grid.rank(Axis::Data)];
  so.reduce_over_dp = !p.async();  // the parameter servers sum the replicas' gradients
  if (p.offload == Offload::Optimizer) {
    host_backend_ = be_.planning()
                        ? std::make_unique<CpuBackend>(config.run.threads, Execution::Plan)
                        : std::make_unique<CpuBackend>(config.run.threads, be_.make_host_allocator());
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
}

void Trainer::open_data(DataMode data) {
  const Config& config = cfg_;
  ProcessGrid& grid = grid_;
  agree(grid.world(), [&] {
    data_ = std::make_unique<DataFeed>(config, be_, grid.rank(Axis::Data), config.parallel.dp, data);
    data_->set_context_rank(grid.rank(Axis::Context));
    data_->set_shares(work_.shares);
    data_->verify(grid.world_rank(), grid.world_size());
  });
  // An interrupted feed means a stop signal here, so every rank throws at this check.
  if (data == DataMode::Load) check_stop_during_startup(grid.world(), "opening the data");
}

void Trainer::set_shares(const std::vector<int>& shares) {
  work_.shares = shares;
  data_->set_shares(shares);
  state_->set_microbatches(data_->microbatches());
  schedule_->plan(data_->microbatches());
}

std::string Trainer::take_schedule_note() { return schedule_->take_note(); }

double Trainer::world_sum(double local) { return grid_.world().all_reduce_scalar(local); }

std::vector<double> Trainer::world_sums(std::vector<double> local, ReduceOp op) {
  if (local.empty()) return local;
  // The world communicator is MPI's, on host memory, whatever the device.
  Tensor t = be_.empty_host({static_cast<int64_t>(local.size())}, DType::F64, MemoryCategory::Workspace);
  std::copy(local.begin(), local.end(), t.data<double>());
  grid_.world().all_reduce(t, op).wait();
  std::copy_n(t.data<double>(), local.size(), local.begin());
  return local;
}

StepAttempt Trainer::compute_gradients(int step, const std::vector<MicroBatchData>& batch, bool first,
                                       StepResult& r) {
  const double tokens = static_cast<double>(cfg_.train.global_batch) * static_cast<double>(cfg_.model.seq_len);
  state_->begin_step();
  executor_->run(schedule_->train(), batch, Pass::Train, 1.0 / tokens, *state_);
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
  r.attention_logit_maxima = world_sums(model_->take_step_maxima(), ReduceOp::Max);
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
  rerun_if_suspect(step, batch, attempt, r);
  grad_norms_.add(r.grad_norm);
  const double scale = t.grad_clip > 0 && r.grad_norm > t.grad_clip ? t.grad_clip / (r.grad_norm + 1e-6) : 1.0;
  r.lr = learning_rate(t, step);
  const auto optimizer_start = std::chrono::steady_clock::now();
  state_->optimizer_step(r.lr, scale);
  // Every rank receives the same sums, so what the layers update from them stays equal.
  model_->after_optimizer_step(r.layer_statistics);
  if (t.qk_clip_threshold > 0) clip_attention_logits(r);
  inject_parameter_flips(r.step);
  r.compute_seconds = executor_->stats().compute_seconds +
                      std::chrono::duration<double>(std::chrono::steady_clock::now() - optimizer_start).count();

  r.bubble = world_sum(executor_->stats().bubble()) / grid_.world_size();
  r.pipeline_compute_seconds = executor_->stats().compute_seconds;
  r.pipeline_seconds = executor_->stats().total_seconds;
  r.pipeline_longest_action_seconds = executor_->stats().longest_action_seconds;
  schedule_->after_step(executor_->stats(), data_->microbatches());
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Rank 0's clock is the job's: every step ends in collectives that all ranks take part in.
  r.seconds = grid_.world().all_reduce_scalar(r.seconds, ReduceOp::Max);
  r.tokens_per_second = tokens / r.seconds;
  step_ = step + 1;
  return r;
}

void Trainer::clip_attention_logits(StepResult& r) {
  const double tau = cfg_.train.qk_clip_threshold;
  const QkClipSummary summary = qk_clip_summary(r.attention_logit_maxima, tau);
  r.clipped_heads = summary.clipped_heads;
  r.max_attention_logit = summary.max_logit;
  // Every rank has the same maxima, so every rank decides alike whether to scale (and gather).
  if (summary.clipped_heads > 0)
    state_->scale_rows(model_->qk_clip_scales(r.attention_logit_maxima, tau));
}

void Trainer::rerun_if_suspect(int step, const std::vector<MicroBatchData>& batch, StepAttempt& attempt,
                               StepResult& r) {
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
                  r.step, why.str().c_str(), cfg_.train.grad_clip > 0 ? " (clipped to train.grad_clip)" : "");
      std::fflush(stdout);
    }
  }
}

void Trainer::inject_parameter_flips(int step) {
  for (const Fault& f : flips_at(Fault::Kind::FlipParam, grid_.world_rank(), step))
    if (state_->flip_parameter_bit(f.param, f.index, f.bit)) {
      std::fprintf(stderr, "meshtrain: rank %d: injected fault: flipped bit %d of element %lld of %s after step %d\n",
                   grid_.world_rank(), f.bit, static_cast<long long>(f.index),
                   f.param.empty() ? "its first parameter" : f.param.c_str(), step);
      std::fflush(stderr);
    }
}

double Trainer::evaluate() {
  TraceWriter::Scope span(trace_, "eval", "step", TraceWriter::Step);
  if (!data_->has_val()) return std::nan("");
  for (int e = 0; e < cfg_.train.eval_batches; ++e) {
    std::vector<MicroBatchData> batch;
    agree(grid_.world(), [&] { batch = data_->val_batch(e); });  // as train_step's
    executor_->run(schedule_->eval(), batch, Pass::Eval, 0.0, *state_);
  }
  const double local = model_->loss().take();  // one host read for the whole evaluation
  model_->take_step_maxima();  // QK-clip clips by the training steps' logits only
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




void Trainer::log_memory(const char* when, int step) { log_->memory(when, step, memory_peaks()); }

const StragglerWindow* Trainer::straggler_window() const {
  return stragglers_ && stragglers_->last_window().steps > 0 ? &stragglers_->last_window() : nullptr;
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
  log_->rebalanced(w, before, next);
}



void Trainer::check_replicas_at(int step) {
  if (replicas_agreed_ == step) return;
  check_replicas(cfg_, grid_, *state_, step, replicas_agreed_);
  replicas_agreed_ = step;
}


}  // namespace meshtrain
