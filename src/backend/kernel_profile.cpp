#include "meshtrain/backend/kernel_profile.h"

#include <algorithm>

namespace meshtrain {

void KernelProfile::add(std::string_view op, double seconds, double flops) {
  auto it = entries_.find(op);
  if (it == entries_.end()) it = entries_.emplace(std::string(op), Entry{std::string(op)}).first;
  ++it->second.calls;
  it->second.seconds += seconds;
  it->second.flops += flops;
}

std::vector<KernelProfile::Entry> KernelProfile::entries() const {
  std::vector<Entry> out;
  for (const auto& [op, e] : entries_) out.push_back(e);
  std::stable_sort(out.begin(), out.end(),
                   [](const Entry& a, const Entry& b) { return a.seconds > b.seconds; });
  return out;
}

double KernelProfile::total_seconds() const {
  double t = 0;
  for (const auto& [op, e] : entries_) t += e.seconds;
  return t;
}

KernelProfile::Scope::Scope(KernelProfile* profile, std::string_view op, double flops)
    : profile_(profile), op_(op), flops_(flops) {
  if (!profile_) return;
  outermost_ = profile_->depth_++ == 0;
  if (outermost_) begin_ = std::chrono::steady_clock::now();
}

KernelProfile::Scope::~Scope() {
  if (!profile_) return;
  --profile_->depth_;
  if (outermost_)
    profile_->add(op_, std::chrono::duration<double>(std::chrono::steady_clock::now() - begin_).count(),
                  flops_);
}

}  // namespace meshtrain
