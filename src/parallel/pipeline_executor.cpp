#include "meshtrain/parallel/pipeline_executor.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "meshtrain/parallel/slowdown.h"

namespace meshtrain {

struct PipelineExecutor::Slot {
  std::unique_ptr<ChunkActivations> saved;  // made by the stage at the chunk's forward
  Tensor input;    // received (or local) input of this chunk
  Tensor output;   // forward output, until sent or consumed
  Tensor doutput;  // received gradient of the output
  Tensor dinput;   // gradient of the input, until sent or consumed
  DeferredWeightGradients weights;  // a BackwardInput's weight gradients, for its BackwardWeight
  bool input_gradient_done = false;
  Work recv_forward, recv_backward;
};

PipelineExecutor::PipelineExecutor(PipelineStage& stage, Communicator& pipeline,
                                   int virtual_stages, Recompute recompute, TraceWriter& trace,
                                   bool early_weights, ChunkPlacement placement)
    : stage_(&stage),
      pp_(&pipeline),
      stages_(pipeline.size()),
      virtual_stages_(virtual_stages),
      recompute_(recompute),
      trace_(&trace),
      early_weights_(early_weights),
      placement_(placement) {}

int PipelineExecutor::tag(int dest_chunk, int microbatch, int direction) const {
  return (dest_chunk * microbatches_ + microbatch) * 2 + direction;
}

namespace {

// Whether `transfer` completes within `seconds`, polling.
bool arrives_within(Work& transfer, double seconds) {
  using clock = std::chrono::steady_clock;
  const auto deadline = clock::now() + std::chrono::duration<double>(seconds);
  do {
    if (transfer.test()) return true;
    std::this_thread::yield();
  } while (clock::now() < deadline);
  return false;
}

}  // namespace

// One run(): the slots of its (chunk, micro-batch) pairs, the transfer step being gathered, the
// sends in flight, and which weight gradients may be pulled ahead of their place in the list.
class PipelineExecutor::StepRun {
 public:
  StepRun(PipelineExecutor& ex, const std::vector<Action>& actions,
          const std::vector<MicroBatchData>& microbatches, Pass pass, double dloss, UnitHooks& hooks)
      : ex_(ex), actions_(actions), microbatches_(microbatches), pass_(pass), dloss_(dloss),
        hooks_(hooks), me_(ex.pp_->rank()), last_chunk_(ex.stages_ * ex.virtual_stages_ - 1) {
    plan_weight_pulls();
  }

  void perform(size_t index);
  // Issues the last transfer step and waits for every send.
  void finish() {
    issue_step();
    for (auto& [work, tensor] : sends_) work.wait();
  }
  double loss() const { return loss_; }

 private:
  void plan_weight_pulls();
  int chunk(int k) const;
  Tensor hidden(int m, MemoryCategory c) const;
  void gather(Transfer::Kind kind, const Tensor& t, int peer, int tag, Work* work);
  void issue_step();
  void post(const Action& a, Slot& s);
  Tensor take_from(int from, int m, Tensor Slot::*field, Work& transfer, const Tensor& received,
                   const char* wait, size_t index);
  void forward(size_t index, Slot& s);
  void backward(size_t index, Slot& s);
  double account(int k, std::optional<PipelineStats::ActionKind> kind, PaddedCompute& timer);
  void run_weights(const Action& a);
  void wait_filling(Work& transfer, const std::string& what, size_t index);
  void retire_sends();

  PipelineExecutor& ex_;
  const std::vector<Action>& actions_;
  const std::vector<MicroBatchData>& microbatches_;
  const Pass pass_;
  const double dloss_;
  UnitHooks& hooks_;
  const int me_, last_chunk_;
  std::map<std::pair<int, int>, Slot> slots_;  // (chunk, micro-batch)
  std::vector<std::pair<Work, Tensor>> sends_;
  double loss_ = 0;
  // The transfers of the step being gathered, and where each one's Work goes (null: a send's).
  std::vector<Transfer> step_;
  std::vector<Work*> step_works_;
  std::vector<size_t> weight_actions_;  // the BackwardWeight actions' indices, in list order
  std::vector<size_t> next_writer_;
  size_t weights_run_ = 0;
};

// Weight gradients (BackwardWeight) run in list order, but may run before their place in the
// list (with early_weights): a rank about to wait for a transfer runs the next one instead, if
// its input gradient is done. That fills waits the schedule's clock did not foresee (slow links, an input
// gradient dearer than a weight gradient); a weight gradient sends and receives nothing, and
// pulled earlier frees memory sooner. But it cannot be cut short: a transfer that lands during
// it waits for it (hence the grace in wait_filling, and no pulls under ZB-V). Its order, and so every
// gradient sum, stays the list's: it is never pulled past another action that adds to weight
// gradients, a full Backward or the head's forward in training (the head's backward runs
// inside it). Under the V placement the head and the embedding share a rank, and with tied
// embeddings both add to wte's gradient: pulled past the head, the embedding's weight gradient
// would change that sum's order with the timing of the transfers. (The trainer asks for no
// pulls under ZB-V, the one V schedule, whose plan has no slack for them: trainer.cpp.)
void PipelineExecutor::StepRun::plan_weight_pulls() {
  for (size_t i = 0; i < actions_.size(); ++i)
    if (actions_[i].op == Op::BackwardWeight) weight_actions_.push_back(i);
  // next_writer_[i]: the first action at or after i that adds to weight gradients outside a
  // BackwardWeight (actions.size() if none).
  next_writer_.assign(actions_.size() + 1, actions_.size());
  for (size_t i = actions_.size(); i-- > 0;) {
    const Action& a = actions_[i];
    const bool writes = a.op == Op::Backward ||
                        (a.op == Op::Forward && pass_ == Pass::Train && a.chunk == last_chunk_);
    next_writer_[i] = writes ? i : next_writer_[i + 1];
  }
}

// The stage's own index of global chunk k.
int PipelineExecutor::StepRun::chunk(int k) const {
  if (ex_.owner(k) != me_)
    throw std::logic_error("pipeline: action on chunk " + std::to_string(k) + " not owned by this rank");
  return local_chunk(k, ex_.stages_, ex_.placement_);
}

Tensor PipelineExecutor::StepRun::hidden(int m, MemoryCategory c) const {
  PipelineStage& stage = *ex_.stage_;
  return stage.backend().empty(stage.boundary_shape(microbatches_[m].shape), stage.dtype(), c);
}

void PipelineExecutor::StepRun::gather(Transfer::Kind kind, const Tensor& t, int peer, int tag, Work* work) {
  step_.push_back({kind, t, peer, tag});
  step_works_.push_back(work);
}

void PipelineExecutor::StepRun::issue_step() {
  if (step_.empty()) return;
  std::vector<Work> works = ex_.pp_->exchange(step_);
  for (size_t i = 0; i < works.size(); ++i) {
    if (step_works_[i]) *step_works_[i] = std::move(works[i]);
    else sends_.emplace_back(std::move(works[i]), step_[i].tensor);
  }
  step_.clear();
  step_works_.clear();
}

void PipelineExecutor::StepRun::perform(size_t index) {
  const Action& a = actions_[index];
  if (!is_communication(a.op)) issue_step();  // a compute or an EndStep ends the step
  if (a.op == Op::EndStep) return;
  Slot& s = slots_[{a.chunk, a.microbatch}];
  switch (a.op) {
    case Op::RecvForward:
    case Op::RecvBackward:
    case Op::SendForward:
    case Op::SendBackward: post(a, s); break;
    case Op::EndStep: break;
    case Op::Forward: forward(index, s); break;
    case Op::BackwardWeight:
      if (weights_run_ < weight_actions_.size() && weight_actions_[weights_run_] == index)
        run_weights(a);  // else it ran while a transfer was awaited
      break;
    case Op::Backward:
    case Op::BackwardInput: backward(index, s); break;
  }
  retire_sends();
}

// A transfer joins the step being gathered.
void PipelineExecutor::StepRun::post(const Action& a, Slot& s) {
  const int k = a.chunk, m = a.microbatch;
  switch (a.op) {
    case Op::RecvForward:
      s.input = hidden(m, MemoryCategory::Activations);
      gather(Transfer::Kind::Recv, s.input, ex_.owner(k - 1), ex_.tag(k, m, 0), &s.recv_forward);
      break;
    case Op::RecvBackward:
      s.doutput = hidden(m, MemoryCategory::Workspace);
      gather(Transfer::Kind::Recv, s.doutput, ex_.owner(k + 1), ex_.tag(k, m, 1), &s.recv_backward);
      break;
    case Op::SendForward:
      gather(Transfer::Kind::Send, s.output, ex_.owner(k + 1), ex_.tag(k + 1, m, 0), nullptr);
      s.output = Tensor{};
      break;
    case Op::SendBackward:
      gather(Transfer::Kind::Send, s.dinput, ex_.owner(k - 1), ex_.tag(k - 1, m, 1), nullptr);
      s.dinput = Tensor{};
      break;
    default: throw std::logic_error("pipeline: " + a.to_string() + " is not a transfer");
  }
}

// What a pass of micro-batch m takes from the neighbouring chunk `from` (the previous chunk's
// output forward, the next one's input gradient backward): handed over in its slot's `field`
// when this rank owns that chunk, else the transfer's `received` buffer once it has arrived.
Tensor PipelineExecutor::StepRun::take_from(int from, int m, Tensor Slot::*field, Work& transfer,
                                            const Tensor& received, const char* wait, size_t index) {
  if (ex_.owner(from) == me_) {
    Slot& neighbour = slots_[{from, m}];
    Tensor t = neighbour.*field;
    neighbour.*field = Tensor{};
    return t;
  }
  wait_filling(transfer, wait + std::to_string(m), index);
  return received;
}

void PipelineExecutor::StepRun::forward(size_t index, Slot& s) {
  const Action& a = actions_[index];
  const int k = a.chunk, m = a.microbatch;
  Tensor input;
  if (k > 0) input = take_from(k - 1, m, &Slot::output, s.recv_forward, s.input, "wait F", index);
  s.input = Tensor{};
  PaddedCompute timer;
  {
    TraceWriter::Scope span(*ex_.trace_, a.to_string(), "compute", TraceWriter::Compute);
    const int local = chunk(k);
    if (!s.saved) s.saved = ex_.stage_->new_activations(local);
    Tensor out = ex_.stage_->forward(local, microbatches_[m], input, *s.saved, pass_, ex_.recompute_,
                                     dloss_, &loss_, hooks_);
    if (k < last_chunk_) s.output = out;
  }
  account(k, PipelineStats::kForward, timer);
}

void PipelineExecutor::StepRun::backward(size_t index, Slot& s) {
  const Action& a = actions_[index];
  const int k = a.chunk, m = a.microbatch;
  Tensor dout;
  if (k < last_chunk_) dout = take_from(k + 1, m, &Slot::dinput, s.recv_backward, s.doutput, "wait B", index);
  s.doutput = Tensor{};
  PaddedCompute timer;
  {
    TraceWriter::Scope span(*ex_.trace_, a.to_string(), "compute", TraceWriter::Compute);
    const int local = chunk(k);
    if (!s.saved)
      throw std::logic_error("pipeline: " + a.to_string() + " before the forward of its micro-batch");
    Tensor din = ex_.stage_->backward(local, microbatches_[m], dout, *s.saved, ex_.recompute_, hooks_,
                                      a.op == Op::BackwardInput ? &s.weights : nullptr);
    if (k > 0) s.dinput = din;
    s.input_gradient_done = true;
  }
  account(k, a.op == Op::BackwardInput ? std::optional(PipelineStats::kInput) : std::nullopt, timer);
}

// A whole backward (no split into input and weight gradients) has no kind of its own.
double PipelineExecutor::StepRun::account(int k, std::optional<PipelineStats::ActionKind> kind,
                                          PaddedCompute& timer) {
  PipelineStats& stats = ex_.stats_;
  const double seconds = timer.finish();
  stats.compute_seconds += seconds;
  stats.longest_action_seconds = std::max(stats.longest_action_seconds, seconds);
  if (kind) stats.chunk_seconds[k][*kind].push_back(seconds);
  return seconds;
}

void PipelineExecutor::StepRun::run_weights(const Action& a) {
  PaddedCompute timer;
  {
    TraceWriter::Scope span(*ex_.trace_, a.to_string(), "compute", TraceWriter::Compute);
    ex_.stage_->backward_weights(chunk(a.chunk), slots_[{a.chunk, a.microbatch}].weights, hooks_);
  }
  ex_.last_weight_seconds_ = account(a.chunk, PipelineStats::kWeight, timer);
  ++weights_run_;
}

void PipelineExecutor::StepRun::wait_filling(Work& transfer, const std::string& what, size_t index) {
  while (ex_.early_weights_ && weights_run_ < weight_actions_.size() && !transfer.test()) {
    const size_t at = weight_actions_[weights_run_];
    const Action& w = actions_[at];
    if (!slots_[{w.chunk, w.microbatch}].input_gradient_done || next_writer_[index] < at) break;
    // A weight gradient pulled in cannot be cut short: where the transfer was only a little
    // late, the action waiting for it, on the schedule's critical path when that path has no
    // slack (zero-bubble schedules), starts a whole weight gradient late instead of a little,
    // and every rank after it with it. So the transfer gets a grace of a quarter of a weight
    // gradient's time first: the pulls then fill waits the schedule did not foresee, not the
    // transfer's own latency. (Without the grace a rank idled about twice what the plan
    // idles: docs/benchmarks.md, "Pipeline schedules: zero-bubble".)
    bool arrived = false;
    {  // traced as a wait, so that a trace shows what the rank did in that time
      TraceWriter::Scope grace(*ex_.trace_, what + " (grace)", "p2p", TraceWriter::PipelineComm);
      arrived = arrives_within(transfer, kPullGrace * ex_.last_weight_seconds_);
    }
    if (arrived) break;
    run_weights(w);
  }
  TraceWriter::Scope wait(*ex_.trace_, what, "p2p", TraceWriter::PipelineComm);
  transfer.wait();
}

// Retires completed sends, freeing their buffers.
void PipelineExecutor::StepRun::retire_sends() {
  for (size_t i = 0; i < sends_.size();) {
    if (sends_[i].first.test()) sends_.erase(sends_.begin() + static_cast<std::ptrdiff_t>(i));
    else ++i;
  }
}

double PipelineExecutor::run(const std::vector<Action>& actions,
                             const std::vector<MicroBatchData>& microbatches, Pass pass,
                             double dloss, UnitHooks& hooks) {
  const auto start = std::chrono::steady_clock::now();
  stats_ = {};
  microbatches_ = static_cast<int>(microbatches.size());
  StepRun step(*this, actions, microbatches, pass, dloss, hooks);
  for (size_t index = 0; index < actions.size(); ++index) step.perform(index);
  step.finish();
  stats_.total_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return step.loss();
}

}  // namespace meshtrain
