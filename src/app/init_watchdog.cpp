#include "meshtrain/app/init_watchdog.h"

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>

#include "meshtrain/app/commands.h"
#include "meshtrain/app/docs_page.h"
#include "meshtrain/comm/node.h"
#include "meshtrain/config/deck_error.h"

namespace meshtrain {

namespace {
constexpr double kDefaultInitTimeout = 600;  // run.comm_timeout's default (config.h)
}  // namespace

double init_timeout_seconds(const char* text) {
  if (!text || !*text) return kDefaultInitTimeout;
  char* end = nullptr;
  const double v = std::strtod(text, &end);
  if (end == text || *end != '\0' || !std::isfinite(v) || v < 0)
    throw DeckError("MESHTRAIN_INIT_TIMEOUT=" + std::string(text) + " is not a number of seconds "
                    "(expected a finite number >= 0, e.g. 600; 0: MPI_Init unbounded)");
  return v;
}

int launched_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"})
    if (const char* v = std::getenv(name); v && *v) return std::atoi(v);
  return -1;
}

struct InitWatchdog::State {
  std::mutex mutex;
  std::condition_variable wake;
  bool disarmed = false;
};

InitWatchdog::InitWatchdog(double seconds, std::string stage) {
  if (seconds <= 0) return;
  state_ = std::make_shared<State>();
  // The thread holds the state too: the destructor only flags it and wakes the thread, which
  // returns on its own.
  try {
    std::thread([state = state_, seconds, stage = std::move(stage)] {
      std::unique_lock<std::mutex> lock(state->mutex);
      if (state->wake.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return state->disarmed; }))
        return;
      const int rank = launched_rank();
      std::fprintf(stderr, "meshtrain: rank %d: error: %s on node %s did not return within %g s "
                   "(MESHTRAIN_INIT_TIMEOUT; the deck and its run.comm_timeout are read only after "
                   "it): a rank of the job has likely stalled or died before joining it, or the "
                   "launcher could not start one; exiting\n",
                   rank < 0 ? 0 : rank, stage.c_str(), node_name().c_str(), seconds);
      std::fputs(docs_pointer_line("docs/troubleshooting.md").c_str(), stderr);
      std::fflush(stderr);
      std::_Exit(kExitTimeout);  // MPI is not up: MPI_Abort cannot be called; the launcher ends the rest
    }).detach();
  } catch (const std::system_error&) {
    // No thread to be had (an address-space limit leaves no room for its stack): start-up goes
    // on unwatched, and fails on its own with the out-of-memory message soon after.
    state_.reset();
  }
}

InitWatchdog::~InitWatchdog() {
  if (!state_) return;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->disarmed = true;
  }
  state_->wake.notify_all();
}

}  // namespace meshtrain
