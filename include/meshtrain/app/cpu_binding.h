#pragma once
// How many kernel threads each rank of a node runs, from the cores that rank is bound to and the
// cores the other ranks of its node are bound to; and whether the launcher's binding leaves cores
// of the node idle, with the launcher flag that fixes it. Not the gathering itself (that is
// collective over the node: run_setup.cpp) and not OpenMP's own thread placement.
//
// Why gather: a rank's cpuset alone does not say whether it is "ours alone". Open MPI binds more
// than two ranks per node to a whole socket by default, so on a 2-socket node with 4 ranks two
// ranks share each socket's cpuset: a rank that took its whole cpuset would run twice as many
// threads as cores. And `mpirun -np 1` binds its one rank to one core: on a 2-core machine half
// of it sits idle, which no thread count fixes (threads inherit the binding).
//
// The rule: every core of the node that some rank is bound to is divided equally among the ranks
// bound to it, so a rank's share is the sum over its cores of 1 / (ranks bound to that core).
// Identical sets split evenly, disjoint sets are their ranks' own, overlapping sets split the
// overlap. Shares are rounded so that the node runs one thread per bound core (largest
// remainder, ties to the lower node rank: every rank computes the same answer) and never fewer
// than one thread per rank. A cgroup CPU quota (a Kubernetes CPU limit) caps the node's total.
// "Cores" are the logical CPUs the kernel schedules (hyperthreads count).

#include <mpi.h>

#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace meshtrain {

// Logical CPU numbers, ascending, no duplicates.
using CpuSet = std::vector<int>;

// The kernel's list format ("0-3,8,10-11", as in /proc/self/status Cpus_allowed_list and cgroup
// cpuset files); "" is the empty set. Throws std::invalid_argument naming the text when it is
// not one.
CpuSet parse_cpu_list(std::string_view text);
std::string format_cpu_list(const CpuSet& cpus);

// cgroup v2 cpu.max ("max 100000" or "200000 100000"): the quota in cores, 0 when unlimited.
// Throws std::invalid_argument on anything else.
double parse_cpu_max(std::string_view text);

// What one rank sees of its node's CPUs.
struct RankCpus {
  CpuSet bound;        // the cores this rank may run on (its affinity: the launcher's binding)
  CpuSet available;    // the cores its job may use on the node (cgroup cpuset, else online CPUs)
  double quota = 0;    // cgroup CPU quota in cores (0: none)
};

// One line, parsed back by decode_rank_cpus ("0|0-1|0"); what the node gather carries.
std::string encode_rank_cpus(const RankCpus& cpus);
RankCpus decode_rank_cpus(std::string_view text);

// The division of one node's cores among its ranks (indexed by node rank).
struct NodeCpuShare {
  std::vector<int> threads;  // threads per rank
  std::vector<int> sharing;  // per rank: the most ranks bound to any one of its cores
  CpuSet available;          // the union of the ranks' available and bound cores
  CpuSet bound;              // the union of the ranks' bound cores
  CpuSet idle;               // available cores no rank is bound to
  double quota = 0;          // the smallest quota a rank reported (0: none)
  int usable = 0;            // cores the node's ranks could keep busy: available, capped by quota
  int unused = 0;            // of those, how many the binding leaves idle (0: nothing to fix)
};
NodeCpuShare share_node_cpus(const std::vector<RankCpus>& ranks);

// Which launcher started the ranks: from the parent process's command name ("orted", "prted",
// "slurmstepd", "hydra_pmi_proxy"), else from the environment the launcher leaves its ranks
// (Open MPI's OMPI_MCA_orte_* before Slurm's SLURM_STEP_ID: mpirun inside an allocation starts
// its daemons with srun, so its ranks carry both).
enum class Launcher { OpenMpi, Slurm, Hydra, Unknown };
using EnvLookup = std::function<const char*(const char*)>;
Launcher detect_launcher(const EnvLookup& env, std::string_view parent_command);
Launcher detect_launcher();  // this process
std::string_view launcher_name(Launcher launcher);

// The flags of `launcher` that let `ranks` ranks use `cores` cores of a node, e.g. for Open MPI
// "`mpirun --bind-to none` (or `--map-by slot:PE=2`)".
std::string binding_fix(Launcher launcher, int ranks, int cores);

// The start-up warning for a node whose binding leaves cores idle ("" when it leaves none), e.g.
// "the CPU binding leaves 1 of 2 core(s) of this node idle (1 rank(s) bound to core(s) 0 of 0-1):
// threads cannot leave their rank's cores; rerun with `mpirun --bind-to none` ...".
std::string idle_cores_warning(const NodeCpuShare& share, Launcher launcher);

// OMP_NUM_THREADS's count (its list's first entry), 0 when unset or not a positive number (the
// OpenMP runtime ignores it then too); throws DeckError naming the value and the accepted range
// when it exceeds kMaxThreads (backend/thread_limit.h).
int omp_num_threads_value(const char* omp_num_threads);

// Threads for one rank, in order of precedence: run.threads (> 0), OMP_NUM_THREADS (a positive
// number), else the rank's share of its node's cores. `source` says which. Throws DeckError for
// an OMP_NUM_THREADS beyond kMaxThreads, whichever source wins.
struct ThreadChoice {
  int threads = 1;
  std::string source;  // "run.threads", "OMP_NUM_THREADS" or "cores"
};
ThreadChoice choose_threads(int configured, const char* omp_num_threads, const NodeCpuShare& share,
                            int node_rank);

// This process's view (affinity, cgroup cpuset and quota, online CPUs). Never throws: what cannot
// be read is left out (an unreadable affinity becomes the available set).
RankCpus probe_rank_cpus();
// Collective over `node` (the ranks of one node, comm/node.h split_by_node): the cores those
// ranks may keep busy together, from every rank's binding and cgroup (share_node_cpus), at least 1.
int node_usable_cores(MPI_Comm node);

}  // namespace meshtrain
