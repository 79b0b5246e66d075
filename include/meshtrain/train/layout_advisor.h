#pragma once
// The strategy advisor: ranks every valid layout of a deck on a world size by predicted step
// time (time_model.h) among those whose exact memory plan (planner.h) fits a budget. Behind
// `meshtrain plan --all --time` and the "auto" values of parallel.* and train.micro_batch.
//
// The work is bounded so that any deck answers in seconds: a lower bound of each layout's time
// needs no simulation (time_model.h step_time_lower_bound); layouts are simulated in order of
// their bounds only until the fastest ones are known for certain (a simulated time below every
// remaining bound), and the exact memory plan (a dry run per stage) is run on those, in order
// of predicted time, only until `top` of them fit.

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/config/machine_profile.h"
#include "meshtrain/train/planner.h"
#include "meshtrain/train/time_model.h"

namespace meshtrain {

// Which of a deck's layout choices the advisor may change; the rest stay as the deck has them.
struct LayoutFreedom {
  bool dp = true, tp = true, pp = true, micro_batch = true, schedule = true, zero = true,
       recompute = true;
  bool ep = true;  // a mixture of experts' parallel.ep (a dense model's is always 1)
  bool any() const { return dp || tp || pp || micro_batch || schedule || zero || recompute || ep; }
};

// What a deck leaves free: dp when "auto" (0), the rest from parallel.automatic.
LayoutFreedom freedom_of(const Config& deck);

struct RankedLayout {
  Config config;
  StepTimePrediction time;      // when predicted
  double lower_bound_s = 0;     // step_time_lower_bound
  bool predicted = false;       // simulated (else only bounded: it cannot beat those planned)
  size_t peak_bytes = 0;  // exact plan; 0 when not planned (ranked below `top` fitting ones)
  bool planned = false;
  bool fits = false;
};

struct AdvisorResult {
  std::vector<RankedLayout> ranked;  // by predicted step time, fitting ones first
  size_t layouts = 0;                // valid layouts considered
  size_t predicted = 0;              // of which simulated (the rest bounded, and slower)
  size_t planned = 0;                // of which memory was planned
  size_t stopped_over_budget = 0;    // not planned to the end: a stage went past the budget
  size_t fitting = 0;                // of those, fitting the budget
};

// Every layout of `base` on `world` ranks that `freedom` allows (the fixed choices as in
// `base`), ranked. `budget`: bytes per rank (0: no limit). Stops planning memory once `top`
// layouts fit (0: plan every one).
AdvisorResult advise_layouts(const Config& base, int world, const MachineProfile& profile,
                             const LayoutFreedom& freedom, size_t budget, int threads, size_t top);

// Refuses (DeckError) a deck whose "auto" choices leave no valid layout on `world` ranks (a
// global batch no data-parallel size divides, ...), naming the "auto" keys and check_layout's
// reasons: before a profile is measured or a layout timed, not after.
void refuse_impossible_auto_layout(const Config& deck, int world);

// What a deck's "auto" choices settle on, for `train` and `plan --time` alike: the deck's
// freedom ranked on `world` ranks until two layouts fit (the choice and its runner-up).
struct AutoLayoutChoice {
  AdvisorResult advice;
  std::optional<Config> config;  // advice.ranked[0] with no "auto" left; none when nothing fits
};
AutoLayoutChoice choose_auto_layout(const Config& deck, int world, const MachineProfile& profile,
                                    size_t budget, int threads);

}  // namespace meshtrain
