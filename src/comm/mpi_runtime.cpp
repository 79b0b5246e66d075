#include "meshtrain/comm/mpi_runtime.h"

#include <mpi.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <system_error>
#include <thread>

#include "meshtrain/comm/flight_recorder.h"

namespace meshtrain {

const char* mpi_flavour() {
#if defined(OMPI_MAJOR_VERSION)
  return "openmpi";
#elif defined(MPICH_VERSION)
  return "mpich";
#else
  return "mpi";
#endif
}

// The build names its flavour (MESHTRAIN_MPI_FLAVOUR, from cmake/MeshtrainMpi.cmake); the header
// compiled here must be that flavour's, whatever include path a target added.
#if defined(MESHTRAIN_MPI_FLAVOUR_IS_MPICH) && !defined(MPICH_VERSION)
#error "a MESHTRAIN_MPI=mpich build compiled against another MPI's mpi.h"
#endif
#if defined(MESHTRAIN_MPI_FLAVOUR_IS_OPENMPI) && !defined(OMPI_MAJOR_VERSION)
#error "a MESHTRAIN_MPI=openmpi build compiled against another MPI's mpi.h"
#endif

std::string mpi_library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  MPI_Get_library_version(text, &length);
  // The first line, up to a comma: "Open MPI v4.1.4, package: ..." or "MPICH Version:\t4.0.2".
  std::string first(text, static_cast<size_t>(std::max(length, 0)));
  first = first.substr(0, first.find_first_of("\n,"));
  if (const size_t at = first.find("Version:"); at != std::string::npos) first.erase(at, 8);
  std::string line;  // whitespace runs as one space
  for (char c : first) {
    if (c == '\t') c = ' ';
    if (c != ' ' || (!line.empty() && line.back() != ' ')) line += c;
  }
  while (!line.empty() && line.back() == ' ') line.pop_back();
  return line;
}

int init_mpi(int* argc, char*** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
#if defined(OMPI_MAJOR_VERSION)
    // Open MPI's non-blocking collectives (libnbc) pick, by default, an all-reduce algorithm
    // that moves large buckets at about half the bandwidth of the blocking MPI_Allreduce; the
    // ring is bandwidth-optimal for the megabyte buckets of gradient reduction. A value the
    // user set wins (overwrite = 0). MPICH selects by message size from its own tables.
    setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1", 0);
#endif
    int provided = 0;
    MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
  }
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  return provided;
}

namespace {
// How long abort_job lets MPI_Abort end the job before the rank exits by itself.
constexpr int kAbortGraceSeconds = 3;

// Waits, up to a second, until the pipes behind stdout and stderr (a launcher's: Hydra's proxy,
// Open MPI's orted, srun) hold nothing unread. Hydra polls a rank's output pipes and its PMI
// socket in one loop; an abort arriving with output still in the pipe ended the job without
// that output now and then (the flight records' "likely cause" line after a timeout's
// diagnosis, in bad_input_catalogue under MPICH).
void drain_output() {
  std::fflush(nullptr);
  for (const int fd : {STDOUT_FILENO, STDERR_FILENO}) {
    struct stat st{};
    if (::fstat(fd, &st) != 0 || !S_ISFIFO(st.st_mode)) continue;
    for (int i = 0; i < 100; ++i) {
      int unread = 0;
      if (::ioctl(fd, FIONREAD, &unread) != 0 || unread <= 0) break;
      ::usleep(10000);
    }
  }
}

}  // namespace

void abort_job(int exit_status) {
  // Before the launcher's signals: diagnose must not take this rank, which ended the job, for one
  // that died (flight_report.cpp).
  note_abort_in_flight_record();
  // The job is being torn down: the SIGTERM a launcher sends next (srun --mpi=pmi2 signals
  // every task of the step at an abort) must end this rank now, not ask it for a graceful stop
  // and leave it to the SIGKILL after Slurm's KillWait (30 s by default) instead of ending at once.
  std::signal(SIGTERM, SIG_DFL);
  std::signal(SIGUSR1, SIG_DFL);
  drain_output();
  // MPICH's MPI_Abort under srun --mpi=pmi2 waits for Slurm to kill the task, and Slurm's
  // SIGTERM may have come and gone already (srun terminates the step when the first task dies,
  // before the others' timeouts find out): the task then waited for the SIGKILL after KillWait.
  // Whatever the launcher, a rank still here after a few seconds ends itself.
  try {
    std::thread([exit_status] {
      std::this_thread::sleep_for(std::chrono::seconds(kAbortGraceSeconds));
      std::_Exit(exit_status);
    }).detach();
  } catch (const std::system_error&) {
    // No room for a thread (an address-space limit: the job may be ending for want of memory);
    // MPI_Abort still ends the job, without the grace bound.
  }
  MPI_Abort(MPI_COMM_WORLD, exit_status);
  std::_Exit(exit_status);  // MPI_Abort returned: it must not, but the job still ends here
}

}  // namespace meshtrain
