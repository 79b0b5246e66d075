// The sigmoid router's expert bias (model/expert_bias.h): which layers have one, the update's
// sign and step, and that it follows the loads of the whole job: each rank logs different loads,
// the world-summed report (model/expert_load.h) moves every rank's copy alike, by the sum's
// signs and not by the rank's own. Under mpiexec with 1 and 2 ranks.

#include "meshtrain/model/expert_bias.h"

#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <vector>

#include "meshtrain/comm/mpi_communicator.h"
#include "meshtrain/model/expert_load.h"

namespace meshtrain {
namespace {

ModelSpec moe_model(RouterKind router) {
  ModelSpec m;
  m.layers = 3;
  m.feed_forward = FeedForwardKind::Moe;
  m.moe.experts = 4;
  m.moe.top_k = 2;
  m.moe.router = router;
  m.moe.first_dense_layers = 1;
  return m;
}

TEST(ExpertBias, OnlySigmoidRoutedMixtureLayersHaveOne) {
  EXPECT_TRUE(ExpertBias(ModelSpec{}).empty());
  EXPECT_TRUE(ExpertBias(moe_model(RouterKind::Softmax)).empty());
  const ExpertBias b(moe_model(RouterKind::Sigmoid));
  EXPECT_EQ(b.layers(), (std::vector<int>{1, 2}));
  EXPECT_EQ(b.experts(), 4);
  EXPECT_EQ(b.of_layer(0), nullptr) << "a dense block";
  ASSERT_NE(b.of_layer(2), nullptr);
  for (int e = 0; e < 4; ++e) EXPECT_EQ(b.of_layer(2)[e], 0.0);
  EXPECT_EQ(ExpertBias::name(2), "h.2.mlp.router.expert_bias");
  EXPECT_EQ(moe_model(RouterKind::Sigmoid).moe.bias_update_rate, 0.001) << "DeepSeek-V3's gamma";
}

TEST(ExpertBias, MovesByGammaTowardTheMeanAndStaysAtIt) {
  ExpertBias b(moe_model(RouterKind::Sigmoid));
  // Layer 1: mean 5; expert 0 above, 1 below, 2 and 3 at it. Layer 2: mean 3, reversed.
  const std::vector<double> loads = {12, 0, 4, 4, 0, 6, 3, 3};
  b.update({1, 2}, loads, 0.25);
  EXPECT_EQ(std::vector<double>(b.of_layer(1), b.of_layer(1) + 4), (std::vector<double>{-0.25, 0.25, 0.25, 0.25}));
  EXPECT_EQ(std::vector<double>(b.of_layer(2), b.of_layer(2) + 4), (std::vector<double>{0.25, -0.25, 0.0, 0.0}));
  b.update({1, 2}, loads, 0.25);
  EXPECT_EQ(b.of_layer(1)[0], -0.5) << "steps add up";
  // The report's layers in any order; one of the table missing is a logic error.
  b.update({2, 1}, {0, 6, 3, 3, 12, 0, 4, 4}, 0.25);
  EXPECT_EQ(b.of_layer(1)[0], -0.75);
  EXPECT_EQ(b.of_layer(2)[0], 0.75);
  EXPECT_THROW(b.update({1}, {1, 2, 3, 4}, 0.25), std::logic_error);
}

TEST(ExpertBias, FollowsTheWholeJobsLoadsAlikeOnEveryRank) {
  MpiCommunicator world(MPI_COMM_WORLD, "world", std::chrono::duration<double>(60));
  const ModelSpec m = moe_model(RouterKind::Sigmoid);
  // Rank r's own loads of layer 1 put expert r first, ranks above 0 load expert 3 most: rank
  // 0 alone would lower expert 0's bias; the job's sum lowers expert 3's.
  auto loads_of = [](int rank) {
    return rank == 0 ? std::vector<double>{6, 0, 2, 4} : std::vector<double>{0, 6, 2, 8};
  };
  MoeLog log;
  log.add(1, loads_of(world.rank()), 0.0, 1.0, 0.0, 6.0);
  log.add(2, {3, 3, 3, 3}, 0.0, 1.0, 0.0, 6.0);
  std::vector<double> sums = take_expert_load_sums(log, m);
  MPI_Allreduce(MPI_IN_PLACE, sums.data(), static_cast<int>(sums.size()), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  const ExpertLoadReport report = expert_load_report(sums, m);
  ExpertBias b(m);
  b.update(report.layers, report.tokens, 0.001);
  std::vector<double> sum(4, 0.0);
  for (int r = 0; r < world.size(); ++r)
    for (size_t e = 0; e < 4; ++e) sum[e] += loads_of(r)[e];
  double mean = 0;
  for (double v : sum) mean += v / 4;
  for (size_t e = 0; e < 4; ++e)
    EXPECT_EQ(b.of_layer(1)[e], 0.001 * ((mean > sum[e]) - (mean < sum[e]))) << "expert " << e;
  if (world.size() > 1) {
    EXPECT_EQ(b.of_layer(1)[3], -0.001) << "the job's busiest expert";
  }
  for (int e = 0; e < 4; ++e) EXPECT_EQ(b.of_layer(2)[e], 0.0) << "balanced: no move";
  // Every rank holds the same values.
  std::vector<double> mine(b.of_layer(1), b.of_layer(1) + 4), first = mine;
  MPI_Bcast(first.data(), 4, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  EXPECT_EQ(mine, first);
}

}  // namespace
}  // namespace meshtrain
