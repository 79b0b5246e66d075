#pragma once
// Which work a replica takes next under asynchronous data parallelism with bounded staleness
// (stale-synchronous parallel, Ho et al., NIPS 2013), decided by the first parameter server.
//
// Work comes in shares: step v's global batch is the synchronous run's, cut into one share per
// replica (share j = the samples synchronous replica j would take), so every sample of a step
// is used once whichever replica computes it. The servers apply step v (version v -> v + 1) once
// every share of it has arrived. A share of step v is handed out only when v <= version + s and
// must be computed on parameters of version >= v - s: a gradient is never more than s versions
// older than the step it is applied in. With s = 0 every share of step v is computed on version
// v, which is synchronous data parallelism. Shares go out in (step, share) order to whichever
// replica asks first, so faster replicas take more of them.
//
// Fences are steps at which every replica needs the same state (evaluation, checkpoints, a stop,
// the end): no share of a step >= f is handed out until version f is reached and every replica
// is waiting; then all of them receive the fence together.

#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <utility>
#include <vector>

namespace meshtrain {

enum class AssignmentKind : int32_t { Share = 0, Fence = 1 };

struct Assignment {
  AssignmentKind kind = AssignmentKind::Share;
  int32_t share = 0;
  int64_t step = 0;         // the share's step, or the fence's version
  int64_t min_version = 0;  // the oldest parameters the share may be computed on
};

// What a replica did with its last share, sent with its next request.
struct ShareReport {
  int64_t step = -1;  // -1: nothing to report
  int32_t share = 0;
  int64_t version = 0;  // of the parameters the gradient was computed on
  double loss_sum = 0;  // the share's summed token losses, scaled as the step's
};

// A step whose shares have all been reported.
struct StepSummary {
  int64_t step = 0;  // 0-based: applying it makes version step + 1
  double loss_sum = 0;
  double staleness_sum = 0;
  int32_t staleness_max = 0;
  int32_t shares = 0;
};

class ShareScheduler {
 public:
  // Steps first_step .. last_step - 1 are to be trained; `fences` are versions in
  // (first_step, last_step] (last_step is always one).
  ShareScheduler(int replicas, int staleness, int64_t first_step, int64_t last_step,
                 const std::vector<int64_t>& fences);

  // A replica asks for work. Its report (if any) is recorded; returns the report's staleness.
  int64_t ask(int replica, const ShareReport& report);
  // The servers' version advanced.
  void set_version(int64_t version) { version_ = version; }
  // A stop was requested: a fence at the first step boundary after the shares handed out.
  void request_stop();
  // The assignments that can be made now, to replicas waiting in the order they asked.
  std::vector<std::pair<int, Assignment>> dispatch();
  // The replicas waiting for an answer (now taken off the queue): on divergence.
  std::vector<int> take_waiting();
  // Steps whose every share was reported, in step order (a step waits for the earlier ones),
  // since the last call.
  std::vector<StepSummary> take_summaries();

  int64_t version() const { return version_; }
  bool finished() const { return finished_; }  // the last fence was handed out
  int staleness() const { return staleness_; }
  // Steps handed out so far are all < this.
  int64_t next_step() const { return next_share_ == 0 ? next_step_ : next_step_ + 1; }

 private:
  int replicas_, staleness_;
  int64_t last_step_, version_, next_step_;
  int32_t next_share_ = 0;
  std::set<int64_t> fences_;
  std::deque<int> waiting_;
  std::map<int64_t, StepSummary> open_;
  std::map<int64_t, StepSummary> done_;
  int64_t next_summary_;
  bool finished_ = false;
};

}  // namespace meshtrain
