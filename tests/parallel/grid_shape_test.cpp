// GridShape with the context axis: coordinates round-trip for every order, "tp-dp-pp" places
// cp right after tp, and the replica groups (dp x cp: where gradients are summed) partition the
// world with the same tensor and pipeline coordinates.

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <stdexcept>

#include "meshtrain/parallel/grid_shape.h"

namespace meshtrain {
namespace {

GridShape shape(int dp, int tp, int pp, int cp, const std::string& order) {
  GridShape g;
  g.dp = dp;
  g.tp = tp;
  g.pp = pp;
  g.cp = cp;
  g.order = GridShape::parse_order(order);
  return g;
}

TEST(GridShape, CoordinatesRoundTripOnFourAxes) {
  for (const char* order : {"tp-cp-dp-pp", "cp-tp-pp-dp", "pp-dp-cp-tp", "tp-dp-pp"}) {
    const GridShape g = shape(2, 3, 2, 2, order);
    std::set<GridCoords> seen;
    for (int r = 0; r < g.world_size(); ++r) {
      const GridCoords c = g.coordinates(r);
      EXPECT_EQ(g.world_rank(c), r) << order;
      seen.insert(c);
    }
    EXPECT_EQ(static_cast<int>(seen.size()), 24) << order;
  }
}

TEST(GridShape, ThreeNamesPutCpRightAfterTp) {
  const GridShape g = shape(2, 2, 2, 2, "tp-dp-pp");
  EXPECT_EQ(g.order_string(), "tp-cp-dp-pp");
  // cp varies right after tp: ranks 0 and 2 are the two cp ranks of tensor rank 0.
  EXPECT_EQ(g.coordinates(2)[axis_index(Axis::Context)], 1);
  EXPECT_EQ(g.coordinates(2)[axis_index(Axis::Data)], 0);
  EXPECT_EQ(shape(2, 2, 2, 1, "tp-cp-dp-pp").order_string(), "tp-dp-pp");
  EXPECT_EQ(shape(2, 2, 2, 2, "dp-tp-pp").order_string(), "dp-tp-cp-pp");
}

TEST(GridShape, RefusesBadOrders) {
  for (const char* bad : {"tp-dp", "tp-dp-pp-xx", "tp-tp-dp-pp", "tp-cp-pp", "tp-dp-pp-cp-dp", ""})
    EXPECT_THROW(GridShape::parse_order(bad), std::invalid_argument) << bad;
}

TEST(GridShape, ReplicaGroupsJoinDataAndContextRanks) {
  const GridShape g = shape(2, 2, 2, 3, "tp-cp-dp-pp");
  const auto groups = g.replica_groups();
  ASSERT_EQ(groups.size(), 4u);  // one per (tp, pp)
  std::set<int> all;
  for (const auto& members : groups) {
    ASSERT_EQ(members.size(), 6u);
    const GridCoords first = g.coordinates(members[0]);
    for (size_t i = 0; i < members.size(); ++i) {
      const GridCoords c = g.coordinates(members[i]);
      EXPECT_EQ(c[axis_index(Axis::Tensor)], first[axis_index(Axis::Tensor)]);
      EXPECT_EQ(c[axis_index(Axis::Pipeline)], first[axis_index(Axis::Pipeline)]);
      EXPECT_EQ(g.replica_rank(c), static_cast<int>(i));
      all.insert(members[i]);
    }
  }
  EXPECT_EQ(static_cast<int>(all.size()), g.world_size());
  // With cp == 1 the replicas are exactly the data groups.
  const GridShape no_cp = shape(4, 2, 1, 1, "tp-dp-pp");
  EXPECT_EQ(no_cp.replica_groups(), no_cp.groups(Axis::Data));
}

// Expert parallelism folds over the replicas: every replica group splits into dp x cp / ep
// expert groups of ep consecutive replica ranks, and into ep expert-data groups, one per expert
// rank; each pair of one expert group and one expert-data group of a replica group meets in
// exactly one rank.
TEST(GridShape, ExpertGroupsFoldOverTheReplicas) {
  GridShape g = shape(4, 2, 2, 2, "tp-cp-dp-pp");
  g.ep = 4;
  const auto experts = g.expert_groups(), data = g.expert_data_groups();
  ASSERT_EQ(experts.size(), 2u * 4u);  // (tp, pp) places x replica groups of 8 / ep
  ASSERT_EQ(data.size(), 4u * 4u);     // (tp, pp) places x ep
  for (const auto& members : experts) {
    ASSERT_EQ(members.size(), 4u);
    const GridCoords first = g.coordinates(members[0]);
    for (size_t i = 0; i < members.size(); ++i) {
      const GridCoords c = g.coordinates(members[i]);
      EXPECT_EQ(c[axis_index(Axis::Tensor)], first[axis_index(Axis::Tensor)]);
      EXPECT_EQ(c[axis_index(Axis::Pipeline)], first[axis_index(Axis::Pipeline)]);
      EXPECT_EQ(g.expert_rank(c), static_cast<int>(i));
      EXPECT_EQ(g.replica_rank(c), g.replica_rank(first) + static_cast<int>(i));
      EXPECT_EQ(g.expert_data_rank(c), g.expert_data_rank(first));
    }
  }
  std::set<int> all;
  for (const auto& members : data) {
    ASSERT_EQ(members.size(), 2u);
    for (size_t i = 0; i < members.size(); ++i) {
      const GridCoords c = g.coordinates(members[i]);
      EXPECT_EQ(g.expert_data_rank(c), static_cast<int>(i));
      EXPECT_EQ(g.expert_rank(c), g.expert_rank(g.coordinates(members[0])));
      all.insert(members[i]);
    }
  }
  EXPECT_EQ(static_cast<int>(all.size()), g.world_size());
  // ep 1: each rank its own expert group; the expert-data groups are the replica groups.
  g.ep = 1;
  EXPECT_EQ(g.expert_data_groups(), g.replica_groups());
  EXPECT_EQ(g.expert_groups().size(), static_cast<size_t>(g.world_size()));
}

}  // namespace
}  // namespace meshtrain
