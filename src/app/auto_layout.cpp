#include "meshtrain/app/auto_layout.h"

#include <algorithm>

#include "meshtrain/app/calibrate.h"
#include "meshtrain/app/launch_probe.h"
#include "meshtrain/comm/agreement.h"
#include "meshtrain/config/deck.h"
#include "meshtrain/config/deck_error.h"
#include "meshtrain/config/layout_check.h"
#include "meshtrain/tensor/memory.h"
#include "meshtrain/train/layout_advisor.h"

namespace meshtrain {

namespace {

MachineProfile agreed_profile(const Config& config, Communicator& world, int threads) {
  std::string text, error;
  const std::string& path = config.parallel.profile;
  if (path.empty()) {
    // Measured now, by every rank at once; rank 0's view (its node) is the one every rank takes.
    // One pass of 2 samples keeps start-up to a few seconds (calibrate's default of 3 passes
    // would triple it); a run that needs steadier figures names a calibrated profile instead.
    BenchReport quiet = BenchReport::quiet();
    text = format_machine_profile(measure_machine_profile(threads, 2, 1, quiet));
  } else if (world.rank() == 0) {
    try {
      text = format_machine_profile(read_machine_profile(path));
    } catch (const DeckError& e) {
      error = std::string(e.what()) + " (parallel.profile in " + config.deck_path + ")";
    }
  }
  world.broadcast_bytes(error, 0);
  if (!error.empty()) throw DeckError(error);
  world.broadcast_bytes(text, 0);
  MachineProfile profile = parse_machine_profile(path.empty() ? "<measured>" : path, text);
  profile.path = path;
  return profile;
}

std::string describe(const RankedLayout& r) {
  return layout_name(r.config) + ": " + describe_prediction(r.time) + ", " +
         format_bytes(static_cast<double>(r.peak_bytes)) + " per rank";
}

}  // namespace

std::string settle_auto_layout(Config& config, Communicator& world, int threads) {
  if (!config.parallel.automatic.any()) return "";
  // Before the profile, which start-up measures for seconds when the deck names none.
  refuse_impossible_auto_layout(config, world.size());
  const MachineProfile profile = agreed_profile(config, world, threads);
  const size_t budget = static_cast<size_t>(std::max(0.0, profile.memory_per_rank));
  // Every rank ranks the same layouts on the same profile: the same choice, no broadcast.
  const AutoLayoutChoice choice = choose_auto_layout(config, world.size(), profile, budget, threads);
  const AdvisorResult& advice = choice.advice;
  if (!choice.config)
    throw DeckError(config.deck_path + ": no layout of " + std::to_string(world.size()) + " ranks that the "
                    "deck's \"auto\" choices allow fits " + format_bytes(static_cast<double>(budget)) +
                    " per rank (the machine profile's memory_per_rank; " + std::to_string(advice.layouts) +
                    " layouts tried): `meshtrain plan " + config.deck_path + " --world " +
                    std::to_string(world.size()) + " --all --time --profile PROFILE` lists them (`meshtrain "
                    "bench --suite calibrate --out PROFILE` measures one)");
  const RankedLayout& best = advice.ranked[0];
  const std::string origin = config.parallel.profile.empty()
                                 ? "measured at start-up"
                                 : profile.source + " profile " + profile.path;
  std::string report = "layout: \"auto\" chose " + describe(best) + " (predicted on " + profile.name + ", " +
                       origin + ")";
  if (advice.fitting > 1) report += "; runner-up " + describe(advice.ranked[1]);
  config = *choice.config;
  check_layout(config, world.size());
  return world.rank() == 0 ? report : "";
}

std::string launch_warning(const Config& config, Communicator& world, int threads) {
  // A profile measured at start-up is of this launch; none is read where nothing is "auto".
  if (!config.parallel.automatic.any() || config.parallel.profile.empty()) return "";
  const LaunchShape now = current_launch(threads);
  if (world.rank() != 0) return "";
  try {
    const MachineProfile profile = read_machine_profile(config.parallel.profile);
    return launch_difference(profile.path, profile.launch(), now);
  } catch (const DeckError&) {
    return "";  // settle_auto_layout refuses it, on every rank
  }
}

}  // namespace meshtrain
