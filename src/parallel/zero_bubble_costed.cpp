// ZB-V re-planned for measured costs (zero_bubble_costs.h): make_zb_v's list scheduler played
// on a real clock instead of its unit one.
//
// Why a waiting slack: a greedy scheduler on a real clock runs whatever is ready the moment a
// rank is free, so a rank a few hundred microseconds early for an input gradient starts a
// forward or a weight gradient instead, and the chain of input gradients behind it (every rank
// below waits for it) slips by a whole action. Allowing a rank to wait up to `slack` for a more
// urgent action is what the search over slacks trades against idling.

#include "meshtrain/parallel/zero_bubble_costs.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <set>
#include <stdexcept>
#include <utility>

#include "meshtrain/parallel/schedule_simulator.h"

namespace meshtrain {
namespace {

enum class Pick : uint8_t { Input, UpperForward, LowerForward, Weight };
using Priority = std::array<Pick, 4>;

// Every order of the four picks: which wins depends on the costs (make_zb_v's six unit-clock
// orders are among them).
std::vector<Priority> all_priorities() {
  Priority p = {Pick::Input, Pick::UpperForward, Pick::LowerForward, Pick::Weight};
  std::sort(p.begin(), p.end());
  std::vector<Priority> out;
  do out.push_back(p);
  while (std::next_permutation(p.begin(), p.end()));
  return out;
}

// The actions that add to a tied embedding's gradient on the rank holding both ends of the V:
// the head's forward (its backward runs inside) and the embedding chunk's weight gradient.
bool adds_to_tied(const Action& a, int chunks) {
  return (a.chunk == chunks - 1 && a.op == Op::Forward) || (a.chunk == 0 && a.op == Op::BackwardWeight);
}

// What a rank holds, counted in list order on the schedule with its communication: forwards
// whose input gradient has not run (their activations), input gradients whose weight gradient
// has not (their deferred weight-gradient inputs), received inputs and output gradients waiting
// for their compute (buffers posted at the receive), the sums the planner's categories see
// (activations: the first and third; workspace: the second and fourth), and forwards whose
// weight gradient has not run (the simulator's in-flight count). Per rank, each peak.
struct Held {
  std::vector<std::array<int, 7>> peak;
};
Held held_peaks(const Schedule& with_communication) {
  Held h{std::vector<std::array<int, 7>>(with_communication.size(), std::array<int, 7>{})};
  for (size_t r = 0; r < with_communication.size(); ++r) {
    int to_input = 0, to_weight = 0;
    std::set<std::pair<int, int>> inputs, gradients;  // posted receives: (chunk, micro-batch)
    for (const Action& a : with_communication[r]) {
      const std::pair<int, int> key{a.chunk, a.microbatch};
      switch (a.op) {
        case Op::Forward: ++to_input; break;
        case Op::BackwardInput: --to_input, ++to_weight; break;
        case Op::BackwardWeight: --to_weight; break;
        case Op::RecvForward: inputs.insert(key); break;
        case Op::RecvBackward: gradients.insert(key); break;
        default: break;
      }
      // A received buffer is held until the compute that consumes it has run.
      const int in = static_cast<int>(inputs.size()), grad = static_cast<int>(gradients.size());
      const std::array<int, 7> now = {to_input,      to_weight,        in, grad, to_input + in,
                                      to_weight + grad, to_input + to_weight};
      for (size_t i = 0; i < now.size(); ++i) h.peak[r][i] = std::max(h.peak[r][i], now[i]);
      if (a.op == Op::Forward) inputs.erase(key);
      if (a.op == Op::BackwardInput) gradients.erase(key);
    }
  }
  return h;
}

bool within(const Held& candidate, const Held& limit) {
  for (size_t r = 0; r < limit.peak.size(); ++r)
    for (size_t i = 0; i < limit.peak[r].size(); ++i)
      if (candidate.peak[r][i] > limit.peak[r][i]) return false;
  return true;
}

struct Candidate {
  Schedule compute;
  double makespan = 0;
};

// One play of the list scheduler on the real clock. At each event the rank that can start an
// action earliest starts it: of its actions startable within `slack` of its earliest, the first
// in `priority` (of two chunks, the older micro-batch; on a tie the upper chunk), a forward only
// while the rank holds fewer than `cap` chunk-micro-batches from F to W (a lower chunk's forward
// fewer than cap - reserve), and a tied action only
// when it is the next of `tied` (if any). Returns nothing when no rank can start anything while work
// remains (the cap or the tied order blocked every rank).
std::optional<Candidate> play(int p, int m, const ChunkActionCosts& costs, double send,
                              const Priority& priority, int cap, int reserve, double slack,
                              const std::vector<Action>& tied) {
  const int chunks = 2 * p;
  constexpr double kNotYet = std::numeric_limits<double>::infinity();
  auto at = [m](int chunk, int mb) { return static_cast<size_t>(chunk) * m + mb; };
  std::vector<double> forward_end(static_cast<size_t>(chunks) * m, kNotYet), input_end = forward_end;
  std::vector<int> next_f(chunks, 0), next_i(chunks, 0), next_w(chunks, 0), held(p, 0);
  std::vector<double> free_at(p, 0.0);
  size_t tied_next = 0;
  Candidate out{Schedule(p), 0.0};
  auto next_of = [&](Op op) -> std::vector<int>& {
    return op == Op::Forward ? next_f : op == Op::BackwardInput ? next_i : next_w;
  };
  auto cost_of = [&](int chunk, Op op) {
    const std::vector<double>& v = op == Op::Forward ? costs.forward
                                   : op == Op::BackwardInput ? costs.input
                                                             : costs.weight;
    return v[static_cast<size_t>(chunk)];
  };
  // When (chunk, op)'s next micro-batch could start on its rank; infinity if an input is missing.
  // A producer on another rank hands its output on `send` after it ends.
  auto hop = [&](int from, int to) {
    return chunk_owner(from, p, ChunkPlacement::V) == chunk_owner(to, p, ChunkPlacement::V) ? 0.0 : send;
  };
  auto ready_at = [&](int chunk, Op op, int mb) {
    if (op == Op::Forward) return chunk == 0 ? 0.0 : forward_end[at(chunk - 1, mb)] + hop(chunk - 1, chunk);
    if (op == Op::BackwardWeight) return input_end[at(chunk, mb)];
    const double below = chunk == chunks - 1 ? 0.0 : input_end[at(chunk + 1, mb)] + hop(chunk + 1, chunk);
    return std::max(forward_end[at(chunk, mb)], below);
  };
  struct Option {
    double start;
    int rank_in_priority, mb;
    Action action;
  };
  const long total = 6L * m * p;
  for (long done = 0; done < total; ++done) {
    std::optional<std::pair<int, Option>> best;  // (rank, its choice)
    for (int r = 0; r < p; ++r) {
      const int lower = r, upper = chunks - 1 - r;
      std::array<Option, 8> options;
      int count = 0;
      auto consider = [&](int chunk, Op op, int rank_in_priority) {
        const int mb = next_of(op)[chunk];
        if (mb >= m) return;
        const Action a{chunk, op, mb};
        if (!tied.empty() && adds_to_tied(a, chunks) && !(tied[tied_next] == a)) return;
        const double ready = ready_at(chunk, op, mb);
        if (ready == kNotYet) return;
        options[count++] = {std::max(ready, free_at[r]), rank_in_priority, mb, a};
      };
      for (int k = 0; k < 4; ++k) {
        switch (priority[k]) {
          case Pick::Input: consider(upper, Op::BackwardInput, k), consider(lower, Op::BackwardInput, k); break;
          case Pick::Weight: consider(upper, Op::BackwardWeight, k), consider(lower, Op::BackwardWeight, k); break;
          case Pick::UpperForward: if (held[r] < cap) consider(upper, Op::Forward, k); break;
          case Pick::LowerForward: if (held[r] < cap - reserve) consider(lower, Op::Forward, k); break;
        }
      }
      if (count == 0) continue;
      double earliest = kNotYet;
      for (int i = 0; i < count; ++i) earliest = std::min(earliest, options[i].start);
      const Option* choice = nullptr;
      for (int i = 0; i < count; ++i) {
        const Option& o = options[i];
        if (o.start > earliest + slack) continue;
        if (!choice || o.rank_in_priority < choice->rank_in_priority ||
            (o.rank_in_priority == choice->rank_in_priority && o.mb < choice->mb))
          choice = &o;
      }
      if (!best || choice->start < best->second.start) best = std::make_pair(r, *choice);
    }
    if (!best) return std::nullopt;
    const auto& [r, o] = *best;
    const Action a = o.action;
    const double end = o.start + cost_of(a.chunk, a.op);
    free_at[r] = end;
    out.makespan = std::max(out.makespan, end);
    out.compute[r].push_back(a);
    ++next_of(a.op)[a.chunk];
    if (!tied.empty() && adds_to_tied(a, chunks)) ++tied_next;
    if (a.op == Op::Forward) forward_end[at(a.chunk, a.microbatch)] = end, ++held[r];
    if (a.op == Op::BackwardInput) input_end[at(a.chunk, a.microbatch)] = end;
    if (a.op == Op::BackwardWeight) --held[r];
  }
  return out;
}

void check_costs(int stages, const ChunkActionCosts& costs) {
  const size_t chunks = 2 * static_cast<size_t>(std::max(stages, 0));
  for (const auto& [name, v] : {std::pair<const char*, const std::vector<double>*>{"forward", &costs.forward},
                                {"input", &costs.input},
                                {"weight", &costs.weight}}) {
    if (v->size() != chunks)
      throw std::invalid_argument(std::string("zb-v costs: ") + name + " has " + std::to_string(v->size()) +
                                  " entries for " + std::to_string(chunks) + " chunks");
    for (double x : *v)
      if (!(x > 0) || !std::isfinite(x))
        throw std::invalid_argument(std::string("zb-v costs: a ") + name + " cost of " + std::to_string(x) +
                                    " (each must be positive and finite)");
  }
  if (!(costs.send >= 0) || !std::isfinite(costs.send))
    throw std::invalid_argument("zb-v costs: a send time of " + std::to_string(costs.send) +
                                " (must be zero or positive, and finite)");
}

// The makespan of fixed lists (each rank runs its own in order, an action starting when its
// rank is free and its inputs have arrived, `costs.send` after a producer on another rank ends);
// infinity if some rank waits forever (a swap put a consumer before its producer).
double list_makespan(const Schedule& s, int p, int m, const ChunkActionCosts& costs) {
  const int chunks = 2 * p;
  constexpr double kNotYet = std::numeric_limits<double>::infinity();
  auto at = [m](int chunk, int mb) { return static_cast<size_t>(chunk) * m + mb; };
  std::vector<double> forward_end(static_cast<size_t>(chunks) * m, kNotYet), input_end = forward_end;
  std::vector<size_t> next(static_cast<size_t>(p), 0);
  std::vector<double> free_at(static_cast<size_t>(p), 0.0);
  auto hop = [&](int from, int to) {
    return chunk_owner(from, p, ChunkPlacement::V) == chunk_owner(to, p, ChunkPlacement::V) ? 0.0 : costs.send;
  };
  size_t left = 0;
  for (const auto& list : s) left += list.size();
  while (left > 0) {
    bool moved = false;
    for (int r = 0; r < p; ++r) {
      const auto& list = s[static_cast<size_t>(r)];
      for (size_t& i = next[static_cast<size_t>(r)]; i < list.size(); ++i) {
        const Action& a = list[i];
        double ready = 0, cost = 0;
        if (a.op == Op::Forward) {
          ready = a.chunk == 0 ? 0.0 : forward_end[at(a.chunk - 1, a.microbatch)] + hop(a.chunk - 1, a.chunk);
          cost = costs.forward[static_cast<size_t>(a.chunk)];
        } else if (a.op == Op::BackwardInput) {
          const double below = a.chunk == chunks - 1 ? 0.0
                               : input_end[at(a.chunk + 1, a.microbatch)] + hop(a.chunk + 1, a.chunk);
          ready = std::max(forward_end[at(a.chunk, a.microbatch)], below);
          cost = costs.input[static_cast<size_t>(a.chunk)];
        } else {
          ready = input_end[at(a.chunk, a.microbatch)];
          cost = costs.weight[static_cast<size_t>(a.chunk)];
        }
        if (ready == kNotYet) break;
        double& free = free_at[static_cast<size_t>(r)];
        free = std::max(free, ready) + cost;
        if (a.op == Op::Forward) forward_end[at(a.chunk, a.microbatch)] = free;
        if (a.op == Op::BackwardInput) input_end[at(a.chunk, a.microbatch)] = free;
        --left;
        moved = true;
      }
    }
    if (!moved) return kNotYet;
  }
  return *std::max_element(free_at.begin(), free_at.end());
}

// Hill climbing from `s`: swaps two neighbours in a rank's list where that keeps every per-chunk
// micro-batch order, the tied order, and the memory limit, and shortens list_makespan; passes
// until one improves nothing (or a work bound near 3 x 10^7 steps). The greedy plays leave gaps a
// swap closes: at 4 stages and more, a forward placed a moment too early holds a rank while an
// input gradient it could have run arrives.
Schedule improve_by_swaps(Schedule s, int p, int m, const ChunkActionCosts& costs,
                          const std::vector<Action>& tied, const Held& limit) {
  const int chunks = 2 * p;
  double best = list_makespan(s, p, m, costs);
  const double actions = 6.0 * m * p;
  const int max_passes = std::max(1, static_cast<int>(std::min(20.0, 3e7 / (actions * actions * p))));
  for (int pass = 0; pass < max_passes; ++pass) {
    bool improved = false;
    for (int r = 0; r < p; ++r) {
      auto& list = s[static_cast<size_t>(r)];
      for (size_t i = 0; i + 1 < list.size(); ++i) {
        const Action a = list[i], b = list[i + 1];
        if (a.chunk == b.chunk && (a.op == b.op || a.microbatch == b.microbatch)) continue;
        if (!tied.empty() && adds_to_tied(a, chunks) && adds_to_tied(b, chunks)) continue;
        std::swap(list[i], list[i + 1]);
        const double t = list_makespan(s, p, m, costs);
        if (t < best && within(held_peaks(insert_communication(s, p, 2, ChunkPlacement::V)), limit)) {
          best = t;
          improved = true;
        } else {
          std::swap(list[i], list[i + 1]);
        }
      }
    }
    if (!improved) break;
  }
  return s;
}

}  // namespace

SimulationCosts simulation_costs(const ChunkActionCosts& c) {
  SimulationCosts s;
  s.chunk_forward = c.forward;
  s.chunk_input = c.input;
  s.chunk_weight = c.weight;
  s.send = c.send;
  s.chunk_backward.resize(c.input.size());
  for (size_t k = 0; k < c.input.size(); ++k) s.chunk_backward[k] = c.input[k] + c.weight[k];
  return s;
}

CostedSchedule make_zb_v_for_costs(int stages, int microbatches, const ChunkActionCosts& costs,
                                   bool tied_embeddings) {
  const int p = stages, m = microbatches;
  const Schedule unit = make_zb_v(p, m);  // refuses what it refuses, first
  check_costs(p, costs);
  const int chunks = 2 * p;
  const SimulationCosts sim = simulation_costs(costs);
  auto simulated_with = [&](const Schedule& with_communication, CommModel model) {
    return simulate(with_communication, p, 2, m, sim, model, Passes::ForwardAndBackward, ChunkPlacement::V);
  };
  auto simulated = [&](const Schedule& compute) {
    return simulated_with(insert_communication(compute, p, 2, ChunkPlacement::V), CommModel::Mpi);
  };
  const SimulationResult base = simulated(unit);
  if (!base.ok) throw std::logic_error("zb-v costs: make_zb_v's schedule fails to simulate: " + base.error);
  CostedSchedule out{unit, false, base.makespan, base.bubble_fraction, base.makespan, base.bubble_fraction};

  std::vector<Action> tied;  // empty: no order to keep
  for (const Action& a : unit[0])
    if (tied_embeddings && adds_to_tied(a, chunks)) tied.push_back(a);
  const Held limit = held_peaks(insert_communication(unit, p, 2, ChunkPlacement::V));
  double mean = 0;
  for (int k = 0; k < chunks; ++k) mean += costs.forward[k] + costs.input[k] + costs.weight[k];
  mean /= 3.0 * chunks;
  // A play costs about 6 m p^2 x 8 option checks; bound the whole search near 10^8 of them (a
  // fraction of a second) by trying fewer slacks, then fewer orders, at large sizes. Reserving
  // forward slots for the upper chunk keeps lower forwards from filling the cap while the upper
  // chunk's input is on its way (a play that would otherwise stop with every rank blocked).
  std::vector<double> slacks = {0.0, mean / 16, mean / 8, mean / 4, mean / 2, mean};
  std::vector<Priority> priorities = all_priorities();
  const std::vector<int> reserves = {0, 1, 2, 4};
  const double per_play = 6.0 * m * p * p * 8;
  auto plays = [&] { return static_cast<double>(2 * reserves.size() * slacks.size() * priorities.size()); };
  while (per_play * plays() > 1e8 && slacks.size() > 1) slacks.pop_back();
  if (per_play * plays() > 1e8)
    priorities.resize(std::max<size_t>(1, static_cast<size_t>(1e8 / (per_play * 2 * reserves.size()))));

  // Planned with the transfer time, and without it (a schedule for free transfers sometimes
  // copes better); either way judged by the simulator under the transfer time.
  std::vector<double> sends = {costs.send};
  if (costs.send > 0) sends.push_back(0.0);
  std::optional<Candidate> best;
  for (double send : sends)
    for (int cap : {2 * std::min(p, m), 2 * std::min(p, m) - 1}) {
      if (cap < 1) continue;
      for (const Priority& priority : priorities)
        for (int reserve : reserves)
          for (double slack : slacks) {
            std::optional<Candidate> c = play(p, m, costs, send, priority, cap, reserve, slack, tied);
            if (!c) continue;
            if (send != costs.send) {  // its own clock is not the simulator's: ask the simulator
              const SimulationResult r = simulated(c->compute);
              if (!r.ok) continue;
              c->makespan = r.makespan;
            }
            if (best && c->makespan >= best->makespan) continue;
            if (!within(held_peaks(insert_communication(c->compute, p, 2, ChunkPlacement::V)), limit)) continue;
            best = std::move(c);
          }
    }
  // Swaps from the best play (or from the unit schedule, where no play beat it); then the
  // simulator's word, under both communicator models, on the result and, should it refuse, on
  // the play alone.
  std::vector<Schedule> tries;
  tries.push_back(improve_by_swaps(best ? best->compute : unit, p, m, costs, tied, limit));
  if (best) tries.push_back(std::move(best->compute));
  for (Schedule& t : tries) {
    const Schedule with = insert_communication(t, p, 2, ChunkPlacement::V);
    const SimulationResult r = simulated_with(with, CommModel::Mpi);
    const SimulationResult nccl = simulated_with(with, CommModel::Nccl);
    if (!r.ok || !nccl.ok || r.makespan >= base.makespan || !within(held_peaks(with), limit)) continue;
    out.compute = std::move(t);
    out.replanned = true;
    out.makespan = r.makespan;
    out.bubble = r.bubble_fraction;
    return out;
  }
  return out;
}

double fit_send_time(int stages, int microbatches, const ChunkActionCosts& costs,
                     double measured_makespan) {
  const int p = stages, m = microbatches;
  check_costs(p, costs);
  const Schedule unit = insert_communication(make_zb_v(p, m), p, 2, ChunkPlacement::V);
  auto makespan = [&](double send) {
    ChunkActionCosts c = costs;
    c.send = send;
    return simulate(unit, p, 2, m, simulation_costs(c), CommModel::Mpi, Passes::ForwardAndBackward,
                    ChunkPlacement::V)
        .makespan;
  };
  double mean = 0;
  for (size_t k = 0; k < costs.forward.size(); ++k) mean += costs.forward[k] + costs.input[k] + costs.weight[k];
  mean /= 3.0 * static_cast<double>(costs.forward.size());
  double low = 0, high = 4 * mean;
  if (makespan(low) >= measured_makespan) return 0;
  if (makespan(high) <= measured_makespan) return high;
  for (int i = 0; i < 30; ++i) {
    const double mid = 0.5 * (low + high);
    (makespan(mid) < measured_makespan ? low : high) = mid;
  }
  return std::round(low);
}

std::string format_chunk_costs(const ChunkActionCosts& costs) {
  std::string s;
  for (const auto& [name, v] : {std::pair<const char*, const std::vector<double>*>{"F", &costs.forward},
                                {"I", &costs.input},
                                {"W", &costs.weight}}) {
    s += s.empty() ? name : std::string(", ") + name;
    for (size_t k = 0; k < v->size(); ++k) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%s%.2f", k == 0 ? " " : "/", (*v)[k] / 1000.0);
      s += buf;
    }
  }
  char send[48];
  std::snprintf(send, sizeof send, " ms per chunk, send %.2f ms", costs.send / 1000.0);
  return s + send;
}

}  // namespace meshtrain
