// The share scheduler of asynchronous data parallelism (parallel/share_scheduler.h) and the
// servers' division of the state (parallel/server_channel.h), driven by an event simulation of
// replicas of different speeds and servers that apply a step once all its shares are in.

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <queue>

#include "meshtrain/parallel/server_channel.h"
#include "meshtrain/parallel/share_scheduler.h"

namespace meshtrain {
namespace {

struct Simulated {
  double end_time = 0;
  int max_staleness = 0;
  std::vector<int> shares_per_replica;
  std::vector<int64_t> fences;            // in the order they were passed
  std::vector<int64_t> computed_steps;    // every share's step, in hand-out order
  bool bound_kept = true;                 // min_version <= the version computed on, step - version <= s
};

// Replicas compute a share in `seconds[r]`; the servers' version advances when a step's shares
// are all in. A replica computes on the newest version (what its pulls bring), which must be at
// least the share's min_version: it waits otherwise.
Simulated simulate(const std::vector<double>& seconds, int staleness, int64_t steps,
                   const std::vector<int64_t>& fences) {
  const int R = static_cast<int>(seconds.size());
  ShareScheduler s(R, staleness, 0, steps, fences);
  Simulated out;
  out.shares_per_replica.assign(static_cast<size_t>(R), 0);
  std::map<int64_t, int> arrived;
  int64_t version = 0;
  // (time, replica, step, version computed on, share)
  using Event = std::tuple<double, int, int64_t, int64_t, int>;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> running;
  std::vector<std::pair<int, Assignment>> waiting_for_version;
  std::vector<ShareReport> reports(static_cast<size_t>(R));
  double now = 0;
  for (int r = 0; r < R; ++r) s.ask(r, reports[static_cast<size_t>(r)]);
  for (int guard = 0; guard < 100000; ++guard) {
    bool fenced = false;
    for (const auto& [r, a] : s.dispatch()) {
      if (a.kind == AssignmentKind::Fence) {
        fenced = true;
        if (out.fences.empty() || out.fences.back() != a.step) out.fences.push_back(a.step);
        if (a.step == steps) continue;
        reports[static_cast<size_t>(r)] = ShareReport{};
        s.ask(r, reports[static_cast<size_t>(r)]);
        continue;
      }
      out.computed_steps.push_back(a.step);
      if (version < a.min_version) out.bound_kept = false;  // the version cannot be newer than a share allows
      running.emplace(now + seconds[static_cast<size_t>(r)], r, a.step, version, a.share);
    }
    if (s.finished()) break;
    if (fenced) continue;  // the replicas asked again: hand out the next steps
    if (running.empty()) {
      ADD_FAILURE() << "deadlock at version " << version;
      break;
    }
    const auto [t, r, step, used, share] = running.top();
    running.pop();
    now = t;
    ++out.shares_per_replica[static_cast<size_t>(r)];
    if (step - used > staleness) out.bound_kept = false;
    out.max_staleness = std::max(out.max_staleness, static_cast<int>(step - used));
    if (++arrived[step] == R)
      while (arrived[version] == R) s.set_version(++version);
    ShareReport rep;
    rep.step = step;
    rep.share = share;
    rep.version = used;
    s.ask(r, rep);
  }
  out.end_time = now;
  return out;
}

TEST(ShareScheduler, StalenessZeroIsSynchronous) {
  const Simulated sim = simulate({1, 1, 1, 2}, 0, 10, {});
  EXPECT_TRUE(sim.bound_kept);
  EXPECT_EQ(sim.max_staleness, 0);
  // Every step waits for the slowest replica: 10 steps of 2 seconds.
  EXPECT_DOUBLE_EQ(sim.end_time, 20.0);
  for (int n : sim.shares_per_replica) EXPECT_EQ(n, 10);
}

TEST(ShareScheduler, SharesGoOutInStepOrder) {
  const Simulated sim = simulate({1, 1.3, 0.7}, 3, 12, {});
  EXPECT_TRUE(std::is_sorted(sim.computed_steps.begin(), sim.computed_steps.end()));
  EXPECT_EQ(sim.computed_steps.size(), 36u);
}

TEST(ShareScheduler, BoundedStalenessOutrunsTheSlowReplica) {
  for (int s : {1, 2, 4}) {
    const Simulated sim = simulate({1, 1, 1, 2}, s, 40, {});
    EXPECT_TRUE(sim.bound_kept) << "s = " << s;
    EXPECT_LE(sim.max_staleness, s);
    EXPECT_GT(sim.max_staleness, 0);
    // Synchronous: 80 s. The fast replicas take more shares than the slow one.
    EXPECT_LT(sim.end_time, 80.0 / 1.4) << "s = " << s;
    EXPECT_GT(sim.shares_per_replica[0], sim.shares_per_replica[3]);
  }
}

TEST(ShareScheduler, FencesAreReachedByEveryReplicaAtTheirVersion) {
  const Simulated sim = simulate({1, 2, 1.5}, 2, 20, {5, 10, 15});
  EXPECT_TRUE(sim.bound_kept);
  EXPECT_EQ(sim.fences, (std::vector<int64_t>{5, 10, 15, 20}));
}

TEST(ShareScheduler, StopPutsAFenceAfterTheSharesHandedOut) {
  ShareScheduler s(2, 1, 0, 100, {});
  s.ask(0, {});
  s.ask(1, {});
  auto a = s.dispatch();
  ASSERT_EQ(a.size(), 2u);  // step 0, shares 0 and 1
  s.ask(0, {0, 0, 0, 1.0});
  a = s.dispatch();  // step 1 share 0 (s = 1 allows it on version 0)
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].second.step, 1);
  s.request_stop();  // a fence at 2: step 1 must be completed first
  s.ask(1, {0, 1, 0, 1.0});
  a = s.dispatch();
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].second.step, 1);
  EXPECT_EQ(a[0].second.share, 1);
  s.set_version(2);
  s.ask(0, {1, 0, 0, 1.0});
  s.ask(1, {1, 1, 0, 1.0});
  a = s.dispatch();
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0].second.kind, AssignmentKind::Fence);
  EXPECT_EQ(a[0].second.step, 2);
  const std::vector<StepSummary> steps = s.take_summaries();
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[1].step, 1);
  EXPECT_EQ(steps[1].staleness_max, 1);
  EXPECT_DOUBLE_EQ(steps[1].loss_sum, 2.0);
}

TEST(ShareScheduler, AResumedRunStartsAtItsVersion) {
  ShareScheduler s(1, 0, 7, 9, {5, 8});
  s.ask(0, {});
  auto a = s.dispatch();
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].second.step, 7);
  s.set_version(8);
  s.ask(0, {7, 0, 7, 1.0});
  a = s.dispatch();
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].second.kind, AssignmentKind::Fence);
  EXPECT_EQ(a[0].second.step, 8);
}

TEST(ServerLayout, PiecesCoverEveryPositionOnceAndBalanceTheServers) {
  const std::vector<int64_t> sizes = {10, 3, 7, 0, 13};
  for (int servers = 1; servers <= 6; ++servers) {
    ServerLayout layout(sizes, servers);
    EXPECT_EQ(layout.total(), 33);
    int64_t held = 0;
    for (int k = 0; k < servers; ++k) {
      int64_t on_k = 0;
      for (const ServerPiece& p : layout.pieces_on_server(k)) on_k += p.count;
      EXPECT_EQ(on_k, layout.server_size(k));
      EXPECT_LE(layout.server_size(k), 33 / servers + 1);
      held += on_k;
    }
    EXPECT_EQ(held, 33);
    for (int q = 0; q < 5; ++q) {
      int64_t next = 0;
      for (const ServerPiece& p : layout.pieces_of_position(q)) {
        EXPECT_EQ(p.local_begin, next);  // contiguous, in server order
        next += p.count;
      }
      EXPECT_EQ(next, sizes[static_cast<size_t>(q)]);
    }
  }
}

}  // namespace
}  // namespace meshtrain
