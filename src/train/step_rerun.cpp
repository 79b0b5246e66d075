#include "meshtrain/train/step_rerun.h"

#include <algorithm>
#include <cstring>
#include <sstream>
#include <vector>

#include "meshtrain/train/hardware_fault.h"

namespace meshtrain {

void compare_attempts(const Config& config, ProcessGrid& grid, int step, const std::string& why,
                      const StepAttempt& first, const StepAttempt& second) {
  // Bits, not values: a NaN must equal the same NaN, and -0 differ from 0.
  const bool loss_differs = std::memcmp(&first.local_loss, &second.local_loss, sizeof(double)) != 0;
  const bool gradient_differs = first.gradient_hash != second.gradient_hash;
  const std::string mine = std::string(1, static_cast<char>(loss_differs)) +
                           static_cast<char>(gradient_differs) + grid.node_name();
  const std::vector<std::string> all = grid.world().all_gather_bytes(mine);
  std::vector<std::string> ranks;
  std::vector<std::string> nodes;
  for (size_t r = 0; r < all.size(); ++r) {
    if (!all[r][0] && !all[r][1]) continue;
    const std::string node = all[r].substr(2);
    std::string what = all[r][0] && all[r][1] ? "loss and gradient" : all[r][0] ? "loss" : "gradient";
    ranks.push_back("rank " + std::to_string(r) + " (node " + node + ": " + what + ")");
    if (std::find(nodes.begin(), nodes.end(), node) == nodes.end()) nodes.push_back(node);
  }
  if (ranks.empty()) return;
  std::ostringstream msg;
  msg << config.deck_path << ": step " << step << " was re-run on the same data and parameters because "
      << why << ", and gave different results on ";
  for (size_t i = 0; i < ranks.size(); ++i) msg << (i ? ", " : "") << ranks[i];
  if (ranks.size() == all.size() && all.size() > 1)
    msg << " (every rank: the corruption went through a reduction, so it began on one of them)";
  std::string node_list;
  for (const std::string& n : nodes) node_list += (node_list.empty() ? "" : ",") + n;
  msg << ". Healthy hardware repeats a step bit for bit: likely a hardware fault (silent data "
         "corruption) on node"
      << (nodes.size() > 1 ? "s " : " ") << node_list
      << "; the step was not applied: resume from the newest checkpoint (checkpoint.resume = \"auto\") "
      << "away from " << (nodes.size() > 1 ? "those nodes" : "that node") << " (e.g. sbatch --exclude="
      << node_list << ")";
  throw HardwareFault(msg.str());
}

void GradNormHistory::add(double norm) {
  norms_.push_back(norm);
  if (norms_.size() > kWindow) norms_.pop_front();
}

double GradNormHistory::median() const {
  if (norms_.empty()) return 0;
  std::vector<double> sorted(norms_.begin(), norms_.end());
  std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
  return sorted[sorted.size() / 2];
}

bool GradNormHistory::spike(double norm, double factor) const {
  return factor > 0 && norms_.size() >= kMinimum && norm > factor * median();
}

}  // namespace meshtrain
