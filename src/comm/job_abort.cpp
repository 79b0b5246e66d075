#include "meshtrain/comm/job_abort.h"

#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>

#include "meshtrain/comm/communicator.h"
#include "meshtrain/comm/mpi_runtime.h"
#include "meshtrain/comm/node.h"

namespace meshtrain {
namespace {

struct AbortState {
  std::mutex mutex;
  bool armed = false;
  int exit_status = 1;
  uint64_t next_id = 1;
  std::map<uint64_t, std::function<void()>> hooks;
};

AbortState& state() {
  static AbortState s;
  return s;
}

}  // namespace

void arm_job_abort(int exit_status) {
  std::lock_guard<std::mutex> lock(state().mutex);
  state().armed = true;
  state().exit_status = exit_status;
}

void disarm_job_abort() {
  std::lock_guard<std::mutex> lock(state().mutex);
  state().armed = false;
}

bool job_abort_armed() {
  std::lock_guard<std::mutex> lock(state().mutex);
  return state().armed;
}

uint64_t add_abort_hook(std::function<void()> hook) {
  std::lock_guard<std::mutex> lock(state().mutex);
  const uint64_t id = state().next_id++;
  state().hooks.emplace(id, std::move(hook));
  return id;
}

void remove_abort_hook(uint64_t id) {
  std::lock_guard<std::mutex> lock(state().mutex);
  state().hooks.erase(id);
}

void communication_failed(const std::string& what) {
  std::map<uint64_t, std::function<void()>> hooks;
  int exit_status = 1;
  {
    std::lock_guard<std::mutex> lock(state().mutex);
    if (!state().armed) throw CommTimeout(what);
    hooks = state().hooks;
    exit_status = state().exit_status;
  }
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::fprintf(stderr, "meshtrain: rank %d (node %s): error: %s; aborting the job\n", rank,
               node_name().c_str(), what.c_str());
  std::fflush(stderr);
  for (auto& [id, hook] : hooks) {
    try {
      hook();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "meshtrain: rank %d: while aborting: %s\n", rank, e.what());
    }
  }
  std::fflush(nullptr);
  abort_job(exit_status);
}

}  // namespace meshtrain
