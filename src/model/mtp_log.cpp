#include "meshtrain/model/mtp_log.h"

#include <algorithm>
#include <cstdio>

namespace meshtrain {

std::vector<double> mtp_depth_losses(const std::vector<double>& job_statistics, const ModelSpec& spec) {
  const size_t D = static_cast<size_t>(spec.mtp_layers);
  if (D == 0 || job_statistics.size() < 2 * D) return {};
  const double* sums = job_statistics.data() + (job_statistics.size() - 2 * D);
  std::vector<double> out;
  for (size_t k = 0; k < D; ++k) out.push_back(sums[2 * k] / std::max(sums[2 * k + 1], 1.0));
  return out;
}

namespace {
double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0.0 : s / static_cast<double>(v.size());
}
}  // namespace

std::string mtp_loss_progress(const std::vector<double>& job_statistics, const ModelSpec& spec) {
  const std::vector<double> losses = mtp_depth_losses(job_statistics, spec);
  if (losses.empty()) return {};
  char buf[48];
  std::snprintf(buf, sizeof buf, " | mtp_loss %.4f", mean(losses));
  return buf;
}

std::vector<MetricsRecord> mtp_loss_records(int step, const std::vector<double>& job_statistics,
                                            const ModelSpec& spec) {
  const std::vector<double> losses = mtp_depth_losses(job_statistics, spec);
  if (losses.empty()) return {};
  // Built by push_back, as expert_load_records (GCC 12's bogus -Wmaybe-uninitialized).
  MetricsRecord record;
  record.push_back({"step", int64_t{step}});
  record.push_back({"mtp_loss", mean(losses)});
  record.push_back({"mtp_depth_losses", losses});
  return {record};
}

}  // namespace meshtrain
