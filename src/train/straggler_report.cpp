#include "meshtrain/train/straggler_report.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace meshtrain {

double median_of(std::vector<double> values) {
  if (values.empty()) return 0;
  const size_t n = values.size(), mid = n / 2;
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(mid), values.end());
  const double upper = values[mid];
  if (n % 2 == 1) return upper;
  const double lower = *std::max_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(mid));
  return 0.5 * (lower + upper);
}

StragglerWindow judge_window(int step, int steps, const std::vector<double>& compute_ms,
                             const std::vector<double>& wait_ms,
                             const std::vector<int>& previous_streak, double threshold,
                             int persistence) {
  if (!(threshold > 1.0) || persistence < 1)
    throw std::invalid_argument("judge_window: threshold must be > 1 and persistence >= 1");
  StragglerWindow w;
  w.step = step;
  w.steps = steps;
  w.compute_ms = compute_ms;
  w.wait_ms = wait_ms;
  w.median_compute_ms = median_of(compute_ms);
  const size_t n = compute_ms.size();
  w.streak.assign(n, 0);
  for (size_t r = 0; r < n; ++r) {
    // A window whose median is no time at all (nothing measured) flags no one.
    const bool slow = w.median_compute_ms > 0 && compute_ms[r] > threshold * w.median_compute_ms;
    if (!slow) continue;
    w.slow.push_back(static_cast<int>(r));
    w.streak[r] = 1 + (r < previous_streak.size() ? previous_streak[r] : 0);
    if (w.streak[r] >= persistence) w.stragglers.push_back(static_cast<int>(r));
  }
  return w;
}

std::string describe_straggler(const StragglerWindow& w, int rank, const RankPlace& place) {
  const double mine = w.compute_ms.at(static_cast<size_t>(rank)), median = w.median_compute_ms;
  const int streak = w.streak.at(static_cast<size_t>(rank));
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "straggler: rank %d (node %s, dp %d tp %d pp %d) computes %.2fx the median (%.1f vs "
                "%.1f ms per step) in %d consecutive window%s",
                rank, place.node.c_str(), place.dp, place.tp, place.pp,
                median > 0 ? mine / median : 0.0, mine, median, streak, streak == 1 ? "" : "s");
  return buf;
}

StragglerMonitor::StragglerMonitor(ProcessGrid& grid, double threshold, int persistence)
    : threshold_(threshold), persistence_(persistence) {
  if (!(threshold > 1.0) || persistence < 1)
    throw std::invalid_argument("StragglerMonitor: threshold must be > 1 and persistence >= 1");
  const int coords[3] = {grid.rank(Axis::Data), grid.rank(Axis::Tensor), grid.rank(Axis::Pipeline)};
  const std::string mine = std::string(reinterpret_cast<const char*>(coords), sizeof coords) +
                           grid.node_name();
  for (const std::string& b : grid.world().all_gather_bytes(mine)) {
    RankPlace p;
    int c[3] = {0, 0, 0};
    if (b.size() >= sizeof c) std::memcpy(c, b.data(), sizeof c);
    p.dp = c[0];
    p.tp = c[1];
    p.pp = c[2];
    p.node = b.size() > sizeof c ? b.substr(sizeof c) : "?";
    places_.push_back(p);
  }
}

void StragglerMonitor::add_step(double compute_seconds, double step_seconds) {
  compute_sum_ += compute_seconds;
  step_sum_ += step_seconds;
  ++steps_;
}

const StragglerWindow& StragglerMonitor::close_window(Communicator& world, int step) {
  const double mine[2] = {steps_ > 0 ? compute_sum_ / steps_ * 1e3 : 0.0,
                          steps_ > 0 ? std::max(0.0, step_sum_ - compute_sum_) / steps_ * 1e3 : 0.0};
  std::vector<double> compute, wait;
  for (const std::string& b : world.all_gather_bytes(
           std::string(reinterpret_cast<const char*>(mine), sizeof mine))) {
    double v[2] = {0, 0};
    if (b.size() == sizeof v) std::memcpy(v, b.data(), sizeof v);
    compute.push_back(v[0]);
    wait.push_back(v[1]);
  }
  window_ = judge_window(step, steps_, compute, wait, window_.streak, threshold_, persistence_);
  compute_sum_ = step_sum_ = 0;
  steps_ = 0;
  return window_;
}

}  // namespace meshtrain
