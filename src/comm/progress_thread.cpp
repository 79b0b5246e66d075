#include "meshtrain/comm/progress_thread.h"

#include <chrono>

namespace meshtrain {

ProgressThread::ProgressThread(bool wanted) {
  if (!wanted) return;
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  if (provided < MPI_THREAD_MULTIPLE) return;
  MPI_Comm_dup(MPI_COMM_SELF, &comm_);
  thread_ = std::thread([this] { loop(); });
}

ProgressThread::~ProgressThread() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_one();
  thread_.join();
  MPI_Comm_free(&comm_);
}

void ProgressThread::begin() {
  if (!running()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++active_;
  }
  wake_.notify_one();
}

void ProgressThread::end() {
  if (!running()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (active_ > 0) --active_;
}

void ProgressThread::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    if (active_ == 0) {
      wake_.wait(lock, [this] { return stop_ || active_ > 0; });
      continue;
    }
    lock.unlock();
    int flag = 0;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_, &flag, MPI_STATUS_IGNORE);
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    lock.lock();
  }
}

}  // namespace meshtrain
