#pragma once
// Scaling rows of parameters in place, wherever their values live: the optimizer's values of
// this rank's owned range (master weights, ZeRO shards, or the parameters themselves), then the
// parameters refreshed from them as after a checkpoint load (cast, ZeRO's gathers). QK-clip's
// after-step scaling (model/qk_clip.h) is its one user. Every rank of a data-parallel group must
// call it together (the refresh gathers), with the same scales for the elements they share.

#include <vector>

#include "meshtrain/model/parameter.h"
#include "meshtrain/parallel/sharded_optimizer.h"
#include "meshtrain/parallel/state_layout.h"

namespace meshtrain {

void scale_parameter_rows(StateLayout& layout, ShardedOptimizer& optimizer,
                          const std::vector<RowScale>& scales);

}  // namespace meshtrain
