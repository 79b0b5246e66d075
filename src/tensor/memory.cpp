#include "meshtrain/tensor/memory.h"

#include <cstdio>

namespace meshtrain {

void MemoryTracker::on_allocate(MemoryCategory c, size_t bytes) {
  size_t i = index(c);
  current_[i] += bytes;
  current_total_ += bytes;
  if (current_[i] > peak_[i]) peak_[i] = current_[i];
  if (current_total_ > peak_total_) {
    peak_total_ = current_total_;
    at_peak_ = current_;
  }
  if (limit_ > 0 && current_total_ > limit_)
    throw MemoryLimitExceeded(format_bytes(static_cast<double>(current_total_)) + " held, past the limit of " +
                              format_bytes(static_cast<double>(limit_)));
}

void MemoryTracker::on_release(MemoryCategory c, size_t bytes) {
  current_[index(c)] -= bytes;
  current_total_ -= bytes;
}

void MemoryTracker::reset_peaks() {
  peak_ = current_;
  at_peak_ = current_;
  peak_total_ = current_total_;
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 4) {
    bytes /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", bytes, units[u]);
  return buf;
}

namespace {

// "parameters 1.0 MiB, gradients ..., workspace 0 B; <total_label> 3.0 MiB"
std::string by_category(const std::array<size_t, kMemoryCategories>& bytes, size_t total,
                        const char* total_label) {
  std::string s;
  for (size_t i = 0; i < kMemoryCategories; ++i) {
    if (i) s += ", ";
    s += category_name(static_cast<MemoryCategory>(i));
    s += " ";
    s += format_bytes(static_cast<double>(bytes[i]));
  }
  return s + "; " + total_label + " " + format_bytes(static_cast<double>(total));
}

}  // namespace

std::string MemoryTracker::summary() const { return by_category(peak_, peak_total_, "peak total"); }

std::string MemoryTracker::in_use() const {
  return by_category(current_, current_total_, "total");
}

}  // namespace meshtrain
