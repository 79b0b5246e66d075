#include "meshtrain/train/layout_advisor.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <omp.h>

#include "meshtrain/config/deck_error.h"

namespace meshtrain {

namespace {

bool allowed(const Config& c, const Config& base, const LayoutFreedom& f) {
  const ParallelOptions &p = c.parallel, &b = base.parallel;
  if (!f.dp && b.dp > 0 && p.dp != b.dp) return false;
  if (!f.tp && p.tp != b.tp) return false;
  if (!f.pp && p.pp != b.pp) return false;
  if (!f.ep && p.ep != b.ep) return false;
  if (!f.micro_batch && c.train.micro_batch != base.train.micro_batch) return false;
  if (!f.schedule && (p.schedule != b.schedule || (p.schedule == ScheduleKind::Interleaved &&
                                                   p.virtual_stages != b.virtual_stages)))
    return false;
  if (!f.zero && p.zero != b.zero) return false;
  // Uneven data-parallel shares cannot run under ZeRO 2/3 (deck.cpp refuses the pair).
  if (b.uneven_shares() && p.zero >= 2) return false;
  if (!f.recompute && p.recompute != b.recompute) return false;
  return true;
}

}  // namespace

LayoutFreedom freedom_of(const Config& deck) {
  const AutoLayout& a = deck.parallel.automatic;
  LayoutFreedom f;
  f.dp = deck.parallel.dp == 0;
  f.tp = a.tp;
  f.pp = a.pp;
  f.micro_batch = a.micro_batch;
  f.schedule = a.schedule;
  f.zero = a.zero;
  f.recompute = a.recompute;
  f.ep = a.ep;
  return f;
}

AdvisorResult advise_layouts(const Config& base, int world, const MachineProfile& profile,
                             const LayoutFreedom& freedom, size_t budget, int threads, size_t top) {
  AdvisorResult out;
  for (Config c : enumerate_layouts(base, world)) {
    if (!allowed(c, base, freedom)) continue;
    // A fixed schedule keeps the deck's virtual stages (the enumeration tries 2).
    if (!freedom.schedule && c.parallel.schedule == ScheduleKind::Interleaved)
      c.parallel.virtual_stages = base.parallel.virtual_stages;
    // A fixed pipeline keeps the deck's partition, when it has one for these chunks.
    if (!freedom.pp && !freedom.schedule) c.parallel.partition = base.parallel.partition;
    RankedLayout r;
    r.config = std::move(c);
    out.ranked.push_back(std::move(r));
  }
  out.layouts = out.ranked.size();
  const auto faster = [](const RankedLayout& a, const RankedLayout& b) {
    // Fastest first; ties (layouts the model cannot tell apart) go to the one holding less per
    // rank, then the simpler one (fewer ZeRO stages, less recomputation).
    if (a.time.step_s != b.time.step_s) return a.time.step_s < b.time.step_s;
    const ParallelOptions &p = a.config.parallel, &q = b.config.parallel;
    if (p.zero != q.zero) return p.zero < q.zero;
    return static_cast<int>(p.recompute) < static_cast<int>(q.recompute);
  };
  // Predictions and bounds are independent: a login node's cores share them. A DeckError (a
  // profile without what a layout needs) is the same for every layout; the first one is rethrown.
  std::string error;
  const auto each = [&](size_t begin, size_t end, const std::function<void(RankedLayout&)>& f) {
#pragma omp parallel for schedule(dynamic)
    for (size_t i = begin; i < end; ++i) {
      try {
        f(out.ranked[i]);
      } catch (const DeckError& e) {
#pragma omp critical
        if (error.empty()) error = e.what();
      }
    }
    if (!error.empty()) throw DeckError(error);
  };
  // Simulating a pipeline costs up to seconds at scale (Megatron's 1T layout: 64 stages, 512
  // micro-batches), and so does planning its memory; thousands of layouts cannot all have both.
  // So every layout gets a lower bound first (no simulation), and layouts are simulated in order
  // of their bounds, a batch at a time: a simulated layout faster than every bound not yet
  // simulated is in its final place, and its memory is planned in that order until `top` fit.
  // top = 0 asks for every one: all are simulated and planned.
  each(0, out.ranked.size(), [&](RankedLayout& r) { r.lower_bound_s = step_time_lower_bound(r.config, profile); });
  std::stable_sort(out.ranked.begin(), out.ranked.end(),
                   [](const RankedLayout& a, const RankedLayout& b) { return a.lower_bound_s < b.lower_bound_s; });
  size_t predicted = 0, final_count = 0;
  const size_t batch = 32;
  while (predicted < out.ranked.size() && (top == 0 || out.fitting < top)) {
    const size_t next = top == 0 ? out.ranked.size() : std::min(out.ranked.size(), predicted + batch);
    each(predicted, next, [&](RankedLayout& r) {
      r.time = predict_step_time(r.config, profile);
      r.predicted = true;
    });
    // The simulated ones in time order (those already final keep their places: every newly
    // simulated time is at least its bound, which is at least the frontier they beat).
    std::stable_sort(out.ranked.begin() + static_cast<std::ptrdiff_t>(final_count),
                     out.ranked.begin() + static_cast<std::ptrdiff_t>(next), faster);
    predicted = next;
    const double frontier = predicted < out.ranked.size() ? out.ranked[predicted].lower_bound_s
                                                          : std::numeric_limits<double>::infinity();
    // The rest, beyond `predicted`, are still in bound order: a simulated layout is final once
    // faster than the first of them.
    while (final_count < predicted && out.ranked[final_count].time.step_s < frontier &&
           (top == 0 || out.fitting < top)) {
      // The next final layouts' dry runs side by side, one per core (the dry runs are most of
      // the advisor's time at scale), then taken in time order exactly as one at a time: those
      // past the `top`-th that fits are dropped, so at most cores - 1 dry runs are spent beyond
      // what the ranking needs.
      size_t end = final_count;
      while (end < predicted && out.ranked[end].time.step_s < frontier &&
             (top == 0 || end - final_count < static_cast<size_t>(std::max(1, omp_get_max_threads()))))
        ++end;
      std::vector<Config> configs;
      for (size_t i = final_count; i < end; ++i) configs.push_back(out.ranked[i].config);
      // A dry run stops once a stage holds more than the budget: the fastest layouts of a large
      // model often do not fit, and the rest of their steps would cost seconds each.
      for (const LayoutPlan& plan : plan_layouts(configs, world, threads, budget)) {
        if (top != 0 && out.fitting >= top) break;
        RankedLayout& r = out.ranked[final_count++];
        if (plan.stopped_over) {
          ++out.stopped_over_budget;
          continue;
        }
        r.peak_bytes = plan.peak();
        r.planned = true;
        r.fits = budget == 0 || r.peak_bytes <= budget;
        ++out.planned;
        out.fitting += r.fits ? 1 : 0;
      }
    }
  }
  out.predicted = predicted;
  // The fitting ones first (in time order), then the planned ones that do not fit, then the
  // unplanned rest.
  std::stable_partition(out.ranked.begin(), out.ranked.end(), [](const RankedLayout& r) { return r.fits; });
  std::stable_partition(out.ranked.begin() + static_cast<std::ptrdiff_t>(out.fitting), out.ranked.end(),
                        [](const RankedLayout& r) { return r.planned; });
  return out;
}

void refuse_impossible_auto_layout(const Config& deck, int world) {
  const LayoutFreedom freedom = freedom_of(deck);
  std::vector<std::string> refused;
  const std::vector<Config> layouts = enumerate_layouts(
      deck, world, [&](const Config& c) { return allowed(c, deck, freedom); }, &refused);
  if (!layouts.empty()) return;
  const ParallelOptions& p = deck.parallel;
  std::string keys;
  const auto name = [&](bool free, const std::string& key) {
    if (free) keys += (keys.empty() ? "" : ", ") + key + " = \"auto\"";
  };
  name(p.dp == 0, "parallel.dp");
  name(freedom.tp, "parallel.tp");
  name(freedom.pp, "parallel.pp");
  name(freedom.ep, "parallel.ep");
  name(freedom.micro_batch, "train.micro_batch");
  name(freedom.schedule, "parallel.schedule");
  name(freedom.zero, "parallel.zero");
  name(freedom.recompute, "parallel.recompute");
  // check_layout's reasons name the deck; said once, in front.
  const std::string prefix = deck.deck_path + ": ";
  std::string why;
  for (size_t i = 0; i < refused.size() && i < 2; ++i) {
    std::string reason = refused[i];
    if (reason.rfind(prefix, 0) == 0) reason.erase(0, prefix.size());
    why += (i ? "; and with other choices: " : "") + reason;
  }
  throw DeckError(prefix + keys + " leave no valid layout of " + std::to_string(world) +
                  " ranks with the deck's other keys, so none can be timed: " +
                  (why.empty() ? "every combination is refused" : why));
}

AutoLayoutChoice choose_auto_layout(const Config& deck, int world, const MachineProfile& profile,
                                    size_t budget, int threads) {
  AutoLayoutChoice choice;
  choice.advice = advise_layouts(deck, world, profile, freedom_of(deck), budget, threads, 2);
  if (choice.advice.fitting == 0) return choice;
  choice.config = choice.advice.ranked[0].config;
  choice.config->parallel.automatic = AutoLayout{};
  return choice;
}

}  // namespace meshtrain
