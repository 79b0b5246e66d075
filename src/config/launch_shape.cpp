#include "meshtrain/config/launch_shape.h"

#include <algorithm>
#include <vector>

namespace meshtrain {

namespace {

std::string plural(int n, const char* one) { return std::to_string(n) + " " + one + (n == 1 ? "" : "s"); }

}  // namespace

double LaunchShape::oversubscription() const {
  if (ranks_per_node <= 0 || cores_per_node <= 0) return 0;
  return static_cast<double>(ranks_per_node) * std::max(1, threads_per_rank) / cores_per_node;
}

std::string describe_launch(const LaunchShape& l) {
  std::vector<std::string> parts;
  if (l.ranks_per_node > 0 && l.cores_per_node > 0)
    parts.push_back(plural(l.ranks_per_node, "rank") + " x " + plural(std::max(1, l.threads_per_rank), "thread") +
                    " on " + plural(l.cores_per_node, "core"));
  if (l.cores_per_rank > 0) parts.push_back("each rank bound to " + plural(l.cores_per_rank, "core"));
  if (!l.idle_ranks.empty()) parts.push_back("waiting ranks " + l.idle_ranks);
  std::string s;
  for (const std::string& p : parts) s += (s.empty() ? "" : ", ") + p;
  return s.empty() ? "not recorded" : s;
}

std::string launch_difference(const std::string& profile_name, const LaunchShape& was, const LaunchShape& now) {
  std::vector<std::string> diffs;
  const auto number = [&](int a, int b, const std::string& before, const char* unit, const std::string& after) {
    // 0 is "not known": a profile written before launches were recorded compares on what it has.
    if (a > 0 && b > 0 && a != b)
      diffs.push_back(before + plural(b, unit) + after + " (calibrated: " + std::to_string(a) + ")");
  };
  number(was.ranks_per_node, now.ranks_per_node, "", "rank", " per node");
  number(was.threads_per_rank, now.threads_per_rank, "", "thread", " per rank");
  number(was.cores_per_node, now.cores_per_node, "", "core", " per node");
  number(was.cores_per_rank, now.cores_per_rank, "each rank bound to ", "core", "");
  if (!was.idle_ranks.empty() && !now.idle_ranks.empty() && was.idle_ranks != now.idle_ranks)
    diffs.push_back("waiting ranks " + now.idle_ranks + " (calibrated: " + was.idle_ranks + ")");
  if (diffs.empty()) return "";
  std::string s = "this launch differs from the one machine profile " + profile_name + " was calibrated under: ";
  for (size_t i = 0; i < diffs.size(); ++i) s += (i ? ", " : "") + diffs[i];
  return s + "; predicted times assume the calibrated launch (" + describe_launch(was) +
         "): calibrate under this launch (`mpirun` as you run `train`, `meshtrain bench --suite calibrate "
         "--out PROFILE.toml`) for predictions of it";
}

}  // namespace meshtrain
