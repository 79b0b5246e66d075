#pragma once
// The weight-gradient half of a backward pass, which zero-bubble pipeline schedules run later
// than the input-gradient half (parallel/schedule.h: BackwardInput, then BackwardWeight).
//
// A layer's backward hands each weight-gradient computation to run_or_defer: with no
// DeferredWeightGradients it runs at once (an ordinary backward, unchanged); with one, it is
// kept, holding the tensors it reads (the layer's saved input and its output gradient), until
// ModelChunk::backward_weights runs it. The work reads no parameter values, only gradient
// buffers, which it looks up when it runs: ZeRO-2 and 3 hand out a fresh staging buffer after
// each reduction, and ZeRO-3 may have released the values.

#include <functional>
#include <utility>
#include <vector>

namespace meshtrain {

class DeferredWeightGradients {
 public:
  struct Unit {
    int unit = 0;  // the model unit (UnitHooks numbering) whose gradients the work writes
    std::vector<std::function<void()>> work;
  };

  // The work added from now on writes gradients of `unit`.
  void begin_unit(int unit) { units_.push_back({unit, {}}); }
  void add(std::function<void()> work) { units_.back().work.push_back(std::move(work)); }
  bool empty() const { return units_.empty(); }
  // Hands the kept work over, unit by unit in the order the backward met them, and empties.
  std::vector<Unit> take() { return std::exchange(units_, {}); }

 private:
  std::vector<Unit> units_;
};

template <class Work>
void run_or_defer(DeferredWeightGradients* deferred, Work&& work) {
  if (deferred) deferred->add(std::forward<Work>(work));
  else work();
}

}  // namespace meshtrain
