#pragma once
// The straggler report: which ranks compute markedly slower than the others, window by window.
//
// Every step each rank notes its compute seconds (the pipeline executor's forward and backward
// time plus the optimizer step) and its step seconds; the rest of the step, step - compute, it
// spent waiting (for its pipeline neighbours, in the gradient reduction, for the slowest rank
// of a collective). At each log step the window of steps since the last one is closed with one
// collective over the world (an all-gather), so every rank holds the same per-rank numbers:
// compute and wait, in ms per step. A rank whose compute exceeds threshold x the median of the
// world's is slow in that window; slow in `persistence` consecutive windows, a straggler.
//
// A slow device, a throttled or shared CPU and a noisy neighbour look alike here: the report
// says who is slow and by how much, not why. In pipeline-parallel runs the stages' compute also
// differs by design (the last stage holds the head): a stage given many more layers than the
// others shows up too.
//
// This is the detection only; it changes nothing. Rebalancing (uneven data-parallel shares, a
// speed-aware pipeline partition) reads the closed window, the same on every rank.

#include <string>
#include <vector>

#include "meshtrain/comm/communicator.h"
#include "meshtrain/parallel/process_grid.h"

namespace meshtrain {

// One closed window, the same on every rank. Per-rank vectors are indexed by world rank.
struct StragglerWindow {
  int step = 0;                     // the step that closed it (1-based)
  int steps = 0;                    // steps it covers
  std::vector<double> compute_ms;   // per step, mean over the window
  std::vector<double> wait_ms;      // per step: step time minus compute
  double median_compute_ms = 0;     // over the ranks
  std::vector<int> slow;            // ranks with compute_ms > threshold x median, ascending
  std::vector<int> streak;          // per rank: consecutive windows slow, this one included
  std::vector<int> stragglers;      // ranks with streak >= persistence, ascending
};

// The median of `values` (the mean of the middle two for an even count; 0 when empty).
double median_of(std::vector<double> values);

// Pure detection: the verdict on one window's per-rank numbers, given each rank's streak of
// slow windows before it (empty: none). threshold > 1, persistence >= 1.
StragglerWindow judge_window(int step, int steps, const std::vector<double>& compute_ms,
                             const std::vector<double>& wait_ms,
                             const std::vector<int>& previous_streak, double threshold,
                             int persistence);

// Where a rank runs, for the log line.
struct RankPlace {
  std::string node;
  int dp = 0, tp = 0, pp = 0;
};

// The log line for straggler `rank` of `w` ("straggler: rank 3 (node n1, dp 3 tp 0 pp 0) computes
// 2.02x the median (210.3 vs 104.1 ms per step) in 2 consecutive windows").
std::string describe_straggler(const StragglerWindow& w, int rank, const RankPlace& place);

class StragglerMonitor {
 public:
  // Collective over grid.world(): gathers every rank's node name and grid coordinates once.
  StragglerMonitor(ProcessGrid& grid, double threshold, int persistence = 2);

  // This rank's numbers of one step (seconds).
  void add_step(double compute_seconds, double step_seconds);
  // Collective over `world` (every rank, at the same step): closes the window of the steps
  // added since the last close; returns the verdict, the same on every rank.
  const StragglerWindow& close_window(Communicator& world, int step);
  // The last closed window (steps == 0 before the first).
  const StragglerWindow& last_window() const { return window_; }
  const std::vector<RankPlace>& places() const { return places_; }

 private:
  double threshold_;
  int persistence_;
  std::vector<RankPlace> places_;  // by world rank
  double compute_sum_ = 0, step_sum_ = 0;
  int steps_ = 0;
  StragglerWindow window_;
};

}  // namespace meshtrain
