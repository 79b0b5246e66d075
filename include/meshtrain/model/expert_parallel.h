#pragma once
// The expert group of a mixture of experts (parallel.ep; parallel/grid_shape.h folds it over the
// data and context ranks): its ranks hold disjoint experts of every MoE layer, each
// experts / size() consecutive ones, and send each token's rows to the ranks of its experts.

#include <cstdint>

#include "meshtrain/comm/communicator.h"

namespace meshtrain {

struct ExpertParallel {
  Communicator* comm = nullptr;  // the expert group; null: off (every rank holds every expert)

  int rank() const { return comm ? comm->rank() : 0; }
  int size() const { return comm ? comm->size() : 1; }
  bool on() const { return size() > 1; }
  // The rank that holds expert e of `experts`.
  int owner(int64_t e, int64_t experts) const {
    return static_cast<int>(e / (experts / size()));
  }
};

}  // namespace meshtrain
