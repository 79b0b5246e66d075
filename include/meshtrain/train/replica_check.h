#pragma once
// The replica check (run.replica_check_every), after Megatron's weight-hash check across
// data-parallel replicas: the ranks that hold copies of the same state (parallel/model_state.h
// ReplicaScope: data-parallel replicas, tensor-parallel copies of unsplit parameters, the tied
// embedding's two stages) all-gather one 64-bit hash of their copies per group; a group whose
// hashes differ gathers the hashes per parameter to name what differs. Bits that healthy
// hardware keeps equal and that differ mean silent data corruption: the job stops, naming the
// ranks and nodes whose copies differ from the majority of their group (or the whole group where
// there is no majority, as with two copies), before a checkpoint can store the corruption.

#include "meshtrain/config/config.h"
#include "meshtrain/parallel/model_state.h"
#include "meshtrain/parallel/process_grid.h"

namespace meshtrain {

// Collective over the world, after step `step`'s update. `agreed_step`: the step at which the
// copies last agreed (the previous check, or where this run started), for the advice. Throws
// HardwareFault, the same on every rank, when any copies differ.
void check_replicas(const Config& config, ProcessGrid& grid, ModelState& state, int step,
                    int agreed_step);

}  // namespace meshtrain
