#include "meshtrain/parallel/share_scheduler.h"

#include <algorithm>
#include <stdexcept>

namespace meshtrain {

ShareScheduler::ShareScheduler(int replicas, int staleness, int64_t first_step, int64_t last_step,
                               const std::vector<int64_t>& fences)
    : replicas_(replicas),
      staleness_(staleness),
      last_step_(last_step),
      version_(first_step),
      next_step_(first_step),
      next_summary_(first_step) {
  if (replicas < 1 || staleness < 0 || first_step > last_step)
    throw std::invalid_argument("ShareScheduler: bad arguments");
  for (int64_t f : fences)
    if (f > first_step && f <= last_step) fences_.insert(f);
  fences_.insert(last_step);
}

int64_t ShareScheduler::ask(int replica, const ShareReport& report) {
  if (replica < 0 || replica >= replicas_) throw std::invalid_argument("ShareScheduler: bad replica");
  if (std::find(waiting_.begin(), waiting_.end(), replica) != waiting_.end())
    throw std::logic_error("ShareScheduler: replica " + std::to_string(replica) + " asked twice");
  waiting_.push_back(replica);
  if (report.step < 0) return 0;
  const int64_t stale = report.step - report.version;
  StepSummary& s = open_[report.step];
  s.step = report.step;
  s.loss_sum += report.loss_sum;
  s.staleness_sum += static_cast<double>(stale);
  s.staleness_max = std::max(s.staleness_max, static_cast<int32_t>(stale));
  if (++s.shares == replicas_) {
    done_[report.step] = s;
    open_.erase(report.step);
  }
  return stale;
}

void ShareScheduler::request_stop() {
  if (finished_) return;
  fences_.insert(std::min(next_step(), last_step_));
}

std::vector<std::pair<int, Assignment>> ShareScheduler::dispatch() {
  std::vector<std::pair<int, Assignment>> out;
  if (finished_) return out;
  const int64_t fence = *fences_.begin();
  while (!waiting_.empty() && next_step_ < fence && next_step_ <= version_ + staleness_) {
    Assignment a;
    a.kind = AssignmentKind::Share;
    a.step = next_step_;
    a.share = next_share_;
    a.min_version = std::max<int64_t>(0, next_step_ - staleness_);
    out.emplace_back(waiting_.front(), a);
    waiting_.pop_front();
    if (++next_share_ == replicas_) {
      next_share_ = 0;
      ++next_step_;
    }
  }
  if (next_step_ == fence && next_share_ == 0 && version_ == fence &&
      static_cast<int>(waiting_.size()) == replicas_) {
    Assignment a;
    a.kind = AssignmentKind::Fence;
    a.step = fence;
    a.min_version = fence;
    for (int r : waiting_) out.emplace_back(r, a);
    waiting_.clear();
    fences_.erase(fences_.begin());
    finished_ = fence == last_step_;
  }
  return out;
}

std::vector<int> ShareScheduler::take_waiting() {
  std::vector<int> out(waiting_.begin(), waiting_.end());
  waiting_.clear();
  return out;
}

std::vector<StepSummary> ShareScheduler::take_summaries() {
  std::vector<StepSummary> out;
  for (auto it = done_.begin(); it != done_.end() && it->first == next_summary_; it = done_.erase(it)) {
    out.push_back(it->second);
    ++next_summary_;
  }
  return out;
}

}  // namespace meshtrain
