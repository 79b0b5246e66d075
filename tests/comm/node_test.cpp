// Node identity (comm/node.h) and the process grid's view of it, under one mpiexec on this host:
// without SLURMD_NODENAME every rank is on this one node; with it set per rank, as the slurmd
// daemons of an emulated cluster set it, the ranks split into those nodes, and the grid counts
// them and names the tensor groups that span them.

#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "meshtrain/comm/node.h"
#include "meshtrain/parallel/process_grid.h"
#include "support/mpi_world.h"

namespace meshtrain {
namespace {

using testing::world_rank;
using testing::world_size;

// Sets SLURMD_NODENAME for the test's life ("" unsets it), restoring what was there before.
class NodeName {
 public:
  explicit NodeName(const std::string& name) {
    if (const char* old = std::getenv("SLURMD_NODENAME")) saved_ = old, had_ = true;
    if (name.empty()) unsetenv("SLURMD_NODENAME");
    else setenv("SLURMD_NODENAME", name.c_str(), 1);
  }
  ~NodeName() {
    if (had_) setenv("SLURMD_NODENAME", saved_.c_str(), 1);
    else unsetenv("SLURMD_NODENAME");
  }

 private:
  std::string saved_;
  bool had_ = false;
};

// Emulated nodes of two ranks each: n1 = {0, 1}, n2 = {2, 3}, ...
std::string emulated_node(int rank) { return "n" + std::to_string(rank / 2 + 1); }

TEST(Node, WithoutSlurmEveryRankIsOnThisHost) {
  NodeName unset("");
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  EXPECT_EQ(node_name(), host);
  const NodeMembership m = node_membership(MPI_COMM_WORLD);
  EXPECT_EQ(m.count, 1);
  EXPECT_EQ(m.local_size, world_size());
  EXPECT_EQ(m.local_rank, world_rank());
  EXPECT_EQ(m.id, 0);
}

TEST(Node, SlurmNodeNamesSplitOneHost) {
  NodeName name(emulated_node(world_rank()));
  EXPECT_EQ(node_name(), emulated_node(world_rank()));
  const NodeMembership m = node_membership(MPI_COMM_WORLD);
  const int n = world_size();
  EXPECT_EQ(m.count, (n + 1) / 2);
  EXPECT_EQ(m.local_rank, world_rank() % 2);
  EXPECT_EQ(m.local_size, world_rank() / 2 * 2 + 1 < n ? 2 : 1);
  EXPECT_EQ(m.id, world_rank() / 2 * 2);  // the node's first rank
}

TEST(Node, GathersStringsOfAnyLength) {
  const std::string mine(static_cast<size_t>(world_rank() * 3), static_cast<char>('a' + world_rank()));
  const std::vector<std::string> all = all_gather_strings(MPI_COMM_WORLD, mine);
  ASSERT_EQ(static_cast<int>(all.size()), world_size());
  for (int r = 0; r < world_size(); ++r)
    EXPECT_EQ(all[static_cast<size_t>(r)], std::string(static_cast<size_t>(r * 3), static_cast<char>('a' + r)));
}

GridShape shape(int dp, int tp, const std::string& order = "tp-dp-pp") {
  GridShape s;
  s.dp = dp;
  s.tp = tp;
  s.order = GridShape::parse_order(order);
  return s;
}

TEST(Node, GridCountsNodesAndKeepsTensorGroupsInside) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks (2 emulated nodes of 2)";
  NodeName name(emulated_node(world_rank()));
  ProcessGrid grid(MPI_COMM_WORLD, shape(2, 2), 60.0);
  EXPECT_EQ(grid.node_count(), 2);
  EXPECT_EQ(grid.local_size(), 2);
  EXPECT_EQ(grid.node_name(), emulated_node(world_rank()));
  EXPECT_EQ(grid.tensor_groups_spanning_nodes(), 0);
  EXPECT_EQ(grid.spanning_tensor_group(), "");
}

TEST(Node, GridNamesTheTensorGroupThatSpansNodes) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks (2 emulated nodes of 2)";
  NodeName name(emulated_node(world_rank()));
  {
    ProcessGrid grid(MPI_COMM_WORLD, shape(1, 4), 60.0);
    EXPECT_EQ(grid.tensor_groups_spanning_nodes(), 1);
    EXPECT_EQ(grid.spanning_tensor_group(), "ranks 0-3 on nodes n1 (ranks 0, 1), n2 (ranks 2, 3)");
  }
  {  // dp fastest: tensor groups {0, 2} and {1, 3}, each across both nodes
    ProcessGrid grid(MPI_COMM_WORLD, shape(2, 2, "dp-tp-pp"), 60.0);
    EXPECT_EQ(grid.tensor_groups_spanning_nodes(), 2);
    EXPECT_EQ(grid.spanning_tensor_group(), "ranks 0, 2 on nodes n1 (rank 0), n2 (rank 2)");
  }
}

}  // namespace
}  // namespace meshtrain
