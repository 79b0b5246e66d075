#include "meshtrain/parallel/schedule.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <tuple>

namespace meshtrain {
namespace {

// Text of each Op in to_string / parse, indexed by the enum value.
constexpr std::array<std::string_view, 8> kOpText = {"F",      "B",      "SEND_F", "RECV_F",
                                                     "SEND_B", "RECV_B", "I",      "W"};

constexpr std::string_view kEndStepText = "|";

std::string_view op_text(Op op) {
  const auto i = static_cast<size_t>(op);
  return i < kOpText.size() ? kOpText[i] : "?";
}

[[noreturn]] void bad_action(std::string_view s, const std::string& why) {
  throw std::invalid_argument("invalid pipeline action \"" + std::string(s) + "\": " + why +
                              " (expected <chunk><op><microbatch> with op one of F, B, I, W, "
                              "SEND_F, RECV_F, SEND_B, RECV_B, e.g. \"2F0\" or \"1SEND_B3\"; or \"|\" "
                              "for the end of a transfer step)");
}

// Reads a non-negative decimal number at s[pos...]; advances pos past it.
int parse_count(std::string_view s, size_t& pos, const char* what) {
  const char* first = s.data() + pos;
  const char* last = s.data() + s.size();
  if (first == last || *first < '0' || *first > '9')
    bad_action(s, std::string("missing ") + what + " number");
  int value = 0;
  const auto [end, ec] = std::from_chars(first, last, value);
  if (ec != std::errc()) bad_action(s, std::string(what) + " number out of range");
  pos += static_cast<size_t>(end - first);
  return value;
}

void check_sizes(std::string_view kind, int stages, int microbatches, int virtual_stages) {
  if (stages < 1 || microbatches < 1 || virtual_stages < 1)
    throw std::invalid_argument(std::string(kind) + " schedule: stages = " +
                                std::to_string(stages) + ", microbatches = " +
                                std::to_string(microbatches) + ", virtual_stages = " +
                                std::to_string(virtual_stages) + " (each must be at least 1)");
}

}  // namespace

std::string Action::to_string() const {
  if (op == Op::EndStep) return std::string(kEndStepText);
  return std::to_string(chunk) + std::string(op_text(op)) + std::to_string(microbatch);
}

Action Action::parse(std::string_view s) {
  if (s == kEndStepText) return {0, Op::EndStep, 0};
  size_t pos = 0;
  const int chunk = parse_count(s, pos, "chunk");
  const size_t op_begin = pos;
  while (pos < s.size() && (s[pos] < '0' || s[pos] > '9')) ++pos;
  const std::string_view text = s.substr(op_begin, pos - op_begin);
  const auto it = std::find(kOpText.begin(), kOpText.end(), text);
  if (it == kOpText.end()) bad_action(s, "unknown op \"" + std::string(text) + "\"");
  const int microbatch = parse_count(s, pos, "microbatch");
  if (pos != s.size()) bad_action(s, "unexpected text after the microbatch");
  return {chunk, static_cast<Op>(it - kOpText.begin()), microbatch};
}

bool is_compute(Op op) {
  return op == Op::Forward || op == Op::Backward || op == Op::BackwardInput ||
         op == Op::BackwardWeight;
}

bool is_input_gradient(Op op) { return op == Op::Backward || op == Op::BackwardInput; }

bool is_communication(Op op) {
  return op == Op::SendForward || op == Op::RecvForward || op == Op::SendBackward ||
         op == Op::RecvBackward;
}

std::string_view schedule_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::GPipe: return "gpipe";
    case ScheduleKind::OneFOneB: return "1f1b";
    case ScheduleKind::Interleaved: return "interleaved";
    case ScheduleKind::ZeroBubbleH1: return "zb-h1";
    case ScheduleKind::ZeroBubbleV: return "zb-v";
  }
  return "?";
}

std::string_view placement_name(ChunkPlacement placement) {
  return placement == ChunkPlacement::V ? "v" : "looped";
}

int chunk_owner(int chunk, int stages, ChunkPlacement placement) {
  const int chunks = placement == ChunkPlacement::V ? 2 * stages : -1;
  if (stages < 1 || chunk < 0 || (chunks > 0 && chunk >= chunks))
    throw std::invalid_argument(
        "chunk_owner: chunk = " + std::to_string(chunk) + " with stages = " +
        std::to_string(stages) + " under the " + std::string(placement_name(placement)) +
        " placement (stages must be at least 1, the chunk at least 0" +
        (chunks > 0 ? ", and below 2 * stages = " + std::to_string(chunks) +
                          ": the V placement has exactly two chunks per rank)"
                    : ")"));
  if (placement == ChunkPlacement::Looped) return chunk % stages;
  return chunk < stages ? chunk : chunks - 1 - chunk;
}

ChunkPlacement schedule_placement(ScheduleKind kind) {
  return kind == ScheduleKind::ZeroBubbleV ? ChunkPlacement::V : ChunkPlacement::Looped;
}

std::vector<int> chunk_owners(int stages, int virtual_stages, ChunkPlacement placement) {
  std::vector<int> owners;
  for (int k = 0; k < stages * virtual_stages; ++k) owners.push_back(chunk_owner(k, stages, placement));
  return owners;
}

std::vector<int> rank_chunks(int rank, int stages, int virtual_stages, ChunkPlacement placement) {
  std::vector<int> mine;
  for (int k = 0; k < stages * virtual_stages; ++k)
    if (chunk_owner(k, stages, placement) == rank) mine.push_back(k);
  return mine;
}

int local_chunk(int chunk, int stages, ChunkPlacement placement) {
  if (placement == ChunkPlacement::V) return chunk < stages ? 0 : 1;
  return chunk / stages;
}

// Backwards run in ascending microbatch order, like every other schedule here. The makespan is
// the same either way ((m + p - 1)(F + B)), but then each rank accumulates parameter gradients
// over microbatches in the same order whatever the schedule, so switching schedules leaves the
// gradients bit-for-bit unchanged (layout invariance, DESIGN.md).
Schedule make_gpipe(int stages, int microbatches, int virtual_stages) {
  check_sizes("gpipe", stages, microbatches, virtual_stages);
  Schedule s(stages);
  for (int r = 0; r < stages; ++r) {
    for (int local = 0; local < virtual_stages; ++local)
      for (int mb = 0; mb < microbatches; ++mb)
        s[r].push_back({local * stages + r, Op::Forward, mb});
    for (int local = virtual_stages - 1; local >= 0; --local)
      for (int mb = 0; mb < microbatches; ++mb)
        s[r].push_back({local * stages + r, Op::Backward, mb});
  }
  return s;
}

// Rank r must hold stages - r - 1 forwards before its first backward can arrive: that is how
// far the first microbatch still has to travel down and back up. One more forward (the first
// of the steady phase) runs before that backward, so rank r holds at most stages - r
// activations, against m for GPipe.
Schedule make_1f1b(int stages, int microbatches) {
  check_sizes("1f1b", stages, microbatches, 1);
  Schedule s(stages);
  for (int r = 0; r < stages; ++r) {
    const int warmup = std::min(stages - r - 1, microbatches);
    for (int mb = 0; mb < warmup; ++mb) s[r].push_back({r, Op::Forward, mb});
    for (int i = 0; i + warmup < microbatches; ++i) {
      s[r].push_back({r, Op::Forward, warmup + i});
      s[r].push_back({r, Op::Backward, i});
    }
    for (int mb = std::max(microbatches - warmup, 0); mb < microbatches; ++mb)
      s[r].push_back({r, Op::Backward, mb});
  }
  return s;
}

// Megatron's order (arXiv 2104.04473, section 2.2): microbatches go through the pipeline in
// groups of `stages`; each group passes every local chunk of the rank before the next group
// enters, forwards through chunks 0..v-1 and backwards through v-1..0. The warm-up is Megatron's:
// (v - 1) * stages forwards to fill the first v - 1 chunks with one group each, plus
// 2 * (stages - r - 1) so the rank's first backward has arrived by the time it is needed.
// Half of that last term (stages - r - 1) is already deadlock-free and bubble-optimal when
// transfers are free; the other half hides transfer time. In the simulator (pp = 4, m = 8,
// v = 2, F = 1, B = 2, send = 0.5) the doubled warm-up finishes in 64 time units against 72,
// for 3 more activations held on rank 0.
Schedule make_interleaved(int stages, int microbatches, int virtual_stages) {
  check_sizes("interleaved", stages, microbatches, virtual_stages);
  if (microbatches % stages != 0)
    throw std::invalid_argument(
        "interleaved schedule: microbatches = " + std::to_string(microbatches) +
        " is not divisible by stages = " + std::to_string(stages) +
        " (microbatches go through the chunks in groups of one per stage; use a multiple of " +
        std::to_string(stages) + ", or the 1f1b schedule)");
  if (virtual_stages == 1) return make_1f1b(stages, microbatches);
  const int total = virtual_stages * microbatches;  // compute steps of each kind per rank
  Schedule s(stages);
  for (int r = 0; r < stages; ++r) {
    // The i-th forward or backward of this rank, i in [0, total).
    auto step = [&](Op op, int i) {
      const int local = (i / stages) % virtual_stages;
      const int chunk = (op == Op::Forward ? local : virtual_stages - 1 - local) * stages + r;
      const int microbatch = (i / (stages * virtual_stages)) * stages + i % stages;
      return Action{chunk, op, microbatch};
    };
    const int warmup = std::min(total, (virtual_stages - 1) * stages + 2 * (stages - r - 1));
    for (int i = 0; i < warmup; ++i) s[r].push_back(step(Op::Forward, i));
    for (int i = 0; i + warmup < total; ++i) {
      s[r].push_back(step(Op::Forward, warmup + i));
      s[r].push_back(step(Op::Backward, i));
    }
    for (int i = total - warmup; i < total; ++i) s[r].push_back(step(Op::Backward, i));
  }
  return s;
}

// Rank r delays each weight gradient by r microbatches: W(j) follows I(j + r). So rank r holds
// its 1F1B count of stages - r microbatches between forward and input gradient plus r awaiting
// their weight gradient, stages in all, which is 1F1B's peak (rank 0's). The delayed Ws are
// what fills the cool-down: once the last input gradients pass, rank r still has r weight
// gradients to run while the ranks above it finish, and the last rank starts its final W's
// exactly when rank 0 would otherwise have waited.
Schedule make_zb_h1(int stages, int microbatches) {
  check_sizes("zb-h1", stages, microbatches, 1);
  const int p = stages, m = microbatches;
  Schedule s(p);
  for (int r = 0; r < p; ++r) {
    std::vector<Action>& list = s[r];
    int inputs = 0, weights = 0;
    auto input_then_maybe_weight = [&] {
      list.push_back({r, Op::BackwardInput, inputs++});
      if (inputs - 1 - weights >= r) list.push_back({r, Op::BackwardWeight, weights++});
    };
    const int warmup = std::min(p - r - 1, m);
    for (int mb = 0; mb < warmup; ++mb) list.push_back({r, Op::Forward, mb});
    for (int mb = warmup; mb < m; ++mb) {
      list.push_back({r, Op::Forward, mb});
      input_then_maybe_weight();
    }
    while (inputs < m) input_then_maybe_weight();
    while (weights < m) list.push_back({r, Op::BackwardWeight, weights++});
  }
  return s;
}

namespace {

// The schedules that run a fixed number of chunks per rank refuse any other.
void require_virtual_stages(ScheduleKind kind, int virtual_stages, int required, const char* why) {
  if (virtual_stages != required)
    throw std::invalid_argument(std::string(schedule_name(kind)) + " schedule: virtual_stages = " +
                                std::to_string(virtual_stages) + " is not supported (" + why + ")");
}

}  // namespace

Schedule make_schedule(ScheduleKind kind, int stages, int microbatches, int virtual_stages) {
  switch (kind) {
    case ScheduleKind::GPipe: return make_gpipe(stages, microbatches, virtual_stages);
    case ScheduleKind::OneFOneB:
      require_virtual_stages(kind, virtual_stages, 1,
                             "1f1b runs one chunk per rank; use the interleaved schedule for "
                             "virtual_stages > 1");
      return make_1f1b(stages, microbatches);
    case ScheduleKind::Interleaved:
      return make_interleaved(stages, microbatches, virtual_stages);
    case ScheduleKind::ZeroBubbleH1:
      require_virtual_stages(kind, virtual_stages, 1, "zb-h1 runs one chunk per rank");
      return make_zb_h1(stages, microbatches);
    case ScheduleKind::ZeroBubbleV:
      require_virtual_stages(kind, virtual_stages, 2, "zb-v runs exactly two chunks per rank");
      return make_zb_v(stages, microbatches);
  }
  throw std::invalid_argument("unknown schedule kind");
}

namespace {

// Where an action sits on its rank in the placement (insert_communication), by time on the
// placement clock: a compute at its end time (after everything before it ended); the transfer
// step of time t at (t, kStep), after the compute ending at t; and a receive that cannot wait
// for its producer (a deadlocking compute schedule) in a step of its own just before its
// consumer, (consumer's end, kEarlyStep). Within a step, sends come before receives.
enum Phase { kEarlyStep = -1, kCompute = 0, kStep = 1 };
struct Placed {
  int time = 0;
  int phase = kCompute;
  int order = 0;  // 0 compute, 1 send, 2 receive
  Action action;
  bool same_step(const Placed& o) const { return time == o.time && phase == o.phase; }
};

using ActionKey = std::tuple<Op, int, int>;
ActionKey key_of(const Action& a) { return {a.op, a.chunk, a.microbatch}; }

// Placement costs of a forward and a backward. Any positive costs give a placement that is
// correct under both communicator models; these, the usual ratio, make the blocking NCCL model
// lose no bubble to it on the simulator's grid.
constexpr int kForwardCost = 1, kBackwardCost = 2, kHalfBackwardCost = 1;

int placement_cost(Op op) {
  return op == Op::Forward ? kForwardCost : op == Op::Backward ? kBackwardCost : kHalfBackwardCost;
}

// Plays a compute-only schedule on the placement clock: a compute starts when its rank's previous
// compute and the compute producing its input (on any rank) have ended.
// Returns each action's end time, per rank and by action. Where no rank can go on (the schedule
// deadlocks), the first stuck rank's action is placed without its input so that every action
// still gets a time.
std::vector<std::vector<int>> play(const Schedule& compute,
                                   const std::function<std::optional<Action>(const Action&)>& producer,
                                   std::map<ActionKey, int>& end_of) {
  const size_t ranks = compute.size();
  std::vector<std::vector<int>> ends(ranks);
  auto place = [&](size_t r, int start) {
    const Action& a = compute[r][ends[r].size()];
    const int end = start + placement_cost(a.op);
    end_of[key_of(a)] = end;
    ends[r].push_back(end);
  };
  auto free_at = [&](size_t r) { return ends[r].empty() ? 0 : ends[r].back(); };
  for (;;) {
    bool moved = false;
    for (size_t r = 0; r < ranks; ++r) {
      while (ends[r].size() < compute[r].size()) {
        const Action& a = compute[r][ends[r].size()];
        int start = free_at(r);
        if (const std::optional<Action> input = producer(a)) {
          const auto it = end_of.find(key_of(*input));
          if (it == end_of.end()) break;
          start = std::max(start, it->second);
        }
        place(r, start);
        moved = true;
      }
    }
    if (moved) continue;
    size_t stuck = 0;
    while (stuck < ranks && ends[stuck].size() == compute[stuck].size()) ++stuck;
    if (stuck == ranks) return ends;
    place(stuck, free_at(stuck));
  }
}

// insert_communication's input: one compute-only list per stage, every chunk in range.
void check_compute_only(const Schedule& compute, int stages, int virtual_stages, ChunkPlacement placement) {
  const int chunks = stages * virtual_stages;
  if (stages < 1 || virtual_stages < 1 || static_cast<int>(compute.size()) != stages)
    throw std::invalid_argument("insert_communication: schedule has " +
                                std::to_string(compute.size()) + " rank lists, expected stages = " +
                                std::to_string(stages) + " (virtual_stages = " +
                                std::to_string(virtual_stages) + ")");
  if (placement == ChunkPlacement::V && virtual_stages != 2)
    throw std::invalid_argument("insert_communication: virtual_stages = " +
                                std::to_string(virtual_stages) +
                                " under the v placement, which has exactly 2 chunks per rank");
  for (int r = 0; r < stages; ++r) {
    for (const Action& a : compute[r]) {
      if (!is_compute(a.op))
        throw std::invalid_argument("insert_communication: rank " + std::to_string(r) +
                                    " already has the communication action " + a.to_string() +
                                    " (expected a compute-only schedule)");
      if (a.chunk < 0 || a.chunk >= chunks)
        throw std::invalid_argument("insert_communication: rank " + std::to_string(r) +
                                    " action " + a.to_string() + " names chunk " +
                                    std::to_string(a.chunk) + ", outside [0, " +
                                    std::to_string(chunks) + ")");
    }
  }
}

}  // namespace

Schedule insert_communication(const Schedule& compute, int stages, int virtual_stages,
                              ChunkPlacement placement) {
  check_compute_only(compute, stages, virtual_stages, placement);
  const int chunks = stages * virtual_stages;
  // With one stage every chunk hands over to a chunk on the same rank: nothing to transfer.
  if (stages == 1) return compute;
  auto owner = [&](int chunk) { return chunk_owner(chunk, stages, placement); };

  // The input gradient of each (chunk, microbatch): a Backward, or a BackwardInput.
  std::map<std::pair<int, int>, Op> input_gradient;
  for (const std::vector<Action>& list : compute)
    for (const Action& a : list)
      if (is_input_gradient(a.op)) input_gradient[{a.chunk, a.microbatch}] = a.op;
  // The compute whose output `a` consumes from a neighbouring chunk, on any rank: a forward takes
  // the previous chunk's output, an input gradient the next chunk's input gradient; a weight
  // gradient only what its own rank's input gradient left. A same-rank producer still orders
  // the placement clock; only one on another rank needs a transfer (`crosses`).
  auto producer = [&](const Action& a) -> std::optional<Action> {
    if (a.op == Op::Forward)
      return a.chunk == 0 ? std::nullopt : std::optional<Action>({a.chunk - 1, Op::Forward, a.microbatch});
    if (a.op == Op::BackwardWeight || a.chunk == chunks - 1) return std::nullopt;
    const auto it = input_gradient.find({a.chunk + 1, a.microbatch});
    const Op op = it == input_gradient.end() ? Op::Backward : it->second;
    return Action{a.chunk + 1, op, a.microbatch};
  };
  auto crosses = [&](int chunk, int other) { return owner(chunk) != owner(other); };
  auto sends_output = [&](const Action& a) {
    if (a.op == Op::Forward) return a.chunk < chunks - 1 && crosses(a.chunk, a.chunk + 1);
    return is_input_gradient(a.op) && a.chunk > 0 && crosses(a.chunk, a.chunk - 1);
  };
  std::map<ActionKey, int> end_of;
  const std::vector<std::vector<int>> ends = play(compute, producer, end_of);

  Schedule out(stages);
  for (int r = 0; r < stages; ++r) {
    std::vector<Placed> placed;
    for (size_t i = 0; i < compute[r].size(); ++i) {
      const Action& a = compute[r][i];
      const int end = ends[r][i];
      const bool forward = a.op == Op::Forward;
      placed.push_back({end, kCompute, 0, a});
      if (sends_output(a))
        placed.push_back(
            {end, kStep, 1, {a.chunk, forward ? Op::SendForward : Op::SendBackward, a.microbatch}});
      if (const std::optional<Action> input = producer(a); input && crosses(a.chunk, input->chunk)) {
        const Action recv{a.chunk, forward ? Op::RecvForward : Op::RecvBackward, a.microbatch};
        const int start = end - placement_cost(a.op);
        const auto it = end_of.find(key_of(*input));
        if (it != end_of.end() && it->second <= start) placed.push_back({it->second, kStep, 2, recv});
        else placed.push_back({end, kEarlyStep, 2, recv});
      }
    }
    std::stable_sort(placed.begin(), placed.end(), [](const Placed& x, const Placed& y) {
      return std::tie(x.time, x.phase, x.order) < std::tie(y.time, y.phase, y.order);
    });
    std::vector<Action>& list = out[r];
    for (size_t i = 0; i < placed.size(); ++i) {
      const bool transfer = placed[i].phase != kCompute;
      if (transfer && i > 0 && placed[i - 1].phase != kCompute && !placed[i].same_step(placed[i - 1]))
        list.push_back({0, Op::EndStep, 0});
      list.push_back(placed[i].action);
    }
  }
  return out;
}

Schedule make_forward_only(int stages, int microbatches, int virtual_stages,
                           ChunkPlacement placement) {
  check_sizes("forward-only", stages, microbatches, virtual_stages);
  Schedule compute(stages);
  for (int r = 0; r < stages; ++r) {
    const std::vector<int> chunks = rank_chunks(r, stages, virtual_stages, placement);
    for (int m = 0; m < microbatches; ++m)
      for (int k : chunks) compute[r].push_back({k, Op::Forward, m});
  }
  return insert_communication(compute, stages, virtual_stages, placement);
}

std::string format_schedule(const Schedule& schedule, const std::vector<ActionPosition>& marked) {
  size_t steps = 0;
  for (const auto& list : schedule) steps = std::max(steps, list.size());
  // Cell text per (step, rank); an empty cell means the rank has no action at that step.
  std::vector<std::vector<std::string>> cells(steps, std::vector<std::string>(schedule.size()));
  size_t width = 0;
  for (size_t r = 0; r < schedule.size(); ++r) {
    const std::string header = "rank " + std::to_string(r);
    width = std::max(width, header.size());
    for (size_t i = 0; i < schedule[r].size(); ++i) {
      std::string text = schedule[r][i].to_string();
      const ActionPosition here{static_cast<int>(r), static_cast<int>(i)};
      if (std::find(marked.begin(), marked.end(), here) != marked.end()) text = "[" + text + "]";
      width = std::max(width, text.size());
      cells[i][r] = std::move(text);
    }
  }
  std::ostringstream out;
  auto row = [&](const std::string& label, auto&& cell) {
    std::string line = label;
    line.resize(6, ' ');
    for (size_t r = 0; r < schedule.size(); ++r) {
      std::string text = cell(r);
      text.resize(width + 2, ' ');
      line += text;
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out << line << '\n';
  };
  row("step", [](size_t r) { return "rank " + std::to_string(r); });
  for (size_t i = 0; i < steps; ++i) row(std::to_string(i), [&](size_t r) { return cells[i][r]; });
  return out.str();
}

}  // namespace meshtrain
