#pragma once
// ModelState's per-bucket state and pending reductions, shared by the files that implement it,
// one concern each: model_state.cpp (parameter layout and buckets, ZeRO-3 gathering),
// model_state_reducer.cpp (the gradient reducer: hooks, per-bucket reductions and their
// overlap), model_state_optimizer.cpp (the sharded optimizer: initial values, the step, master
// weights and offload, checkpoint pieces), model_state_replicas.cpp and model_state_flat.cpp.
// Internal to parallel/.

#include <algorithm>
#include <memory>
#include <vector>

#include "meshtrain/parallel/model_state.h"

namespace meshtrain {

struct ModelState::BucketState {
  Tensor values;       // full bucket: a view of flat_values_ (zero <= 2), or the gathered copy
  Tensor value_shard;  // zero 3: this rank's persistent shard
  Work gather;         // zero 3: all-gather in flight into `values`
  bool gathering = false;
  int pins = 0;        // units running with the gathered values (zero 3)
  Tensor grads;        // zero <= 1: a view of flat_grads_; zero >= 2: the current staging buffer
  Tensor grad_shard;   // zero 1: this step's reduce-scatter result; zero >= 2: accumulated shard
  bool reduced = false;
  std::unique_ptr<AdamW> optim;  // on the state backend, in the state dtype
  Tensor master;                 // the optimizer's values when they are not the parameters'
  Tensor host_grads;             // offload: the owned gradients, copied to the host
  std::vector<OptimizerSegment> norm_segments;     // relative to the owned range
  std::vector<OptimizerSegment> partial_segments;  // sequence-parallel partial gradients
};

struct ModelState::Pending {
  int bucket;
  Work work;
  Tensor staging, out;  // kept alive until the reduction completes
  bool accumulate;      // add `out` into the bucket's gradient shard on completion
  int generation;       // the after_backward call that launched it
};

// [begin, end) of a parameter inside its bucket, intersected with [lo, hi), relative to lo.
inline bool intersect(int64_t begin, int64_t end, int64_t lo, int64_t hi, OptimizerSegment& out) {
  const int64_t a = std::max(begin, lo), b = std::min(end, hi);
  if (a >= b) return false;
  out.offset = a - lo;
  out.count = b - a;
  return true;
}

}  // namespace meshtrain
