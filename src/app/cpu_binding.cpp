#include "meshtrain/app/cpu_binding.h"

#include "meshtrain/backend/thread_limit.h"
#include "meshtrain/comm/node.h"
#include "meshtrain/config/deck_error.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <numeric>
#include <sstream>
#include <stdexcept>

namespace meshtrain {

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

bool parse_int(std::string_view s, long& out) {
  if (s.empty() || s.size() > 18) return false;
  long v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  out = v;
  return true;
}

CpuSet set_union(const CpuSet& a, const CpuSet& b) {
  CpuSet out;
  std::set_union(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
  return out;
}

CpuSet set_difference(const CpuSet& a, const CpuSet& b) {
  CpuSet out;
  std::set_difference(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
  return out;
}

// Splits `total` into integers proportional to `weights` (largest remainder; ties to the lower
// index), then raises every part to at least 1.
std::vector<int> apportion(const std::vector<double>& weights, int total) {
  const size_t n = weights.size();
  const double sum = std::accumulate(weights.begin(), weights.end(), 0.0);
  std::vector<int> parts(n, 0);
  if (sum > 0 && total > 0) {
    std::vector<double> frac(n);
    int given = 0;
    for (size_t i = 0; i < n; ++i) {
      const double exact = weights[i] * total / sum;
      parts[i] = static_cast<int>(std::floor(exact + 1e-9));
      frac[i] = exact - parts[i];
      given += parts[i];
    }
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return frac[a] > frac[b] + 1e-9; });
    for (size_t k = 0; k < n && given < total; ++k, ++given) ++parts[order[k]];
  }
  for (int& p : parts) p = std::max(p, 1);
  return parts;
}

std::string read_first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (in) std::getline(in, line);
  return line;
}

bool file_exists(const std::string& path) { return access(path.c_str(), R_OK) == 0; }

// The cgroup of this process per hierarchy: "" -> the v2 path; "cpuset", "cpu" -> v1 paths.
std::map<std::string, std::string> own_cgroups() {
  std::map<std::string, std::string> out;
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    std::stringstream names(controllers);
    std::string name;
    if (controllers.empty()) out[""] = path;
    while (std::getline(names, name, ',')) out[name] = path;
  }
  return out;
}

// `root` + `path` and its ancestors up to `root`, leaf first. In a container the path may name
// the host's hierarchy, which the container does not see: its root is then its own cgroup.
std::vector<std::string> cgroup_dirs(const std::string& root, std::string path) {
  std::vector<std::string> dirs;
  while (!path.empty() && path != "/") {
    dirs.push_back(root + path);
    path.erase(path.find_last_of('/'));
  }
  dirs.push_back(root);
  return dirs;
}

CpuSet probe_available() {
  const auto groups = own_cgroups();
  std::vector<std::string> candidates;
  if (auto it = groups.find(""); it != groups.end())
    for (const std::string& d : cgroup_dirs("/sys/fs/cgroup", it->second))
      candidates.push_back(d + "/cpuset.cpus.effective");
  if (auto it = groups.find("cpuset"); it != groups.end())
    for (const std::string& d : cgroup_dirs("/sys/fs/cgroup/cpuset", it->second)) {
      candidates.push_back(d + "/cpuset.effective_cpus");
      candidates.push_back(d + "/cpuset.cpus");
    }
  candidates.push_back("/sys/devices/system/cpu/online");
  for (const std::string& path : candidates) {
    if (!file_exists(path)) continue;
    try {
      CpuSet cpus = parse_cpu_list(read_first_line(path));
      if (!cpus.empty()) return cpus;
    } catch (const std::invalid_argument&) {
    }
  }
  return {};
}

double probe_quota() {
  const auto groups = own_cgroups();
  double quota = 0;
  auto take = [&](double q) {
    if (q > 0 && (quota == 0 || q < quota)) quota = q;
  };
  if (auto it = groups.find(""); it != groups.end())
    for (const std::string& d : cgroup_dirs("/sys/fs/cgroup", it->second)) try {
        if (file_exists(d + "/cpu.max")) take(parse_cpu_max(read_first_line(d + "/cpu.max")));
      } catch (const std::invalid_argument&) {
      }
  if (auto it = groups.find("cpu"); it != groups.end())
    for (const char* root : {"/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"})
      for (const std::string& d : cgroup_dirs(root, it->second)) {
        const std::string q = read_first_line(d + "/cpu.cfs_quota_us");
        const std::string p = read_first_line(d + "/cpu.cfs_period_us");
        const double qv = std::atof(q.c_str()), pv = std::atof(p.c_str());
        if (qv > 0 && pv > 0) take(qv / pv);
      }
  return quota;
}

CpuSet probe_affinity() {
  constexpr int kMaxCpus = 8192;
  cpu_set_t* set = CPU_ALLOC(kMaxCpus);
  const size_t size = CPU_ALLOC_SIZE(kMaxCpus);
  CpuSet cpus;
  if (set && sched_getaffinity(0, size, set) == 0)
    for (int c = 0; c < kMaxCpus; ++c)
      if (CPU_ISSET_S(c, size, set)) cpus.push_back(c);
  if (set) CPU_FREE(set);
  return cpus;
}

std::string parent_command() {
  std::string name = read_first_line("/proc/" + std::to_string(getppid()) + "/comm");
  return std::string(trim(name));
}

}  // namespace

CpuSet parse_cpu_list(std::string_view text) {
  const std::string_view all = trim(text);
  CpuSet cpus;
  std::string_view rest = all;
  auto bad = [&] {
    return std::invalid_argument("'" + std::string(all) +
                                 "' is not a CPU list (expected e.g. \"0-3,8,10-11\")");
  };
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view item = trim(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    if (comma != std::string_view::npos && rest.empty()) throw bad();
    const size_t dash = item.find('-');
    long lo = 0, hi = 0;
    if (!parse_int(item.substr(0, dash), lo)) throw bad();
    hi = lo;
    if (dash != std::string_view::npos && !parse_int(item.substr(dash + 1), hi)) throw bad();
    if (hi < lo || hi >= (1 << 20)) throw bad();
    for (long c = lo; c <= hi; ++c) cpus.push_back(static_cast<int>(c));
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

std::string format_cpu_list(const CpuSet& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(cpus[i]);
    if (j > i) out += '-' + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out;
}

double parse_cpu_max(std::string_view text) {
  const std::string_view t = trim(text);
  const size_t space = t.find(' ');
  const std::string_view quota = t.substr(0, space);
  long q = 0, period = 0;
  if (space == std::string_view::npos || !parse_int(trim(t.substr(space + 1)), period) ||
      period <= 0 || (quota != "max" && !parse_int(quota, q)))
    throw std::invalid_argument("'" + std::string(t) +
                                "' is not a cgroup cpu.max (expected \"max 100000\" or "
                                "\"200000 100000\")");
  return quota == "max" ? 0.0 : static_cast<double>(q) / static_cast<double>(period);
}

std::string encode_rank_cpus(const RankCpus& cpus) {
  char quota[32];
  std::snprintf(quota, sizeof quota, "%.6g", cpus.quota);
  return format_cpu_list(cpus.bound) + "|" + format_cpu_list(cpus.available) + "|" + quota;
}

RankCpus decode_rank_cpus(std::string_view text) {
  const size_t a = text.find('|'), b = a == std::string_view::npos ? a : text.find('|', a + 1);
  if (b == std::string_view::npos)
    throw std::invalid_argument("'" + std::string(text) + "' is not a rank's CPUs (bound|available|quota)");
  RankCpus out;
  out.bound = parse_cpu_list(text.substr(0, a));
  out.available = parse_cpu_list(text.substr(a + 1, b - a - 1));
  out.quota = std::atof(std::string(text.substr(b + 1)).c_str());
  return out;
}

NodeCpuShare share_node_cpus(const std::vector<RankCpus>& ranks) {
  NodeCpuShare s;
  const size_t n = ranks.size();
  std::map<int, int> holders;  // core -> ranks bound to it
  for (const RankCpus& r : ranks) {
    const CpuSet& bound = r.bound.empty() ? r.available : r.bound;
    s.available = set_union(s.available, set_union(r.available, bound));
    s.bound = set_union(s.bound, bound);
    for (int c : bound) ++holders[c];
    if (r.quota > 0 && (s.quota == 0 || r.quota < s.quota)) s.quota = r.quota;
  }
  std::vector<double> share(n, 0.0);
  s.sharing.assign(n, 0);
  for (size_t i = 0; i < n; ++i)
    for (int c : ranks[i].bound.empty() ? ranks[i].available : ranks[i].bound) {
      share[i] += 1.0 / holders[c];
      s.sharing[i] = std::max(s.sharing[i], holders[c]);
    }
  const int cap = s.quota > 0 ? std::max(1, static_cast<int>(std::floor(s.quota + 1e-9)))
                              : static_cast<int>(s.available.size());
  s.usable = std::min(static_cast<int>(s.available.size()), cap);
  s.threads = apportion(share, std::min(static_cast<int>(s.bound.size()), cap));
  s.idle = set_difference(s.available, s.bound);
  s.unused = std::max(0, s.usable - static_cast<int>(s.bound.size()));
  return s;
}

Launcher detect_launcher(const EnvLookup& env, std::string_view parent) {
  // The parent process names the launcher even where its environment is inherited from another
  // (mpirun inside a Slurm allocation: its daemons are started by srun).
  if (parent == "orted" || parent == "prted" || parent == "mpirun" || parent == "mpiexec" ||
      parent == "orterun" || parent == "prterun")
    return Launcher::OpenMpi;
  if (parent == "slurmstepd") return Launcher::Slurm;
  if (parent == "hydra_pmi_proxy") return Launcher::Hydra;
  auto set = [&](const char* name) {
    const char* v = env(name);
    return v && *v;
  };
  if (set("OMPI_MCA_orte_hnp_uri") || set("OMPI_MCA_orte_launch") || set("PRTE_LAUNCHED"))
    return Launcher::OpenMpi;
  if (set("SLURM_STEP_ID") || set("SLURM_STEPID")) return Launcher::Slurm;
  if (set("OMPI_COMM_WORLD_SIZE")) return Launcher::OpenMpi;
  if (set("PMI_RANK") || set("MPI_LOCALRANKID")) return Launcher::Hydra;
  return Launcher::Unknown;
}

std::string_view launcher_name(Launcher launcher) {
  switch (launcher) {
    case Launcher::OpenMpi: return "Open MPI mpirun";
    case Launcher::Slurm: return "Slurm srun";
    case Launcher::Hydra: return "MPICH/Intel MPI mpiexec (Hydra)";
    case Launcher::Unknown: break;
  }
  return "an unrecognised launcher";
}

std::string binding_fix(Launcher launcher, int ranks, int cores) {
  const std::string per_rank = std::to_string(std::max(1, cores / std::max(1, ranks)));
  switch (launcher) {
    case Launcher::OpenMpi:
      return "`mpirun --bind-to none` (or `--map-by slot:PE=" + per_rank +
             "`: " + per_rank + " core(s) per rank)";
    case Launcher::Slurm:
      return "`srun --cpus-per-task=" + per_rank + "` (or `--cpu-bind=none`)";
    case Launcher::Hydra:
      return "`mpiexec -bind-to none` (Intel MPI: I_MPI_PIN=0)";
    case Launcher::Unknown: break;
  }
  return "the launcher's option to bind each rank to " + per_rank + " core(s), or not at all";
}

std::string idle_cores_warning(const NodeCpuShare& share, Launcher launcher) {
  if (share.unused <= 0) return "";
  const int ranks = static_cast<int>(share.threads.size());
  std::string s = "the CPU binding leaves " + std::to_string(share.unused) + " of " +
                  std::to_string(share.usable) + " core(s) of this node idle (" +
                  std::to_string(ranks) + " rank(s) bound to core(s) " +
                  format_cpu_list(share.bound) + " of " + format_cpu_list(share.available);
  if (share.quota > 0) {
    char q[32];
    std::snprintf(q, sizeof q, "%g", share.quota);
    s += std::string(", CPU quota ") + q;
  }
  s += "): a rank's threads run only on its cores; started by " +
       std::string(launcher_name(launcher)) + ", rerun with " +
       binding_fix(launcher, ranks, share.usable);
  return s;
}

int omp_num_threads_value(const char* omp_num_threads) {
  if (!omp_num_threads || !*omp_num_threads) return 0;
  // OpenMP reads a list ("8,4": 8 at the outer level); the first entry is this rank's count.
  const std::string text(omp_num_threads);
  const std::string first = text.substr(0, text.find(','));
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(first.c_str(), &end, 10);
  if (end == first.c_str() || *end != '\0' || v <= 0) return 0;  // not a count: OpenMP ignores it too
  if (errno == ERANGE || v > kMaxThreads)
    throw DeckError("OMP_NUM_THREADS=" + text + ": more threads than meshtrain runs in one process "
                    "(expected an integer from 1 to " + std::to_string(kMaxThreads) +
                    "; unset, each rank uses its share of its cores, or run.threads)");
  return static_cast<int>(v);
}

ThreadChoice choose_threads(int configured, const char* omp_num_threads, const NodeCpuShare& share,
                            int node_rank) {
  // Checked even when run.threads wins: the OpenMP runtime and OpenBLAS read it themselves.
  const int from_environment = omp_num_threads_value(omp_num_threads);
  if (configured > 0) return {configured, "run.threads"};
  if (from_environment > 0) return {from_environment, "OMP_NUM_THREADS"};
  if (node_rank >= 0 && node_rank < static_cast<int>(share.threads.size()))
    return {share.threads[static_cast<size_t>(node_rank)], "cores"};
  return {1, "cores"};
}

RankCpus probe_rank_cpus() {
  RankCpus r;
  r.available = probe_available();
  r.bound = probe_affinity();
  if (r.bound.empty()) r.bound = r.available;
  r.quota = probe_quota();
  return r;
}

Launcher detect_launcher() {
  return detect_launcher([](const char* name) { return std::getenv(name); }, parent_command());
}

int node_usable_cores(MPI_Comm node) {
  std::vector<RankCpus> ranks;
  for (const std::string& text : all_gather_strings(node, encode_rank_cpus(probe_rank_cpus())))
    ranks.push_back(decode_rank_cpus(text));
  return std::max(1, share_node_cpus(ranks).usable);
}

}  // namespace meshtrain
