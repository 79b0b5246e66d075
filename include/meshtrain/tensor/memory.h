#pragma once
// Byte accounting per memory category. Every allocation meshtrain makes for training state is
// attributed to one category, so that each rank can report (and the planner can predict) where
// its memory goes. Counts are of bytes in use by tensors, not of bytes the allocator keeps cached.

#include <array>
#include <stdexcept>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace meshtrain {

enum class MemoryCategory : uint8_t {
  Parameters,
  Gradients,
  OptimizerState,
  Activations,
  CommBuffers,
  Workspace,
  // Host copies of this rank's state that an asynchronous checkpoint writes in the background
  // while training goes on (checkpoint.async).
  CheckpointSnapshot,
};
inline constexpr size_t kMemoryCategories = 7;

constexpr std::string_view category_name(MemoryCategory c) {
  switch (c) {
    case MemoryCategory::Parameters: return "parameters";
    case MemoryCategory::Gradients: return "gradients";
    case MemoryCategory::OptimizerState: return "optimizer";
    case MemoryCategory::Activations: return "activations";
    case MemoryCategory::CommBuffers: return "comm";
    case MemoryCategory::Workspace: return "workspace";
    case MemoryCategory::CheckpointSnapshot: return "snapshot";
  }
  return "?";
}

// Thrown by MemoryTracker::on_allocate past its limit (set_limit): a planner's dry run stops
// there, the plan no longer able to fit.
class MemoryLimitExceeded : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Current and peak bytes per category, plus the peak of the total (which is not the sum of the
// per-category peaks: those happen at different moments).
class MemoryTracker {
 public:
  // 0: none. Past it, on_allocate counts the bytes and throws MemoryLimitExceeded.
  void set_limit(size_t bytes) { limit_ = bytes; }
  void on_allocate(MemoryCategory c, size_t bytes);
  void on_release(MemoryCategory c, size_t bytes);

  size_t current(MemoryCategory c) const { return current_[index(c)]; }
  size_t peak(MemoryCategory c) const { return peak_[index(c)]; }
  size_t current_total() const { return current_total_; }
  size_t peak_total() const { return peak_total_; }
  // Per-category bytes at the moment the total peaked.
  size_t at_peak(MemoryCategory c) const { return at_peak_[index(c)]; }

  // Starts a new peak window (e.g. after set-up, so that a step's peak is measured alone).
  void reset_peaks();

  // One line of peaks: "parameters 1.2 GiB, gradients ..., peak total 3.4 GiB".
  std::string summary() const;
  // One line of the bytes held now: "parameters 1.2 GiB, gradients ..., total 3.4 GiB" (what an
  // out-of-memory message reports: the peaks may be from another phase of the run).
  std::string in_use() const;

 private:
  static size_t index(MemoryCategory c) { return static_cast<size_t>(c); }
  std::array<size_t, kMemoryCategories> current_{};
  std::array<size_t, kMemoryCategories> peak_{};
  std::array<size_t, kMemoryCategories> at_peak_{};
  size_t current_total_ = 0;
  size_t peak_total_ = 0;
  size_t limit_ = 0;
};

std::string format_bytes(double bytes);

}  // namespace meshtrain
