#include "meshtrain/app/mpi_session.h"

#include <hdf5.h>

#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>
#include <system_error>

#include "meshtrain/app/commands.h"
#include "meshtrain/app/docs_page.h"
#include "meshtrain/app/init_watchdog.h"
#include "meshtrain/app/launch_check.h"
#include "meshtrain/comm/agreement.h"
#include "meshtrain/comm/communicator.h"
#include "meshtrain/comm/job_abort.h"
#include "meshtrain/comm/mpi_runtime.h"
#include "meshtrain/config/deck_error.h"
#include "meshtrain/io/data_error.h"
#include "meshtrain/train/divergence.h"
#include "meshtrain/train/hardware_fault.h"
#include "meshtrain/train/stop_request.h"

namespace meshtrain {

namespace {
constexpr const char* kOutOfMemoryAdvice =
    "`meshtrain plan DECK --world N --memory SIZE` predicts the memory per rank; lower "
    "train.micro_batch, set parallel.zero, parallel.recompute, or use more ranks";
constexpr const char* kMemoryPage = "docs/memory-and-planning.md";
constexpr const char* kTroubleshootingPage = "docs/troubleshooting.md";
constexpr const char* kDataPage = "docs/data-and-interop.md";

// An error every rank agreed on, printed once (by the caller's rank 0), then the docs page that
// explains it: the page fixed by the error's kind where given, else the one its words point to.
void report_agreed(const char* message, const char* page = nullptr) {
  std::fprintf(stderr, "meshtrain: error: %s\n", message);
  if (page)
    std::fputs(docs_pointer_line(page).c_str(), stderr);
  else
    print_docs_pointer(message);
}
// Only this rank ran out; the others wait for it: the job is ended from here.
[[noreturn]] void out_of_memory(int rank, const std::string& what) {
  std::fprintf(stderr, "meshtrain: rank %d: error: out of memory (%s); %s; aborting the job\n", rank,
               what.c_str(), kOutOfMemoryAdvice);
  std::fputs(docs_pointer_line(kMemoryPage).c_str(), stderr);
  std::fflush(stderr);
  abort_job(kExitInput);
}

[[noreturn]] void internal_error(int rank, const char* what) {
  std::fprintf(stderr, "meshtrain: rank %d: internal error: %s; aborting the job\n", rank, what);
  std::fflush(stderr);
  abort_job(kExitInternal);
}

bool is_out_of_memory(const std::error_code& code) {
  return code == std::errc::resource_unavailable_try_again || code == std::errc::not_enough_memory;
}
}  // namespace

MpiSession::MpiSession(int* argc, char*** argv) {
  {
    // main() refused a bad MESHTRAIN_INIT_TIMEOUT; a caller that did not pass there (an
    // in-process test) gets the default.
    double bound = 0;
    try {
      bound = init_timeout_seconds(std::getenv("MESHTRAIN_INIT_TIMEOUT"));
    } catch (const DeckError&) {
      bound = init_timeout_seconds(nullptr);
    }
    const InitWatchdog watchdog(bound, "MPI_Init");
    // MULTIPLE lets the progress thread (comm/progress_thread.h) drive MPI during compute.
    init_mpi(argc, argv);
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
}

MpiSession::~MpiSession() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  // Parallel HDF5 shuts itself down from inside MPI_Finalize (an attribute callback on
  // MPI_COMM_SELF), closing what is still open with MPI calls that crash there: shut it down
  // while MPI still works. Checkpoint files are closed before this (CheckpointFile::discard
  // after a failed write); this is the safety net.
  H5close();
  MPI_Finalize();
}

int run_reporting_errors(const std::function<int()>& body) {
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  // A stalled or dead rank ends the job from inside the wait that notices it, within seconds,
  // instead of unwinding through destructors that wait on the same peers.
  arm_job_abort(kExitTimeout);
  try {
    check_launcher_world(size);
    return body();
  } catch (const DeckError& e) {  // same deck text on every rank: same verdict
    if (rank == 0) report_agreed(e.what());
    return kExitInput;
  } catch (const AgreedOutOfMemory& e) {  // every rank knows; no abort needed
    if (rank == 0) {
      std::fprintf(stderr, "meshtrain: error: %s; %s\n", e.what(), kOutOfMemoryAdvice);
      std::fputs(docs_pointer_line(kMemoryPage).c_str(), stderr);
    }
    return kExitInput;
  } catch (const AgreedError& e) {
    if (rank == 0) report_agreed(e.what());
    return kExitInput;
  } catch (const CommTimeout& e) {
    std::fprintf(stderr, "meshtrain: rank %d: error: %s; aborting the job\n", rank, e.what());
    std::fputs(docs_pointer_line(kTroubleshootingPage).c_str(), stderr);
    std::fflush(stderr);
    abort_job(kExitTimeout);
  } catch (const StopDuringStartup& e) {  // every rank agreed on it
    if (rank == 0) {
      std::printf("%s\n", e.what());
      std::fflush(stdout);
    }
    return kExitRequeue;
  } catch (const RunDiverged& e) {  // every rank diverges in the same step
    if (rank == 0) report_agreed(e.what(), kTroubleshootingPage);
    return kExitDiverged;
  } catch (const HardwareFault& e) {  // every rank built the same verdict from gathered facts
    if (rank == 0) report_agreed(e.what(), kTroubleshootingPage);
    return kExitHardwareFault;
  } catch (const DataError& e) {  // raised outside an agreement: only this rank knows
    std::fprintf(stderr, "meshtrain: rank %d: error: %s; aborting the job\n", rank, e.what());
    print_docs_pointer(e.what(), kDataPage);
    std::fflush(stderr);
    abort_job(kExitInput);
  } catch (const std::bad_alloc&) {  // only this rank ran out; the others wait for it
    out_of_memory(rank, "an allocation failed");
  } catch (const std::system_error& e) {
    // A thread that cannot be created (std::thread: EAGAIN) under an address-space limit
    // (ulimit -v) has no room for its stack: memory, not a bug.
    if (!is_out_of_memory(e.code())) internal_error(rank, e.what());
    out_of_memory(rank, std::string("a thread could not be created: ") + e.what());
  } catch (const std::exception& e) {
    internal_error(rank, e.what());
  }
}

int run_on_rank_zero(const std::function<void()>& work) {
  MpiSession mpi;
  int status = kExitOk;
  if (mpi.rank() == 0) {
    try {
      work();
    } catch (const std::exception& e) {
      report_agreed(e.what());
      status = kExitInput;
    }
    std::fflush(stdout);
  }
  MPI_Bcast(&status, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return status;
}

}  // namespace meshtrain
