#pragma once
// ZeroGather: moving parameter values between shards and whole buckets. Under ZeRO-3 a rank keeps
// only its shard of each bucket; a unit's buckets are all-gathered before the unit runs (the next
// unit's prefetched), pinned while it runs and dropped when no running unit needs them. Under
// ZeRO 1 and 2 every rank updates its shard of the parameters and the updated shards are
// all-gathered back into the full buckets after each optimizer step. Stages 0 and 1's parameters
// need neither. Part of ModelState (model_state.h), over its StateLayout.

#include <vector>

#include "meshtrain/comm/communicator.h"
#include "meshtrain/parallel/state_layout.h"

namespace meshtrain {

class ZeroGather {
 public:
  explicit ZeroGather(StateLayout& layout);

  // ZeRO-3: gathers (or waits for) `unit`'s buckets and pins them; starts gathering
  // `prefetch_unit`'s, when it is a unit. A no-op below ZeRO-3.
  void pin(int unit, int prefetch_unit);
  // ZeRO-3: drops the pins `pin` took, releasing buckets no running unit holds.
  void unpin(int unit);
  // ZeRO-3: drops every gathered bucket nothing pins (outside a step, after backward).
  void release_unpinned();
  // ZeRO 1/2: all-gathers every bucket's updated owned range in place.
  void gather_updated_shards();

 private:
  struct InFlight {
    Work gather;  // all-gather in flight into the bucket's values
    bool gathering = false;
    int pins = 0;  // units running with the gathered values
  };
  void start_gather(int b);
  void ensure_gathered(int b);
  void release(int b);

  StateLayout* layout_;
  std::vector<InFlight> in_flight_;  // per bucket
};

}  // namespace meshtrain
