#pragma once
// BackgroundWorker: one thread that runs posted jobs in order while the caller's thread goes on
// (the checkpointer hashes one dataset while MPI-IO moves the next). Waiting blocks on a
// condition variable instead of spinning, so the worker never competes for a core it does not
// use. Private to src/checkpoint.

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

namespace meshtrain {

class BackgroundWorker {
 public:
  BackgroundWorker() : thread_([this] { loop(); }) {}
  ~BackgroundWorker() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
  }  // thread_ (the last member) joins first, after the jobs left
  BackgroundWorker(const BackgroundWorker&) = delete;
  BackgroundWorker& operator=(const BackgroundWorker&) = delete;

  void post(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      jobs_.push_back(std::move(job));
    }
    wake_.notify_all();
  }

  // Returns when every posted job has run; rethrows (as runtime_error) the first job's error.
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    idle_.wait(lock, [&] { return jobs_.empty() && !busy_; });
    if (!error_.empty()) {
      const std::string e = error_;
      error_.clear();
      throw std::runtime_error(e);
    }
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      std::function<void()> job = std::move(jobs_.front());
      jobs_.pop_front();
      busy_ = true;
      lock.unlock();
      std::string error;
      try {
        job();
      } catch (const std::exception& e) {
        error = e.what();
      }
      lock.lock();
      busy_ = false;
      if (error_.empty()) error_ = error;
      if (jobs_.empty()) idle_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_, idle_;
  std::deque<std::function<void()>> jobs_;
  bool busy_ = false, stopping_ = false;
  std::string error_;
  std::jthread thread_;
};

}  // namespace meshtrain
