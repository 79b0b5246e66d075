#pragma once
// Work for ranks of different speeds: a cluster of two GPU generations, nodes with different
// CPUs, a rank that straggles. A bulk-synchronous step runs at the pace of its slowest rank, so
// work is divided in proportion to speed:
//   - data parallelism: each replica takes a share of the global batch in whole micro-batches
//     (multiples of pp under the interleaved schedule), the shares minimising the slowest
//     replica's time;
//   - pipeline parallelism: each stage takes layers so that cost / speed is balanced
//     (model/partition.h).
// The update is exactly the even run's: the global batch is the same sampler positions, handed
// out to the replicas in share order (train/data_feed.h), every micro-batch's loss is scaled by
// the global batch's token count, and gradients are summed over the replicas, so the gradient
// is the mean over the same samples whatever the shares. Only the order of floating-point
// additions changes, as with any other layout.
//
// Speeds come from parallel.balance: "declared" (parallel.speeds, per rank or by node-name
// pattern), "measured" (a probe timed on every rank at start-up), and with parallel.rebalance
// from the compute times of the training steps themselves (rebalanced_shares).

#include <string>
#include <vector>

#include "meshtrain/backend/backend.h"
#include "meshtrain/config/config.h"
#include "meshtrain/model/partition.h"
#include "meshtrain/parallel/process_grid.h"

namespace meshtrain {

// `total` micro-batches shared among replicas of relative `speeds`: each share a positive
// multiple of `granule`, together `total` (a multiple of granule, at least one granule per
// replica: layout_check), minimising max(share / speed). Greedy, granule by granule, to the
// replica that would finish it first — exact for this objective; ties go to the lower replica,
// so equal speeds give even shares (the larger ones first when total does not divide).
std::vector<int> proportional_shares(int total, const std::vector<double>& speeds, int granule);
// max over replicas of shares[d] * seconds_per_microbatch[d].
double slowest_replica(const std::vector<int>& shares, const std::vector<double>& seconds_per_microbatch);

// Each world rank's relative speed from parallel.speeds: the numbers as given, or the first
// "NODE-PATTERN=SPEED" whose pattern (fnmatch) matches the rank's node name (1 when none does).
std::vector<double> declared_rank_speeds(const ParallelOptions& p,
                                         const std::vector<std::string>& node_names);
// Seconds this rank takes for the probe: the GEMMs of one transformer block's forward and
// backward at this run's micro-batch (its tensor-parallel shard), the best of 8 after a
// warm-up, in the run's precision. Attention and element-wise kernels are left out: the GEMMs
// are most of a block's time and what differs most between devices.
double probe_block_seconds(Backend& backend, const Config& c);

// Speeds along an axis: for each coordinate, the slowest of its ranks (a replica or a stage runs
// at the pace of its slowest member).
std::vector<double> axis_speeds(const GridShape& shape, const std::vector<double>& rank_speeds, Axis a);

struct WorkPlan {
  std::vector<int> shares;            // micro-batches per data-parallel replica
  std::vector<ChunkRange> partition;  // layers of every model chunk
  std::vector<double> rank_speeds;    // relative to the fastest rank; empty when even
  std::string source;                 // "even", "declared", "measured"
  int granule = 1;                    // shares are multiples of this
};

// The plan of this run, the same on every rank. Collective over grid.world() when the deck
// balances by node patterns or measurement (one all-gather, after the probe); a planned grid
// (the memory planner's dry run) cannot measure and plans even shares instead.
WorkPlan plan_work(const Config& c, ProcessGrid& grid, Backend& backend);

// The partition of a deck that sets no parallel.partition (one speed per chunk, none: equal):
// the chunks' costs balanced and, under zb-v's V (two chunks per stage, the embedding's and the
// head's on stage 0), the stages' sums too (model/partition.h). The runs, the planner and the
// time model all split this way.
std::vector<ChunkRange> default_partition(const Config& c, const std::vector<double>& chunk_speeds = {});

// Rebalancing from measured compute. Each replica's seconds per micro-batch: its slowest rank's
// compute per step (world-rank indexed, over a window under `shares`) divided by its share.
std::vector<double> replica_pace(const std::vector<int>& shares, const std::vector<double>& rank_compute,
                                 const GridShape& shape);
// The shares that minimise the slowest replica at these paces, when they would make it at least
// `min_gain` (a fraction) faster than `shares`; otherwise `shares` unchanged. Deterministic: the
// same on every rank when the inputs are (an all-gathered window).
std::vector<int> rebalanced_shares(const std::vector<int>& shares, const std::vector<double>& pace,
                                   int granule, double min_gain = 0.10);

// "5 5 4 2"
std::string describe_shares(const std::vector<int>& shares);

}  // namespace meshtrain
