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

double PipelineExecutor::run(const std::vector<Action>& actions,
                             const std::vector<MicroBatchData>& microbatches, Pass pass,
                             double dloss, UnitHooks& hooks) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  stats_ = {};
  microbatches_ = static_cast<int>(microbatches.size());
  const int me = pp_->rank(), last_chunk = stages_ * virtual_stages_ - 1;
  std::map<std::pair<int, int>, Slot> slots;  // (chunk, micro-batch)
  std::vector<std::pair<Work, Tensor>> sends;
  double loss = 0;

  auto hidden = [&](int m, MemoryCategory c) {
    return stage_->backend().empty(stage_->boundary_shape(microbatches[m].shape), stage_->dtype(), c);
  };
  // The stage's own index of global chunk k.
  auto chunk = [&](int k) {
    if (owner(k) != me) throw std::logic_error("pipeline: action on chunk " + std::to_string(k) + " not owned by this rank");
    return local_chunk(k, stages_, placement_);
  };

  // The transfers of the step being gathered, and where each one's Work goes (null: a send's).
  std::vector<Transfer> step;
  std::vector<Work*> step_works;
  auto issue_step = [&] {
    if (step.empty()) return;
    std::vector<Work> works = pp_->exchange(step);
    for (size_t i = 0; i < works.size(); ++i) {
      if (step_works[i]) *step_works[i] = std::move(works[i]);
      else sends.emplace_back(std::move(works[i]), step[i].tensor);
    }
    step.clear();
    step_works.clear();
  };
  auto gather = [&](Transfer::Kind kind, const Tensor& t, int peer, int tag, Work* work) {
    step.push_back({kind, t, peer, tag});
    step_works.push_back(work);
  };

  // Weight gradients (BackwardWeight) run in list order, but may run before their place in the
  // list (with early_weights): a rank about to wait for a transfer runs the next one instead, if
  // its input gradient is done. That fills waits the schedule's clock did not foresee (slow links, an input
  // gradient dearer than a weight gradient); a weight gradient sends and receives nothing, and
  // pulled earlier frees memory sooner. But it cannot be cut short: a transfer that lands during
  // it waits for it (hence the grace below, and no pulls under ZB-V). Its order, and so every
  // gradient sum, stays the list's: it is never pulled past another action that adds to weight
  // gradients, a full Backward or the head's forward in training (the head's backward runs
  // inside it). Under the V placement the head and the embedding share a rank, and with tied
  // embeddings both add to wte's gradient: pulled past the head, the embedding's weight gradient
  // would change that sum's order with the timing of the transfers. (The trainer asks for no
  // pulls under ZB-V, the one V schedule, whose plan has no slack for them: trainer.cpp.)
  std::vector<size_t> weight_actions;
  for (size_t i = 0; i < actions.size(); ++i)
    if (actions[i].op == Op::BackwardWeight) weight_actions.push_back(i);
  // next_writer[i]: the first action at or after i that adds to weight gradients outside a
  // BackwardWeight (actions.size() if none).
  std::vector<size_t> next_writer(actions.size() + 1, actions.size());
  for (size_t i = actions.size(); i-- > 0;) {
    const Action& a = actions[i];
    const bool writes = a.op == Op::Backward ||
                        (a.op == Op::Forward && pass == Pass::Train && a.chunk == last_chunk);
    next_writer[i] = writes ? i : next_writer[i + 1];
  }
  size_t weights_run = 0;
  // A whole backward (no split into input and weight gradients) has no kind of its own.
  auto account = [&](int k, std::optional<PipelineStats::ActionKind> kind, PaddedCompute& timer) {
    const double seconds = timer.finish();
    stats_.compute_seconds += seconds;
    stats_.longest_action_seconds = std::max(stats_.longest_action_seconds, seconds);
    if (kind) stats_.chunk_seconds[k][*kind].push_back(seconds);
    return seconds;
  };
  auto run_weights = [&](const Action& a) {
    PaddedCompute timer;
    {
      TraceWriter::Scope span(*trace_, a.to_string(), "compute", TraceWriter::Compute);
      stage_->backward_weights(chunk(a.chunk), slots[{a.chunk, a.microbatch}].weights, hooks);
    }
    last_weight_seconds_ = account(a.chunk, PipelineStats::kWeight, timer);
    ++weights_run;
  };
  // Whether `transfer` completes within `seconds`, polling.
  auto arrives_within = [](Work& transfer, double seconds) {
    const auto deadline = clock::now() + std::chrono::duration<double>(seconds);
    do {
      if (transfer.test()) return true;
      std::this_thread::yield();
    } while (clock::now() < deadline);
    return false;
  };
  auto wait_filling = [&](Work& transfer, const std::string& what, size_t index) {
    while (early_weights_ && weights_run < weight_actions.size() && !transfer.test()) {
      const size_t at = weight_actions[weights_run];
      const Action& w = actions[at];
      if (!slots[{w.chunk, w.microbatch}].input_gradient_done || next_writer[index] < at) break;
      // A weight gradient pulled in cannot be cut short: where the transfer was only a little
      // late, the action waiting for it, on the schedule's critical path when that path has no
      // slack (zero-bubble schedules), starts a whole weight gradient late instead of a little,
      // and every rank after it with it. So the transfer gets a grace of a quarter of a weight
      // gradient's time first: the pulls then fill waits the schedule did not foresee, not the
      // transfer's own latency. (Without the grace a rank idled about twice what the plan
      // idles: docs/benchmarks.md, "Pipeline schedules: zero-bubble".)
      bool arrived = false;
      {  // traced as a wait, so that a trace shows what the rank did in that time
        TraceWriter::Scope grace(*trace_, what + " (grace)", "p2p", TraceWriter::PipelineComm);
        arrived = arrives_within(transfer, kPullGrace * last_weight_seconds_);
      }
      if (arrived) break;
      run_weights(w);
    }
    TraceWriter::Scope wait(*trace_, what, "p2p", TraceWriter::PipelineComm);
    transfer.wait();
  };

  for (size_t index = 0; index < actions.size(); ++index) {
    const Action& a = actions[index];
    if (!is_communication(a.op)) issue_step();  // a compute or an EndStep ends the step
    if (a.op == Op::EndStep) continue;
    const int k = a.chunk, m = a.microbatch;
    Slot& s = slots[{k, m}];
    switch (a.op) {
      case Op::RecvForward:
        s.input = hidden(m, MemoryCategory::Activations);
        gather(Transfer::Kind::Recv, s.input, owner(k - 1), tag(k, m, 0), &s.recv_forward);
        break;
      case Op::RecvBackward:
        s.doutput = hidden(m, MemoryCategory::Workspace);
        gather(Transfer::Kind::Recv, s.doutput, owner(k + 1), tag(k, m, 1), &s.recv_backward);
        break;
      case Op::SendForward:
        gather(Transfer::Kind::Send, s.output, owner(k + 1), tag(k + 1, m, 0), nullptr);
        s.output = Tensor{};
        break;
      case Op::SendBackward:
        gather(Transfer::Kind::Send, s.dinput, owner(k - 1), tag(k - 1, m, 1), nullptr);
        s.dinput = Tensor{};
        break;
      case Op::EndStep: break;
      case Op::Forward: {
        Tensor input;
        if (k > 0) {
          if (owner(k - 1) == me) {
            Slot& prev = slots[{k - 1, m}];
            input = prev.output;
            prev.output = Tensor{};
          } else {
            wait_filling(s.recv_forward, "wait F" + std::to_string(m), index);
            input = s.input;
          }
        }
        s.input = Tensor{};
        PaddedCompute timer;
        {
          TraceWriter::Scope span(*trace_, a.to_string(), "compute", TraceWriter::Compute);
          const int local = chunk(k);
          if (!s.saved) s.saved = stage_->new_activations(local);
          Tensor out = stage_->forward(local, microbatches[m], input, *s.saved, pass, recompute_,
                                       dloss, &loss, hooks);
          if (k < last_chunk) s.output = out;
        }
        account(k, PipelineStats::kForward, timer);
        break;
      }
      case Op::BackwardWeight:
        if (weights_run < weight_actions.size() && weight_actions[weights_run] == index)
          run_weights(a);  // else it ran while a transfer was awaited
        break;
      case Op::Backward:
      case Op::BackwardInput: {
        Tensor dout;
        if (k < last_chunk) {
          if (owner(k + 1) == me) {
            Slot& next = slots[{k + 1, m}];
            dout = next.dinput;
            next.dinput = Tensor{};
          } else {
            wait_filling(s.recv_backward, "wait B" + std::to_string(m), index);
            dout = s.doutput;
          }
        }
        s.doutput = Tensor{};
        PaddedCompute timer;
        {
          TraceWriter::Scope span(*trace_, a.to_string(), "compute", TraceWriter::Compute);
          const int local = chunk(k);
          if (!s.saved)
            throw std::logic_error("pipeline: " + a.to_string() + " before the forward of its micro-batch");
          Tensor din = stage_->backward(local, microbatches[m], dout, *s.saved, recompute_, hooks,
                                        a.op == Op::BackwardInput ? &s.weights : nullptr);
          if (k > 0) s.dinput = din;
          s.input_gradient_done = true;
        }
        account(k, a.op == Op::BackwardInput ? std::optional(PipelineStats::kInput) : std::nullopt, timer);
        break;
      }
    }
    for (size_t i = 0; i < sends.size();) {  // retire completed sends, freeing their buffers
      if (sends[i].first.test()) sends.erase(sends.begin() + static_cast<std::ptrdiff_t>(i));
      else ++i;
    }
  }
  issue_step();
  for (auto& [work, tensor] : sends) work.wait();
  stats_.total_seconds = std::chrono::duration<double>(clock::now() - start).count();
  return loss;
}

}  // namespace meshtrain
