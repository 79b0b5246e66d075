#include "meshtrain/model/qk_clip.h"

#include <algorithm>
#include <limits>
#include <stdexcept>

namespace meshtrain {

namespace {
constexpr double kNone = -std::numeric_limits<double>::infinity();
}  // namespace

QkLogitLog::QkLogitLog(int layers, int64_t heads, int64_t local_heads, int tp_rank)
    : layers_(layers), heads_(heads), local_heads_(local_heads),
      first_local_head_(int64_t{tp_rank} * local_heads), maxima_(blank()) {}

std::vector<double> QkLogitLog::blank() const {
  return std::vector<double>(static_cast<size_t>(layers_ * heads_), kNone);
}

void QkLogitLog::record(int layer, const std::vector<double>& local_max) {
  if (layer < 0 || layer >= layers_ || static_cast<int64_t>(local_max.size()) != local_heads_)
    throw std::logic_error("QkLogitLog::record: layer " + std::to_string(layer) + " with " +
                           std::to_string(local_max.size()) + " heads is outside the log");
  double* row = maxima_.data() + layer * heads_ + first_local_head_;
  for (size_t h = 0; h < local_max.size(); ++h) row[h] = std::max(row[h], local_max[h]);
}

std::vector<double> QkLogitLog::take() {
  if (!on_) return {};
  std::vector<double> out = blank();
  out.swap(maxima_);
  return out;
}

std::vector<double> qk_clip_gammas(const std::vector<double>& job_maxima, double tau) {
  std::vector<double> gammas(job_maxima.size(), 1.0);
  for (size_t i = 0; i < job_maxima.size(); ++i)
    if (job_maxima[i] > tau) gammas[i] = tau / job_maxima[i];
  return gammas;
}

QkClipSummary qk_clip_summary(const std::vector<double>& job_maxima, double tau) {
  QkClipSummary s;
  s.max_logit = kNone;
  for (double m : job_maxima) {
    s.max_logit = std::max(s.max_logit, m);
    if (m > tau) ++s.clipped_heads;
  }
  return s;
}

}  // namespace meshtrain
