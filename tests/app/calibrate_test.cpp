// `bench --suite calibrate` in process, on the ranks this test runs on: the profile rank 0
// writes reads back (read_machine_profile) with positive rates and alpha >= 0; intra-node links
// on 2+ ranks of one node, inter-node ones on 2 emulated nodes, none on one rank (and pricing a
// collective then says why); two passes say so in the notes; a missing directory is refused
// before anything is measured, on every rank, naming the path.

#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "meshtrain/app/bench_suites.h"
#include "meshtrain/comm/agreement.h"
#include "meshtrain/config/deck_error.h"
#include "meshtrain/config/machine_profile.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

int world_size() {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

// One directory for the whole job: rank 0's process id, shared.
std::string job_directory() {
  int id = static_cast<int>(getpid());
  MPI_Bcast(&id, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return (fs::temp_directory_path() / ("meshtrain-calibrate-" + std::to_string(id))).string();
}

// One pass keeps the tests short; the first test takes two, for the median over passes.
BenchArgs calibrate_args(const std::string& out, int passes = 1) {
  BenchArgs args;
  args.suite = "calibrate";
  args.threads = 1;
  args.steps = 3;
  args.out = out;
  args.passes = passes;
  return args;
}

TEST(Calibrate, WritesAProfileThatReadsBack) {
  const std::string dir = job_directory();
  if (world_rank() == 0) {
    fs::create_directories(dir);
    std::ofstream(dir + "/machine.toml") << "an old profile\n";  // replaced whole
  }
  MPI_Barrier(MPI_COMM_WORLD);
  BenchReport report;
  bench_calibrate(calibrate_args(dir + "/machine.toml", 2), report);
  EXPECT_EQ(report.wrong(), 0);

  const MachineProfile p = read_machine_profile(dir + "/machine.toml");
  EXPECT_EQ(p.source, "measured");
  EXPECT_EQ(p.device, "cpu");
  EXPECT_EQ(p.threads_per_rank, 1);
  EXPECT_GE(p.ranks_per_node, 1);
  EXPECT_GE(p.cores_per_node, 1);
  EXPECT_GT(p.memory_per_rank, 0);
  EXPECT_GT(p.memory_bytes_per_s, 0);
  EXPECT_NE(p.notes.find("calibrate"), std::string::npos) << p.notes;
  EXPECT_NE(p.notes.find("median of 2 pass(es)"), std::string::npos) << p.notes;
  ASSERT_TRUE(p.gemm_fp32.has_value());
  for (const GemmRates* g : {&*p.gemm_fp32, p.gemm_bf16 ? &*p.gemm_bf16 : nullptr}) {
    if (!g) continue;
    EXPECT_GT(g->peak, 0);
    ASSERT_FALSE(g->flops.empty());
    for (double f : g->flops) {
      EXPECT_GT(f, 0);
      EXPECT_LE(f, g->peak);
    }
    EXPECT_GT(g->seconds(768, 768, 768), 0);
  }
  EXPECT_FALSE(p.has_inter_node());  // every rank of this test runs on one host
  if (world_size() >= 2) {
    for (int c = 0; c < kCollectiveKinds; ++c) {
      ASSERT_TRUE(p.intra_node[c].has_value()) << c;
      EXPECT_GE(p.intra_node[c]->alpha, 0);
      EXPECT_GT(p.intra_node[c]->bus_bytes_per_s, 0);
    }
    // Inter-node collectives are priced at the intra-node link on a one-node measurement.
    EXPECT_GT(p.link(LinkClass::InterNode, CollectiveKind::AllReduce)
                  .seconds(CollectiveKind::AllReduce, 1 << 20, world_size()), 0);
  } else {
    for (int c = 0; c < kCollectiveKinds; ++c) EXPECT_FALSE(p.intra_node[c].has_value());
    EXPECT_THROW(p.link(LinkClass::IntraNode, CollectiveKind::AllReduce), DeckError);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) fs::remove_all(dir);
}

// Two ranks on two emulated nodes (SLURMD_NODENAME per rank, as comm/node.h reads it): the
// links measured are the inter-node ones, and no intra-node group has 2 ranks.
TEST(Calibrate, AcrossTwoNodesMeasuresTheInterNodeLinks) {
  if (world_size() != 2) GTEST_SKIP() << "needs exactly 2 ranks (one per emulated node)";
  const char* old = std::getenv("SLURMD_NODENAME");
  const std::string saved = old ? old : "";
  setenv("SLURMD_NODENAME", ("n" + std::to_string(world_rank() + 1)).c_str(), 1);
  const std::string dir = job_directory();
  if (world_rank() == 0) fs::create_directories(dir);
  MPI_Barrier(MPI_COMM_WORLD);
  BenchReport report;
  bench_calibrate(calibrate_args(dir + "/two-nodes.toml"), report);
  if (old) setenv("SLURMD_NODENAME", saved.c_str(), 1);
  else unsetenv("SLURMD_NODENAME");
  EXPECT_EQ(report.wrong(), 0);

  const MachineProfile p = read_machine_profile(dir + "/two-nodes.toml");
  EXPECT_EQ(p.ranks_per_node, 1);
  EXPECT_TRUE(p.has_inter_node());
  for (int c = 0; c < kCollectiveKinds; ++c) {
    EXPECT_FALSE(p.intra_node[c].has_value()) << c;
    ASSERT_TRUE(p.inter_node[c].has_value()) << c;
    EXPECT_GE(p.inter_node[c]->alpha, 0);
    EXPECT_GT(p.inter_node[c]->bus_bytes_per_s, 0);
  }
  EXPECT_THROW(p.link(LinkClass::IntraNode, CollectiveKind::AllGather), DeckError);
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) fs::remove_all(dir);
}

TEST(Calibrate, RefusesAMissingDirectoryOnEveryRankBeforeMeasuring) {
  const std::string out = job_directory() + "-missing/sub/machine.toml";
  BenchReport report;
  try {
    bench_calibrate(calibrate_args(out), report);
    FAIL() << "calibrate wrote into a missing directory";
  } catch (const AgreedError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(out), std::string::npos) << what;
    EXPECT_NE(what.find("does not exist"), std::string::npos) << what;
  }
  EXPECT_FALSE(fs::exists(out));
}

}  // namespace
}  // namespace meshtrain
