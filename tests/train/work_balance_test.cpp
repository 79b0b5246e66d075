// Work for ranks of different speeds (train/work_balance.h): shares in proportion to speed,
// speed-weighted partitions, declared speeds by rank and by node pattern, rebalancing from
// measured compute; and, on 2 and 4 ranks, a run whose shares change between steps (as
// parallel.rebalance changes them) still follows the single-rank trajectory.

#include <gtest/gtest.h>
#include <mpi.h>

#include <limits>
#include <numeric>

#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/config/layout_check.h"
#include "meshtrain/parallel/slowdown.h"
#include "meshtrain/train/trainer.h"
#include "meshtrain/train/work_balance.h"
#include "support/mpi_world.h"
#include "support/parity.h"
#include "support/temp_dir.h"

namespace meshtrain {
namespace {

using testing::world_rank;
using testing::world_size;

TEST(ProportionalShares, EqualSpeedsGiveEvenShares) {
  EXPECT_EQ(proportional_shares(16, {1, 1, 1, 1}, 1), (std::vector<int>{4, 4, 4, 4}));
  EXPECT_EQ(proportional_shares(10, {1, 1, 1, 1}, 1), (std::vector<int>{3, 3, 2, 2}));
  EXPECT_EQ(proportional_shares(8, {2, 2}, 2), (std::vector<int>{4, 4}));
}

TEST(ProportionalShares, AHalfSpeedReplicaTakesAboutHalf) {
  const std::vector<int> s = proportional_shares(16, {1, 1, 1, 0.5}, 1);
  EXPECT_EQ(s, (std::vector<int>{5, 5, 4, 2}));
  // The slowest replica's time: 5 units, against 8 for even shares.
  EXPECT_DOUBLE_EQ(slowest_replica(s, {1, 1, 1, 2}), 5.0);
  EXPECT_DOUBLE_EQ(slowest_replica({4, 4, 4, 4}, {1, 1, 1, 2}), 8.0);
}

TEST(ProportionalShares, MinimisesTheSlowestReplicaExactly) {
  // Brute force over every split of 12 into 3 positive shares.
  const std::vector<double> speeds = {1.0, 0.35, 0.8};
  double best = 1e300;
  for (int a = 1; a <= 10; ++a)
    for (int b = 1; a + b <= 11; ++b) {
      const int c = 12 - a - b;
      best = std::min(best, std::max({a / speeds[0], b / speeds[1], c / speeds[2]}));
    }
  const std::vector<int> s = proportional_shares(12, speeds, 1);
  EXPECT_EQ(std::accumulate(s.begin(), s.end(), 0), 12);
  EXPECT_DOUBLE_EQ(std::max({s[0] / speeds[0], s[1] / speeds[1], s[2] / speeds[2]}), best);
}

TEST(ProportionalShares, KeepsGranulesAndAtLeastOneEach) {
  const std::vector<int> s = proportional_shares(12, {1.0, 0.01}, 2);
  EXPECT_EQ(s, (std::vector<int>{10, 2}));
  EXPECT_THROW(proportional_shares(7, {1, 1}, 2), std::invalid_argument);
  EXPECT_THROW(proportional_shares(3, {1, 1, 1, 1}, 1), std::invalid_argument);
}

TEST(Partition, ASlowerStageGetsFewerLayers) {
  ModelSpec cfg = gpt2_spec(12, 64, 4, 32, 64);
  const std::vector<ChunkRange> even = balanced_partition(cfg, 2);
  EXPECT_EQ(even[0].layers(), 6);
  const std::vector<ChunkRange> slow_second = balanced_partition(cfg, 2, {1.0, 0.5});
  EXPECT_EQ(slow_second[0].layers(), 8);
  EXPECT_EQ(slow_second[1].layers(), 4);
  const std::vector<ChunkRange> slow_first = balanced_partition(cfg, 2, {0.5, 1.0});
  EXPECT_EQ(slow_first[0].layers(), 4);
  // Interleaved: chunk k runs on stage k % 2, so chunks 1 and 3 are the slow stage's.
  const std::vector<ChunkRange> v = balanced_partition(cfg, 4, {1.0, 0.5});
  EXPECT_GT(v[0].layers() + v[2].layers(), v[1].layers() + v[3].layers());
}

// Under zb-v's V stage r holds chunks r and 2p-1-r: stage 0 both the embedding and the head
// (with a 50257-token vocabulary some 4-6 blocks' worth). Balancing chunks alone leaves stage 0
// the dearest; the default partition gives each stage the layers that make the dearest stage as
// cheap as any split can (checked against every split), its two chunks as even as they can be.
TEST(Partition, TheVBalancesStagesNotChunks) {
  struct Case {
    ModelSpec model;
    int stages;
  };
  const Case cases[] = {{gpt2_spec(12, 768, 12, 1024, 50257), 2}, {gpt2_spec(8, 512, 8, 512, 32000), 2},
                        {gpt2_spec(16, 768, 12, 1024, 50257), 4}, {gpt2_spec(24, 1024, 16, 2048, 50257), 4},
                        {gpt2_spec(18, 512, 8, 512, 50257), 3}, {gpt2_spec(8, 256, 8, 128, 256), 2}};
  int worse_by_chunks = 0;
  for (const Case& k : cases) {
    Config c;
    c.model = k.model;
    c.parallel.pp = k.stages;
    c.parallel.virtual_stages = 2;
    c.parallel.schedule = ScheduleKind::ZeroBubbleV;
    const int chunks = 2 * k.stages;
    const auto dearest_stage = [&](const std::vector<ChunkRange>& r) {
      double worst = 0;
      for (int s = 0; s < k.stages; ++s)
        worst = std::max(worst, chunk_cost(c.model, r[s]) + chunk_cost(c.model, r[chunks - 1 - s]));
      return worst;
    };
    const std::vector<ChunkRange> v = default_partition(c);
    SCOPED_TRACE(std::to_string(k.model.layers) + " layers on " + std::to_string(k.stages) + " stages: " +
                 describe_partition(v));
    ASSERT_EQ(v.size(), static_cast<size_t>(chunks));
    // Every split into `chunks` non-empty ranges: its cuts are a (chunks-1)-subset of 1..L-1.
    double best = std::numeric_limits<double>::infinity();
    std::vector<int> cut(static_cast<size_t>(chunks - 1));
    std::iota(cut.begin(), cut.end(), 1);
    const int L = k.model.layers;
    while (true) {
      std::vector<int> counts;
      int previous = 0;
      for (int x : cut) counts.push_back(x - previous), previous = x;
      counts.push_back(L - previous);
      best = std::min(best, dearest_stage(explicit_partition(counts)));
      int i = chunks - 2;
      while (i >= 0 && cut[i] == L - (chunks - 1 - i)) --i;
      if (i < 0) break;
      ++cut[i];
      for (int j = i + 1; j < chunks - 1; ++j) cut[j] = cut[j - 1] + 1;
    }
    EXPECT_LE(dearest_stage(v), best * (1 + 1e-12));
    if (dearest_stage(balanced_partition(c.model, chunks)) > best * 1.05) ++worse_by_chunks;
    // The two chunks of a stage: moving a layer between them makes the dearer one no cheaper.
    for (int s = 0; s < k.stages; ++s) {
      const ChunkRange a = v[s], b = v[chunks - 1 - s];
      const double dearer = std::max(chunk_cost(c.model, a), chunk_cost(c.model, b));
      for (int move : {-1, 1}) {
        const int x = a.layers() + move, y = b.layers() - move;
        if (x < 1 || y < 1) continue;
        const double other = std::max(chunk_cost(c.model, {0, x, a.has_embedding, a.has_head}),
                                      chunk_cost(c.model, {0, y, b.has_embedding, b.has_head}));
        EXPECT_GE(other, dearer * (1 - 1e-12)) << "stage " << s;
      }
    }
  }
  EXPECT_GE(worse_by_chunks, 2);  // the cases show what balancing chunks alone costs
  // Looped schedules keep the chunk-balanced split.
  Config c;
  c.model = cases[0].model;
  c.parallel.pp = 2;
  c.parallel.virtual_stages = 2;
  c.parallel.schedule = ScheduleKind::Interleaved;
  EXPECT_EQ(describe_partition(default_partition(c)), describe_partition(balanced_partition(c.model, 4)));
}

TEST(DeclaredSpeeds, ByRankOrByNodePattern) {
  ParallelOptions p;
  p.rank_speeds = {1, 0.5};
  EXPECT_EQ(declared_rank_speeds(p, {}), (std::vector<double>{1, 0.5}));
  p.rank_speeds.clear();
  p.node_speeds = {{"v100-*", 0.4}, {"a100-0[12]", 1.0}, {"*", 0.9}};
  EXPECT_EQ(declared_rank_speeds(p, {"a100-01", "v100-17", "h100-1", "a100-03"}),
            (std::vector<double>{1.0, 0.4, 0.9, 0.9}));
  p.node_speeds = {{"v100-*", 0.4}};
  EXPECT_EQ(declared_rank_speeds(p, {"a100-01", "v100-2"}), (std::vector<double>{1.0, 0.4}));
}

TEST(Rebalance, FollowsMeasuredComputeAndSettles) {
  GridShape shape;
  shape.dp = 4;
  // Even shares of 4; rank 3 takes twice as long per micro-batch.
  const std::vector<int> even = {4, 4, 4, 4};
  const std::vector<double> pace = replica_pace(even, {0.4, 0.4, 0.4, 0.8}, shape);
  EXPECT_EQ(pace, (std::vector<double>{0.1, 0.1, 0.1, 0.2}));
  const std::vector<int> next = rebalanced_shares(even, pace, 1);
  EXPECT_EQ(next, (std::vector<int>{5, 5, 4, 2}));
  // Measured again under the new shares: the same paces, so no further change.
  EXPECT_EQ(rebalanced_shares(next, replica_pace(next, {0.5, 0.51, 0.39, 0.41}, shape), 1), next);
  // Noise of a few percent does not move even shares.
  EXPECT_EQ(rebalanced_shares(even, replica_pace(even, {0.40, 0.42, 0.39, 0.41}, shape), 1), even);
  // Nothing measured: unchanged.
  EXPECT_EQ(rebalanced_shares(even, {0, 0, 0, 0}, 1), even);
}

TEST(Rebalance, AReplicaRunsAtItsSlowestRank) {
  GridShape shape;  // tp-dp-pp: ranks 0,1 replica 0 (tp), ranks 2,3 replica 1
  shape.dp = 2;
  shape.tp = 2;
  const std::vector<double> pace = replica_pace({4, 4}, {0.4, 0.8, 0.4, 0.4}, shape);
  EXPECT_EQ(rebalanced_shares({4, 4}, pace, 1), (std::vector<int>{3, 5}));
}

TEST(Probe, ASlowedRankTakesLonger) {
  if (world_rank() != 0) GTEST_SKIP() << "rank 0 only";
  testing::TempDir dir;
  Config c = testing::tiny_config(dir.path());
  c.model.d_model = 128;
  c.model.seq_len = 64;
  c.train.micro_batch = 4;
  CpuBackend backend(1);
  const double plain = probe_block_seconds(backend, c);
  set_compute_slowdown(10.0);  // far beyond the noise of a shared machine
  const double slowed = probe_block_seconds(backend, c);
  set_compute_slowdown(1.0);
  EXPECT_GT(plain, 0.0);
  EXPECT_GT(slowed / plain, 2.0) << "plain " << plain << " s, slowed " << slowed << " s";
}

// Shares changed between steps (what parallel.rebalance does) leave the trajectory the
// single-rank run's: the same global batch, the gradient summed over it.
TEST(UnevenShares, ChangingSharesMidRunFollowsTheSingleRankTrajectory) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 or more ranks";
  testing::TempDir dir;
  Config base = testing::tiny_config(dir.path());
  const int steps = 5;
  const testing::Reference ref = testing::run_reference(base, steps);
  Config c = base;
  c.parallel.dp = world_size() == 4 ? 2 : world_size();
  c.parallel.pp = world_size() == 4 ? 2 : 1;
  c.parallel.schedule = ScheduleKind::OneFOneB;
  c.parallel.zero = 1;
  c.parallel.rebalance = true;
  c.parallel.bucket_mb = 0.01;
  c.train.micro_batch = 1;  // 16 micro-batches to share
  check_layout(c, world_size());
  CpuBackend backend(1);
  ProcessGrid grid(MPI_COMM_WORLD, c.grid_shape(), c.run.comm_timeout);
  Trainer trainer(c, grid, backend);
  const int dp = c.parallel.dp;
  std::vector<std::vector<int>> plans = {std::vector<int>(dp, 16 / dp)};
  std::vector<int> skewed(dp, 1);
  skewed[0] = 16 - (dp - 1);
  plans.push_back(skewed);
  std::vector<int> reversed(dp, 2);
  reversed[dp - 1] = 16 - 2 * (dp - 1);
  plans.push_back(reversed);
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    trainer.set_shares(plans[s % plans.size()]);
    losses.push_back(trainer.train_step(s).loss);
  }
  const testing::ParityResult r =
      testing::compare_with_reference(trainer, backend, MPI_COMM_WORLD, losses, 0, ref);
  EXPECT_LT(r.max_loss_error, 1e-5);
  EXPECT_LT(r.params_l2_error, 1e-5);
  EXPECT_LT(r.max_param_l2_error, 1e-4) << r.worst_l2_param;
}

}  // namespace
}  // namespace meshtrain
