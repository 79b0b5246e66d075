// Threads per rank from synthetic cpusets (cpu_binding.h): the bindings Open MPI, Slurm and
// Kubernetes produce, and the warning when a binding leaves cores of the node idle.

#include "meshtrain/app/cpu_binding.h"
#include "meshtrain/config/deck_error.h"

#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

namespace meshtrain {
namespace {

// One rank bound to `bound` on a node whose job may use `available`.
RankCpus rank(const char* bound, const char* available, double quota = 0) {
  return RankCpus{parse_cpu_list(bound), parse_cpu_list(available), quota};
}

int total(const std::vector<int>& v) { return std::accumulate(v.begin(), v.end(), 0); }

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(CpuList, ParsesAndFormatsTheKernelsFormat) {
  EXPECT_EQ(parse_cpu_list("0-3,8,10-11\n"), (CpuSet{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(format_cpu_list(parse_cpu_list("0-3,8,10-11")), "0-3,8,10-11");
  EXPECT_EQ(parse_cpu_list(" 5 "), (CpuSet{5}));
  EXPECT_EQ(parse_cpu_list("3,1,2,1"), (CpuSet{1, 2, 3}));
  EXPECT_TRUE(parse_cpu_list("").empty());
  EXPECT_EQ(format_cpu_list({}), "");
  for (const char* bad : {"a", "3-1", "1,", "1--2", "-1", "0-", "0,,1"})
    EXPECT_THROW(parse_cpu_list(bad), std::invalid_argument) << bad;
}

TEST(CpuList, ParsesCgroupCpuMax) {
  EXPECT_EQ(parse_cpu_max("max 100000\n"), 0.0);
  EXPECT_DOUBLE_EQ(parse_cpu_max("250000 100000"), 2.5);
  for (const char* bad : {"", "max", "1 0", "x 100000"})
    EXPECT_THROW(parse_cpu_max(bad), std::invalid_argument) << bad;
}

TEST(CpuList, RankCpusSurviveTheNodeGather) {
  const RankCpus r = rank("0,2-3", "0-7", 2.5);
  const RankCpus back = decode_rank_cpus(encode_rank_cpus(r));
  EXPECT_EQ(back.bound, r.bound);
  EXPECT_EQ(back.available, r.available);
  EXPECT_DOUBLE_EQ(back.quota, 2.5);
  EXPECT_THROW(decode_rank_cpus("0-1"), std::invalid_argument);
}

// A 2-socket node, 8 cores a socket: Open MPI's default for more than two ranks binds each rank
// to its socket, two ranks a socket. Each socket's 8 cores are split between its two ranks;
// taking the cpuset as the rank's own would run 8 threads on 4 cores' worth.
TEST(NodeCpuShare, RanksSharingASocketSplitIt) {
  const NodeCpuShare s = share_node_cpus({rank("0-7", "0-15"), rank("0-7", "0-15"),
                                          rank("8-15", "0-15"), rank("8-15", "0-15")});
  EXPECT_EQ(s.threads, (std::vector<int>{4, 4, 4, 4}));
  EXPECT_EQ(s.sharing, (std::vector<int>{2, 2, 2, 2}));
  EXPECT_EQ(s.unused, 0);
  EXPECT_EQ(idle_cores_warning(s, Launcher::OpenMpi), "");
}

// All four ranks bound to socket 0: they split it, and socket 1 sits idle, which only the
// launcher can fix.
TEST(NodeCpuShare, FourRanksOnOneSocketOfTwoWarn) {
  const NodeCpuShare s = share_node_cpus({rank("0-7", "0-15"), rank("0-7", "0-15"),
                                          rank("0-7", "0-15"), rank("0-7", "0-15")});
  EXPECT_EQ(s.threads, (std::vector<int>{2, 2, 2, 2}));
  EXPECT_EQ(s.sharing, (std::vector<int>{4, 4, 4, 4}));
  EXPECT_EQ(s.idle, parse_cpu_list("8-15"));
  EXPECT_EQ(s.usable, 16);
  EXPECT_EQ(s.unused, 8);
  const std::string w = idle_cores_warning(s, Launcher::OpenMpi);
  EXPECT_TRUE(contains(w, "leaves 8 of 16 core(s) of this node idle")) << w;
  EXPECT_TRUE(contains(w, "4 rank(s) bound to core(s) 0-7 of 0-15")) << w;
  EXPECT_TRUE(contains(w, "`mpirun --bind-to none`")) << w;
  EXPECT_TRUE(contains(w, "--map-by slot:PE=4")) << w;
}

// Unbound ranks (affinity = the whole machine) share it as before: 8 cores over 3 ranks is
// 3 + 3 + 2, every rank computing the same split.
TEST(NodeCpuShare, UnboundRanksShareTheNode) {
  const NodeCpuShare s =
      share_node_cpus({rank("0-7", "0-7"), rank("0-7", "0-7"), rank("0-7", "0-7")});
  EXPECT_EQ(s.threads, (std::vector<int>{3, 3, 2}));
  EXPECT_EQ(total(s.threads), 8);
  EXPECT_EQ(s.unused, 0);
  EXPECT_EQ(idle_cores_warning(s, Launcher::OpenMpi), "");
  // An unreadable affinity counts as unbound.
  EXPECT_EQ(share_node_cpus({rank("", "0-3"), rank("", "0-3")}).threads,
            (std::vector<int>{2, 2}));
}

TEST(NodeCpuShare, DisjointBindingsAreTheRanksOwn) {
  const NodeCpuShare s = share_node_cpus({rank("0-1", "0-7"), rank("2-3", "0-7"),
                                          rank("4-5", "0-7"), rank("6-7", "0-7")});
  EXPECT_EQ(s.threads, (std::vector<int>{2, 2, 2, 2}));
  EXPECT_EQ(s.sharing, (std::vector<int>{1, 1, 1, 1}));
  EXPECT_EQ(s.unused, 0);
  // `--map-by core` with two ranks on four cores: two cores idle.
  const NodeCpuShare two = share_node_cpus({rank("0", "0-3"), rank("1", "0-3")});
  EXPECT_EQ(two.threads, (std::vector<int>{1, 1}));
  EXPECT_EQ(two.unused, 2);
  EXPECT_TRUE(contains(idle_cores_warning(two, Launcher::OpenMpi), "--map-by slot:PE=2"));
}

TEST(NodeCpuShare, OverlappingBindingsSplitTheOverlap) {
  // 0-3 are rank 0's, 6-9 rank 1's, 4-5 shared: 4 + 2 x 1/2 = 5 each.
  const NodeCpuShare s = share_node_cpus({rank("0-5", "0-9"), rank("4-9", "0-9")});
  EXPECT_EQ(s.threads, (std::vector<int>{5, 5}));
  EXPECT_EQ(s.sharing, (std::vector<int>{2, 2}));
  EXPECT_EQ(s.unused, 0);
}

// `mpirun -np 1` binds its rank to one core: on a 2-core machine half of it is idle.
TEST(NodeCpuShare, OneRankBoundToOneOfTwoCoresWarns) {
  const NodeCpuShare s = share_node_cpus({rank("0", "0-1")});
  EXPECT_EQ(s.threads, (std::vector<int>{1}));
  EXPECT_EQ(s.unused, 1);
  const std::string w = idle_cores_warning(s, Launcher::OpenMpi);
  EXPECT_TRUE(contains(w, "leaves 1 of 2 core(s) of this node idle (1 rank(s) bound to core(s) 0 of 0-1)")) << w;
  EXPECT_TRUE(contains(w, "started by Open MPI mpirun")) << w;
  EXPECT_TRUE(contains(w, "`mpirun --bind-to none` (or `--map-by slot:PE=2`")) << w;
  const std::string slurm = idle_cores_warning(s, Launcher::Slurm);
  EXPECT_TRUE(contains(slurm, "`srun --cpus-per-task=2` (or `--cpu-bind=none`)")) << slurm;
  EXPECT_TRUE(contains(idle_cores_warning(s, Launcher::Hydra), "-bind-to none"));
  EXPECT_TRUE(contains(idle_cores_warning(s, Launcher::Unknown), "2 core(s)"));
}

// Ranks outnumber cores: at least one thread each.
TEST(NodeCpuShare, EveryRankGetsAThread) {
  const NodeCpuShare s = share_node_cpus(
      {rank("0", "0"), rank("0", "0"), rank("0", "0"), rank("0", "0")});
  EXPECT_EQ(s.threads, (std::vector<int>{1, 1, 1, 1}));
  EXPECT_EQ(s.sharing, (std::vector<int>{4, 4, 4, 4}));
  EXPECT_EQ(s.unused, 0);
}

// A Kubernetes CPU limit is a cgroup quota, not a cpuset: the pod sees all 64 cores but may
// keep only 8 busy. The quota caps the node's threads, and no core counts as idle.
TEST(NodeCpuShare, CgroupQuotaCapsTheNode) {
  std::vector<RankCpus> ranks(4, rank("0-63", "0-63", 8.0));
  const NodeCpuShare s = share_node_cpus(ranks);
  EXPECT_EQ(s.threads, (std::vector<int>{2, 2, 2, 2}));
  EXPECT_EQ(s.usable, 8);
  EXPECT_EQ(s.unused, 0);
  // A fractional limit rounds down, but never below a thread a rank.
  EXPECT_EQ(share_node_cpus({rank("0-63", "0-63", 2.5), rank("0-63", "0-63", 2.5)}).threads,
            (std::vector<int>{1, 1}));
  // Bound to 1 core under a limit of 4: 3 of the 4 usable cores idle.
  const NodeCpuShare bound = share_node_cpus({rank("0", "0-63", 4.0)});
  EXPECT_EQ(bound.unused, 3);
  EXPECT_TRUE(contains(idle_cores_warning(bound, Launcher::OpenMpi), "CPU quota 4")) ;
}

TEST(ChooseThreads, DeckThenEnvironmentThenCores) {
  const NodeCpuShare s = share_node_cpus({rank("0-7", "0-7"), rank("0-7", "0-7")});
  EXPECT_EQ(choose_threads(3, "5", s, 0).threads, 3);
  EXPECT_EQ(choose_threads(3, "5", s, 0).source, "run.threads");
  EXPECT_EQ(choose_threads(0, "5", s, 0).threads, 5);
  EXPECT_EQ(choose_threads(0, "5", s, 0).source, "OMP_NUM_THREADS");
  for (const char* env : {static_cast<const char*>(nullptr), "", "0", "abc"}) {
    EXPECT_EQ(choose_threads(0, env, s, 1).threads, 4);
    EXPECT_EQ(choose_threads(0, env, s, 1).source, "cores");
  }
}

// OMP_NUM_THREADS=100000 segfaulted in the OpenMP runtime: beyond kMaxThreads it is refused with
// the accepted range, whichever source wins (the runtime and OpenBLAS read it themselves).
TEST(ChooseThreads, RefusesOmpNumThreadsBeyondTheCap) {
  const NodeCpuShare s = share_node_cpus({rank("0-7", "0-7")});
  EXPECT_EQ(choose_threads(0, "1024", s, 0).threads, 1024);
  EXPECT_EQ(choose_threads(0, "8,4", s, 0).threads, 8);  // OpenMP's list: the outer level
  for (const char* env : {"1025", "100000", "99999999999999999999", "100000,2"}) {
    for (int configured : {0, 3}) {
      try {
        choose_threads(configured, env, s, 0);
        ADD_FAILURE() << "OMP_NUM_THREADS=" << env << " was taken";
      } catch (const DeckError& e) {
        EXPECT_NE(std::string(e.what()).find(std::string("OMP_NUM_THREADS=") + env +
                                             ": more threads than meshtrain runs in one process "
                                             "(expected an integer from 1 to 1024"),
                  std::string::npos)
            << e.what();
      }
    }
  }
}

TEST(DetectLauncher, ParentFirstThenEnvironment) {
  auto env_of = [](std::map<std::string, std::string> vars) {
    return [vars](const char* name) -> const char* {
      auto it = vars.find(name);
      return it == vars.end() ? nullptr : it->second.c_str();
    };
  };
  const auto none = env_of({});
  EXPECT_EQ(detect_launcher(none, "orted"), Launcher::OpenMpi);
  EXPECT_EQ(detect_launcher(none, "prted"), Launcher::OpenMpi);
  EXPECT_EQ(detect_launcher(none, "slurmstepd"), Launcher::Slurm);
  EXPECT_EQ(detect_launcher(none, "hydra_pmi_proxy"), Launcher::Hydra);
  EXPECT_EQ(detect_launcher(none, "bash"), Launcher::Unknown);
  // mpirun inside a Slurm allocation: its daemons come from srun, its ranks carry both.
  EXPECT_EQ(detect_launcher(env_of({{"SLURM_STEP_ID", "0"}, {"OMPI_MCA_orte_hnp_uri", "1.0;tcp://x"}}),
                            "bash"),
            Launcher::OpenMpi);
  EXPECT_EQ(detect_launcher(env_of({{"SLURM_STEP_ID", "0"}, {"SLURM_PROCID", "3"}}), "bash"),
            Launcher::Slurm);
  EXPECT_EQ(detect_launcher(env_of({{"OMPI_COMM_WORLD_SIZE", "4"}}), "bash"), Launcher::OpenMpi);
  EXPECT_EQ(detect_launcher(env_of({{"PMI_RANK", "0"}}), "bash"), Launcher::Hydra);
}

}  // namespace
}  // namespace meshtrain
