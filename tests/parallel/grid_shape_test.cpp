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

}  // namespace
}  // namespace meshtrain
