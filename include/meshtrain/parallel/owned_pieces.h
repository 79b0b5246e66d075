#pragma once
// The checkpoint's view of ModelState: the pieces of parameters whose value and optimizer
// moments this rank holds authoritatively (its shard under ZeRO >= 1, everything under ZeRO 0),
// each marked with whether it is the one copy in the grid a checkpoint writes.

#include <cstdint>
#include <vector>

#include "meshtrain/parallel/sharded_optimizer.h"
#include "meshtrain/parallel/state_layout.h"

namespace meshtrain {

// A piece of one parameter that this rank owns: `count` elements from local flat index
// `local_begin` of the parameter's slice, with views of its value and optimizer moments. The
// value is the optimizer's (the fp32 master weights under bf16 mixed precision), on `backend`
// (the device, or the host when the optimizer is offloaded).
struct OwnedPiece {
  Parameter* param = nullptr;
  int64_t local_begin = 0, count = 0;
  Tensor value, exp_avg, exp_avg_sq;
  Backend* backend = nullptr;
  // The one copy of these elements in the whole grid that a checkpoint writes: data-parallel
  // replicas (ZeRO 0) defer to dp rank 0, tensor-parallel replicas to tp rank 0, and the tied
  // embedding's copy on the last stage to the first stage's.
  bool primary = false;
};

std::vector<OwnedPiece> owned_pieces(StateLayout& layout, ShardedOptimizer& optimizer);

}  // namespace meshtrain
