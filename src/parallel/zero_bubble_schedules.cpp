// ZB-V (Qi et al., arXiv 2401.10241, section 6): the schedule generator for two chunks per rank
// in the V placement. ZB-H1, one chunk per rank and closed-form, stays in schedule.cpp.
//
// Why a list scheduler rather than a transcription of the paper's figure (warm-up forwards on
// the lower chunk, then alternating with the upper chunk's, a steady F/I/W pattern, weight
// gradients in the cool-down): a figure is one size, while a list scheduler on the unit clock
// works for any, runs each action exactly once by construction, and makes the memory cap a rule
// rather than a property of a drawing. A few priority orders and caps are tried and the shortest
// schedule kept: no one of them reaches the lower bound (schedule.h, make_zb_v) everywhere their
// minimum does.

#include <algorithm>
#include <array>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "meshtrain/parallel/schedule.h"

namespace meshtrain {
namespace {

// What a rank runs when more than one action is ready, most urgent first. Upper is the rank's
// chunk on the way back up (2 pp - 1 - r), lower its chunk on the way down (r).
enum class Pick : uint8_t { Input, UpperForward, LowerForward, Weight };
using Priority = std::array<Pick, 4>;

// Input first keeps the backward wave moving (every rank below waits for it); an upper forward
// next because its input gradient follows soon, so it frees memory sooner than a lower one;
// weight gradients last, since nobody waits for them. The other orders are what the search found
// closes the remaining gaps near m = pp.
constexpr std::array<Priority, 6> kPriorities = {{
    {Pick::Input, Pick::UpperForward, Pick::LowerForward, Pick::Weight},
    {Pick::UpperForward, Pick::Input, Pick::LowerForward, Pick::Weight},
    {Pick::UpperForward, Pick::LowerForward, Pick::Input, Pick::Weight},
    {Pick::Input, Pick::LowerForward, Pick::UpperForward, Pick::Weight},
    {Pick::Input, Pick::UpperForward, Pick::Weight, Pick::LowerForward},
    {Pick::UpperForward, Pick::Input, Pick::Weight, Pick::LowerForward},
}};

struct ListSchedule {
  Schedule compute;
  int makespan = 0;
};

// Plays ZB-V on the unit clock (F = I = W = 1 per chunk): at every tick each rank runs the first
// ready action in `priority`, a forward only while the rank holds fewer than `cap`
// chunk-microbatches between forward and weight gradient. Per chunk each op runs in
// microbatch order. Returns nothing if some tick finds no rank able to run anything while work
// remains: with the cap, that state never changes (a stuck candidate, discarded by the caller).
std::optional<ListSchedule> play_v(int p, int m, const Priority& priority, int cap) {
  const int chunks = 2 * p;
  constexpr int kNever = std::numeric_limits<int>::max();
  // End tick of each (chunk, microbatch)'s forward and input gradient.
  std::vector<int> forward_end(static_cast<size_t>(chunks) * m, kNever), input_end = forward_end;
  auto at = [m](int chunk, int mb) { return static_cast<size_t>(chunk) * m + mb; };
  // Next microbatch of each op per chunk.
  std::vector<int> next_f(chunks, 0), next_i(chunks, 0), next_w(chunks, 0);
  std::vector<int> held(p, 0);
  ListSchedule out{Schedule(p), 0};
  const long total = 6L * m * p;
  long ran = 0;
  for (int t = 0; ran < total; ++t) {
    auto forward_ready = [&](int c) {
      const int j = next_f[c];
      return j < m && (c == 0 || forward_end[at(c - 1, j)] <= t);
    };
    auto input_ready = [&](int c) {
      const int j = next_i[c];
      return j < m && forward_end[at(c, j)] <= t &&
             (c == chunks - 1 || input_end[at(c + 1, j)] <= t);
    };
    auto weight_ready = [&](int c) { return next_w[c] < m && input_end[at(c, next_w[c])] <= t; };
    std::vector<Action> picked(p, Action{0, Op::EndStep, 0});  // EndStep: idle this tick
    for (int r = 0; r < p; ++r) {
      const int lower = r, upper = chunks - 1 - r;
      // Of two ready chunks, the older microbatch first; on a tie the upper chunk.
      auto older = [&](const std::vector<int>& next, bool ready_lower, bool ready_upper) {
        if (ready_lower && ready_upper) return next[upper] <= next[lower] ? upper : lower;
        return ready_upper ? upper : ready_lower ? lower : -1;
      };
      for (Pick pick : priority) {
        int c = -1;
        Op op = Op::Forward;
        if (pick == Pick::Input) {
          c = older(next_i, input_ready(lower), input_ready(upper));
          op = Op::BackwardInput;
        } else if (pick == Pick::Weight) {
          c = older(next_w, weight_ready(lower), weight_ready(upper));
          op = Op::BackwardWeight;
        } else if (held[r] < cap) {
          const int want = pick == Pick::UpperForward ? upper : lower;
          if (forward_ready(want)) c = want;
        }
        if (c < 0) continue;
        std::vector<int>& next =
            op == Op::Forward ? next_f : op == Op::BackwardInput ? next_i : next_w;
        picked[r] = {c, op, next[c]++};
        break;
      }
    }
    bool moved = false;
    for (int r = 0; r < p; ++r) {
      const Action a = picked[r];
      if (a.op == Op::EndStep) continue;
      moved = true;
      ++ran;
      out.compute[r].push_back(a);
      out.makespan = t + 1;
      if (a.op == Op::Forward) forward_end[at(a.chunk, a.microbatch)] = t + 1, ++held[r];
      if (a.op == Op::BackwardInput) input_end[at(a.chunk, a.microbatch)] = t + 1;
      if (a.op == Op::BackwardWeight) --held[r];
    }
    if (!moved) return std::nullopt;
  }
  return out;
}

}  // namespace

Schedule make_zb_v(int stages, int microbatches) {
  if (stages < 1 || microbatches < 1)
    throw std::invalid_argument("zb-v schedule: stages = " + std::to_string(stages) +
                                ", microbatches = " + std::to_string(microbatches) +
                                " (each must be at least 1)");
  const int p = stages, m = microbatches;
  std::optional<ListSchedule> best;
  for (int cap : {2 * std::min(p, m), 2 * std::min(p, m) - 1}) {
    for (const Priority& priority : kPriorities) {
      std::optional<ListSchedule> s = play_v(p, m, priority, cap);
      if (s && (!best || s->makespan < best->makespan)) best = std::move(s);
    }
  }
  // Some candidate completes for every size the schedule test covers (1-8 stages x 1-16
  // microbatches); outside it, a size where none does is refused rather than guessed at.
  if (!best)
    throw std::logic_error("zb-v schedule: no priority order completes for stages = " +
                           std::to_string(p) + ", microbatches = " + std::to_string(m));
  return std::move(best->compute);
}

}  // namespace meshtrain
