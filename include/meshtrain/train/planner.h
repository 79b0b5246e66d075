#pragma once
// The pre-flight memory planner behind `meshtrain plan`. It does not estimate from formulas
// that could drift from the code: for each pipeline stage it builds the real trainer — model
// chunks, ZeRO model state, pipeline executor — on a planned process grid (communicators that
// move nothing) and a planning backend (allocations on fake addresses, no arithmetic), runs
// training steps, and reads the memory tracker. Ranks of one stage differ only in their
// coordinates, not in what they allocate, so one dry run per stage covers the job. What the
// dry run cannot know is timing: it completes every transfer at once, so buffers that a real
// run holds a little longer (sends in flight) are released earlier; the tests hold it to 5%.

#include <array>
#include <functional>
#include <string>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/tensor/memory.h"

namespace meshtrain {

struct StagePlan {
  int pp_rank = 0;
  std::array<size_t, kMemoryCategories> peak{};     // per category, each at its own highest
  std::array<size_t, kMemoryCategories> at_peak{};  // per category, when the total peaked
  size_t peak_total = 0;
  // The category holding the most bytes when the total peaked.
  MemoryCategory dominant() const;
};

struct LayoutPlan {
  Config config;  // with dp resolved
  std::vector<StagePlan> stages;
  size_t stopped_over = 0;  // plan_layout's stop_above, when a stage went past it (no stages then)
  size_t peak() const;      // the largest stage's peak: what every rank must fit
  int peak_stage() const;
  std::string layout() const;  // "dp 2 tp 2 pp 2 1f1b m4x2 zero 1 rc none sp" ("pp 2 cp 2 1f1b")
};

// "dp 2 tp 2 pp 2 1f1b m4x2 zero 1 rc none sp": a configuration's layout in one line.
std::string layout_name(const Config& config);

// Plans `config` on `world_size` ranks with `threads` threads per rank. Throws DeckError if
// the layout is invalid for that world size.
// stop_above > 0: the dry run stops once a stage holds more than that many bytes (it cannot fit
// a budget of that size; the rest of its steps would cost seconds per layout at scale): the plan
// then has no stages and stopped_over = stop_above.
LayoutPlan plan_layout(Config config, int world_size, int threads, size_t stop_above = 0);

// plan_layout of each of `configs`, in their order. The dry runs are independent and each holds
// its own backend and grid: they run side by side on this machine's cores (OpenMP's threads, as
// OMP_NUM_THREADS allows), so `plan --all` on a login node takes its cores as the advisor does.
// The plans are the same as one at a time; an error is the first layout's (in `configs` order)
// that had one.
std::vector<LayoutPlan> plan_layouts(const std::vector<Config>& configs, int world_size, int threads,
                                     size_t stop_above = 0);


// Every valid layout of `base`'s model and global batch on `world_size` ranks: dp x tp x pp,
// micro-batch sizes (powers of two dividing the per-rank batch), schedules (interleaved with 2
// virtual stages), ZeRO 0-3, recompute modes; sequence parallelism on where tp > 1; for a
// mixture of experts, ep among the divisors of dp x cp that divide model.moe_experts.
std::vector<Config> enumerate_layouts(const Config& base, int world_size);

// The same, keeping only the layouts `keep` accepts (before checking them); `refused`, when
// given, collects the reason check_layout gave for each kept layout it refused, once each, in
// enumeration order: what a deck whose choices leave no valid layout must change.
std::vector<Config> enumerate_layouts(const Config& base, int world_size,
                                      const std::function<bool(const Config&)>& keep,
                                      std::vector<std::string>* refused);

}  // namespace meshtrain
