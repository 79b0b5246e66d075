#include "meshtrain/comm/blocking_watchdog.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <thread>

#include "meshtrain/comm/communicator.h"
#include "meshtrain/comm/job_abort.h"

namespace meshtrain {
namespace {

using Clock = std::chrono::steady_clock;

struct Region {
  std::string what;
  Clock::time_point start;
};

struct Watchdog {
  std::mutex mutex;
  std::condition_variable wake;
  double timeout = 0;  // seconds; 0: off
  uint64_t next_id = 1;
  std::map<uint64_t, Region> regions;
  std::thread thread;  // detached: it lives as long as the process

  void loop() {
    std::unique_lock<std::mutex> lock(mutex);
    for (;;) {
      // A tenth of the limit, within [10 ms, 250 ms]: the job ends at most that much after it,
      // and the thread costs nothing measurable between.
      const double period = std::clamp(timeout / 10, 0.01, 0.25);
      wake.wait_for(lock, std::chrono::duration<double>(period));
      if (timeout <= 0 || regions.empty() || !job_abort_armed()) continue;
      const auto now = Clock::now();
      const Region* oldest = nullptr;
      for (const auto& [id, r] : regions)
        if (!oldest || r.start < oldest->start) oldest = &r;
      const double held = std::chrono::duration<double>(now - oldest->start).count();
      if (held <= timeout) continue;
      const std::string what = oldest->what;
      const double limit = timeout;
      lock.unlock();
      char seconds[32];
      std::snprintf(seconds, sizeof seconds, "%.0f", limit);
      // Does not return: the hooks run here, then MPI_Abort ends every rank.
      communication_failed(what + " did not complete within " + seconds +
                           " s (run.comm_timeout): a rank of the group has likely died, stalled "
                           "or taken a different code path, or the file system stopped answering");
      lock.lock();
    }
  }
};

Watchdog& watchdog() {
  static Watchdog* w = new Watchdog;  // never destroyed: its thread may outlive main's statics
  return *w;
}

}  // namespace

void set_blocking_timeout(double seconds) {
  Watchdog& w = watchdog();
  std::lock_guard<std::mutex> lock(w.mutex);
  w.timeout = seconds > 0 ? seconds : 0;
  if (w.timeout > 0 && !w.thread.joinable()) {
    w.thread = std::thread([&w] { w.loop(); });
    w.thread.detach();
  }
  w.wake.notify_all();
}

double blocking_timeout() {
  Watchdog& w = watchdog();
  std::lock_guard<std::mutex> lock(w.mutex);
  return w.timeout;
}

BlockingRegion::BlockingRegion(const std::string& what) {
  Watchdog& w = watchdog();
  std::lock_guard<std::mutex> lock(w.mutex);
  if (w.timeout <= 0) return;
  id_ = w.next_id++;
  w.regions.emplace(id_, Region{what, Clock::now()});
}

BlockingRegion::~BlockingRegion() {
  if (!id_) return;
  Watchdog& w = watchdog();
  std::lock_guard<std::mutex> lock(w.mutex);
  w.regions.erase(id_);
}

CollectiveRegion::CollectiveRegion(Communicator& group, const std::string& what)
    : region_(what), group_(group), ticket_(group.enter_blocking_collective()) {}

CollectiveRegion::~CollectiveRegion() { group_.leave_blocking_collective(ticket_); }

}  // namespace meshtrain
