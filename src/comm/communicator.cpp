#include "meshtrain/comm/communicator.h"

#include <sched.h>

#include <cstdio>

#include "meshtrain/comm/job_abort.h"

namespace meshtrain {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
  }
  return "?";
}

Work::~Work() {
  if (!impl_) return;
  try {
    wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "meshtrain: abandoned communication failed: %s\n", e.what());
  }
}

Work& Work::operator=(Work&& other) {
  if (this == &other) return *this;
  wait();
  impl_ = std::move(other.impl_);
  timeout_ = other.timeout_;
  return *this;
}

bool Work::test() {
  if (!impl_) return true;
  if (impl_->test()) {
    impl_.reset();
    return true;
  }
  return false;
}

void Work::wait() {
  if (!impl_) return;
  impl_->order_consumers();
  // Poll rather than block: the wait can then give up after the timeout with a diagnosis, and
  // yields the core to other ranks when the node is oversubscribed.
  const auto start = std::chrono::steady_clock::now();
  for (uint64_t spin = 0;; ++spin) {
    if (impl_->test()) break;
    if (spin > 64) sched_yield();
    if ((spin & 1023) == 1023 && timeout_.count() > 0 &&
        std::chrono::steady_clock::now() - start > timeout_) {
      const std::string what = impl_->describe();
      impl_.release();  // leaked on purpose: the request is stuck and the job is about to end
      char seconds[32];
      std::snprintf(seconds, sizeof seconds, "%.0f", timeout_.count());
      communication_failed(what + " did not complete within " + seconds +
                           " s (run.comm_timeout): a rank of the group has likely died, stalled "
                           "or taken a different code path");
    }
  }
  impl_.reset();
}

std::vector<Work> Communicator::exchange(const std::vector<Transfer>& step) {
  std::vector<Work> works;
  works.reserve(step.size());
  for (const Transfer& t : step) {
    Tensor tensor = t.tensor;
    works.push_back(t.kind == Transfer::Kind::Send ? send(tensor, t.peer, t.tag)
                                                   : recv(tensor, t.peer, t.tag));
  }
  return works;
}

void wait_all(std::vector<Work>& works) {
  for (Work& w : works) w.wait();
}

}  // namespace meshtrain
