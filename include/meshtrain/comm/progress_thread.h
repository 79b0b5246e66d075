#pragma once
// Drives MPI's progress engine while non-blocking collectives are in flight. Open MPI (and MPICH
// without async progress) advances a non-blocking collective only inside MPI calls; between
// two calls of the training thread — a whole layer's backward — a multi-round ring all-reduce
// would stand still. This thread calls MPI_Iprobe on a private communicator every few tens of
// microseconds while anything is in flight (and sleeps otherwise), which advances every
// pending request without touching them. Needs MPI_THREAD_MULTIPLE; without it, progress falls
// back to the training thread's calls between units.

#include <mpi.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace meshtrain {

class ProgressThread {
 public:
  // Starts the thread if `wanted` and MPI provides MPI_THREAD_MULTIPLE; otherwise does nothing.
  // A planner's dry run (communicators that complete every transfer at once) does not want one:
  // there is nothing to advance, and a thread woken at every reduction would only take the core
  // the dry run needs.
  explicit ProgressThread(bool wanted = true);
  ~ProgressThread();
  ProgressThread(const ProgressThread&) = delete;
  ProgressThread& operator=(const ProgressThread&) = delete;

  bool running() const { return thread_.joinable(); }
  // Bracket the time communication is in flight (nesting allowed).
  void begin();
  void end();

 private:
  void loop();

  MPI_Comm comm_ = MPI_COMM_NULL;
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable wake_;
  int active_ = 0;
  bool stop_ = false;
};

}  // namespace meshtrain
