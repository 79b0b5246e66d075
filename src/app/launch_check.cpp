#include "meshtrain/app/launch_check.h"

#include <cstdlib>

#include "meshtrain/comm/agreement.h"
#include "meshtrain/comm/mpi_runtime.h"

namespace meshtrain {
namespace {

// Identifies the build: the version and when this file was compiled, which differs between two
// builds of one version (a rebuilt binary on some nodes only).
std::string build_id() { return "meshtrain " MESHTRAIN_VERSION " built " __DATE__ " " __TIME__; }

// One record per rank: fields separated by '\n' (no field contains one: command-line arguments
// that do are shown escaped).
std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) out += c == '\n' ? std::string("\\n") : std::string(1, c);
  return out;
}

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  size_t begin = 0;
  for (size_t i = 0; i <= s.size(); ++i) {
    if (i == s.size() || s[i] == '\n') {
      out.push_back(s.substr(begin, i - begin));
      begin = i + 1;
    }
  }
  return out;
}

std::string shown(const std::vector<std::string>& overrides, size_t i) {
  return i < overrides.size() ? "--set " + overrides[i] : "no override";
}

}  // namespace

void check_same_launch(Communicator& world, const std::string& deck,
                       const std::vector<std::string>& overrides) {
  std::string mine = build_id() + "\n" + escape(deck);
  for (const std::string& o : overrides) mine += "\n" + escape(o);
  const std::vector<std::string> all = world.all_gather_bytes(mine);
  for (size_t r = 1; r < all.size(); ++r) {
    if (all[r] == all[0]) continue;
    const std::vector<std::string> ref = split_lines(all[0]), other = split_lines(all[r]);
    const std::string rank = "rank " + std::to_string(r);
    std::string what;
    if (ref[0] != other[0]) {
      what = rank + " runs " + other[0] + ", rank 0 runs " + ref[0];
    } else if (ref[1] != other[1]) {
      what = rank + " was given the deck " + other[1] + ", rank 0 the deck " + ref[1] +
             " (only rank 0's file is read)";
    } else {
      const std::vector<std::string> a(ref.begin() + 2, ref.end()), b(other.begin() + 2, other.end());
      size_t i = 0;
      while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
      what = rank + " has " + shown(b, i) + " where rank 0 has " + shown(a, i) + " (override " +
             std::to_string(i + 1) + ")";
    }
    throw AgreedError("ranks were started differently: " + what +
                      "; every rank must run the same meshtrain build with the same deck and the "
                      "same --set overrides (check the launch line for an MPMD ':' part, or a "
                      "stale binary or job script on some nodes)");
  }
}

std::string foreign_launcher_problem(int world_size, Launcher launcher, const EnvLookup& env,
                                     const std::string& mpi_library) {
  if (world_size != 1) return "";
  // Only the variable of the launcher that started this process: mpirun inside an allocation
  // starts its daemons with srun, so its ranks also carry a SLURM_STEP_NUM_TASKS (the nodes').
  const char* variable = launcher == Launcher::OpenMpi ? "OMPI_COMM_WORLD_SIZE"
                         : launcher == Launcher::Hydra ? "PMI_SIZE"
                         : launcher == Launcher::Slurm ? "SLURM_STEP_NUM_TASKS"
                                                       : nullptr;
  const char* value = variable ? env(variable) : nullptr;
  if (!value || !*value) return "";
  char* end = nullptr;
  const long started = std::strtol(value, &end, 10);
  if (*end != '\0' || started <= 1) return "";
  const bool mpich = mpi_library.find("MPICH") != std::string::npos;
  std::string how;
  switch (launcher) {
    case Launcher::OpenMpi:
      how = mpich ? "start it with MPICH's mpiexec.mpich (or use the Open MPI build, build/meshtrain)"
                  : "start it with the mpirun of the Open MPI it was built against";
      break;
    case Launcher::Hydra:
      how = mpich ? "start it with the mpiexec of the MPICH it was built against"
                  : "start it with Open MPI's mpirun (or use the MPICH build, build-mpich/meshtrain)";
      break;
    default:
      how = std::string("give srun the PMI this MPI speaks: srun --mpi=") +
            (mpich ? "pmi2" : "pmix") + " (MESHTRAIN_SRUN_MPI for the scripts in jobs/; "
            "`srun --mpi=list` shows what the cluster offers)";
      break;
  }
  return std::string(launcher_name(launcher)) + " started " + std::to_string(started) +
         " processes (" + variable + "=" + value + ") but each is alone in its MPI job: this " +
         "binary links " + (mpi_library.empty() ? std::string("another MPI") : mpi_library) +
         ", which did not join the launcher's job; " + how;
}

void check_launcher_world(int world_size) {
  const std::string problem = foreign_launcher_problem(
      world_size, detect_launcher(), [](const char* name) { return std::getenv(name); },
      mpi_library_version());
  if (!problem.empty()) throw AgreedError(problem);
}

}  // namespace meshtrain
