#include "meshtrain/parallel/schedule_simulator.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <optional>
#include <stdexcept>

namespace meshtrain {
namespace {

constexpr int kOps = 8;  // the Ops before EndStep
constexpr Op kCommOps[] = {Op::SendForward, Op::RecvForward, Op::SendBackward, Op::RecvBackward};
constexpr size_t kMaxListedProblems = 20;

// Problems found by one checking stage, and the actions to mark in the grid.
struct Findings {
  std::vector<std::string> problems;
  std::vector<ActionPosition> marked;

  void add(std::string problem, std::vector<ActionPosition> where = {}) {
    problems.push_back(std::move(problem));
    marked.insert(marked.end(), where.begin(), where.end());
  }
};

std::string at(ActionPosition p) {
  return "rank " + std::to_string(p.rank) + " step " + std::to_string(p.step);
}

// Every question the checks and the timed run ask about a schedule, answered from one index of
// where each (op, chunk, microbatch) occurs.
class Model {
 public:
  Model(const Schedule& s, int stages, int virtual_stages, int microbatches, Passes passes,
        ChunkPlacement placement)
      : s_(s), p_(stages), chunks_(stages * virtual_stages), m_(microbatches),
        placement_(placement), backward_(passes == Passes::ForwardAndBackward),
        where_(static_cast<size_t>(kOps) * chunks_ * microbatches) {}

  const Schedule& schedule() const { return s_; }
  int chunks() const { return chunks_; }
  int microbatches() const { return m_; }
  bool backward() const { return backward_; }
  int owner(int chunk) const { return chunk_owner(chunk, p_, placement_); }
  // Whether neighbouring chunks `a` and `b` hand over on one rank (no transfer).
  bool local(int a, int b) const { return owner(a) == owner(b); }
  size_t key(Action a) const {
    return (static_cast<size_t>(a.op) * chunks_ + a.chunk) * m_ + a.microbatch;
  }
  size_t keys() const { return where_.size(); }
  std::vector<ActionPosition>& where(Action a) { return where_[key(a)]; }
  // Single position of an action known to occur exactly once.
  int step(Action a) const { return where_[key(a)].front().step; }

  // Whether (chunk, microbatch)'s backward is split into BackwardInput and BackwardWeight (any
  // of the two present), and the action computing its input gradient.
  bool split(int chunk, int microbatch) const {
    return !where_[key({chunk, Op::BackwardInput, microbatch})].empty() ||
           !where_[key({chunk, Op::BackwardWeight, microbatch})].empty();
  }
  Action input_gradient(int chunk, int microbatch) const {
    return {chunk, split(chunk, microbatch) ? Op::BackwardInput : Op::Backward, microbatch};
  }
  // The send that delivers a compute action's input from another rank, if any: where the
  // neighbouring chunk lives elsewhere under the placement.
  std::optional<Action> input_send(Action a) const {
    if (a.op == Op::Forward && a.chunk > 0 && !local(a.chunk - 1, a.chunk))
      return Action{a.chunk - 1, Op::SendForward, a.microbatch};
    if (is_input_gradient(a.op) && a.chunk < chunks_ - 1 && !local(a.chunk + 1, a.chunk))
      return Action{a.chunk + 1, Op::SendBackward, a.microbatch};
    return std::nullopt;
  }
  // The same-rank compute whose output a compute action consumes, if any: a neighbouring
  // chunk's where both share a rank (every chunk on one stage; chunks pp - 1 and pp under V),
  // and for a weight gradient always its own input gradient's.
  std::optional<Action> local_input(Action a) const {
    if (a.op == Op::BackwardWeight) return Action{a.chunk, Op::BackwardInput, a.microbatch};
    if (a.op == Op::Forward && a.chunk > 0 && local(a.chunk - 1, a.chunk))
      return Action{a.chunk - 1, Op::Forward, a.microbatch};
    if (is_input_gradient(a.op) && a.chunk < chunks_ - 1 && local(a.chunk + 1, a.chunk))
      return input_gradient(a.chunk + 1, a.microbatch);
    return std::nullopt;
  }
  // For a communication action: the compute on the same rank that produces (send) or consumes
  // (recv) its data, and the action it pairs with on the other rank.
  Action compute_of(Action a) const {
    const bool forward = a.op == Op::SendForward || a.op == Op::RecvForward;
    return forward ? Action{a.chunk, Op::Forward, a.microbatch} : input_gradient(a.chunk, a.microbatch);
  }
  static Action partner(Action a) {
    switch (a.op) {
      case Op::SendForward: return {a.chunk + 1, Op::RecvForward, a.microbatch};
      case Op::RecvForward: return {a.chunk - 1, Op::SendForward, a.microbatch};
      case Op::SendBackward: return {a.chunk - 1, Op::RecvBackward, a.microbatch};
      case Op::RecvBackward: return {a.chunk + 1, Op::SendBackward, a.microbatch};
      default: return a;
    }
  }
  // Whether a communication action belongs in a complete schedule: its data crosses ranks.
  bool required(Action a) const {
    if (!backward_ && (a.op == Op::SendBackward || a.op == Op::RecvBackward)) return false;
    const bool to_next = a.op == Op::SendForward || a.op == Op::RecvBackward;
    const int other = to_next ? a.chunk + 1 : a.chunk - 1;
    return other >= 0 && other < chunks_ && !local(a.chunk, other);
  }

 private:
  const Schedule& s_;
  int p_, chunks_, m_;
  ChunkPlacement placement_;
  bool backward_;
  std::vector<std::vector<ActionPosition>> where_;
};

Findings check_shape(Model& model, int stages) {
  Findings f;
  const Schedule& s = model.schedule();
  if (static_cast<int>(s.size()) != stages) {
    f.add("the schedule has " + std::to_string(s.size()) + " rank lists, expected stages = " +
          std::to_string(stages));
    return f;
  }
  for (int r = 0; r < stages; ++r) {
    for (int i = 0; i < static_cast<int>(s[r].size()); ++i) {
      const Action a = s[r][i];
      const ActionPosition here{r, i};
      if (a.op == Op::EndStep) continue;
      if (static_cast<int>(a.op) >= kOps)
        f.add(at(here) + ": unknown op " + std::to_string(static_cast<int>(a.op)), {here});
      else if (a.chunk < 0 || a.chunk >= model.chunks())
        f.add(at(here) + ": " + a.to_string() + " names chunk " + std::to_string(a.chunk) +
                  ", outside [0, " + std::to_string(model.chunks()) + ")",
              {here});
      else if (a.microbatch < 0 || a.microbatch >= model.microbatches())
        f.add(at(here) + ": " + a.to_string() + " names microbatch " +
                  std::to_string(a.microbatch) + ", outside [0, " +
                  std::to_string(model.microbatches()) + ")",
              {here});
      else if (model.owner(a.chunk) != r)
        f.add(at(here) + ": " + a.to_string() + " belongs to chunk " + std::to_string(a.chunk) +
                  ", which lives on rank " + std::to_string(model.owner(a.chunk)),
              {here});
      else
        model.where(a).push_back(here);
    }
  }
  return f;
}

void check_count(Model& model, Action a, bool expected, Findings& f) {
  const std::vector<ActionPosition>& w = model.where(a);
  if (expected && w.empty()) {
    std::string why;
    if (!is_compute(a.op))
      why = " (pairs with " + Model::partner(a).to_string() + " on rank " +
            std::to_string(model.owner(Model::partner(a).chunk)) + ")";
    f.add("missing " + a.to_string() + " on rank " + std::to_string(model.owner(a.chunk)) + why);
  } else if (expected && w.size() > 1) {
    std::string list;
    for (const ActionPosition& p : w) list += (list.empty() ? "" : ", ") + at(p);
    f.add("duplicated " + a.to_string() + " at " + list, w);
  } else if (!expected) {
    for (const ActionPosition& p : w)
      f.add("unexpected " + a.to_string() + " at " + at(p) +
                (model.backward() ? ": its data does not cross ranks, so there is nothing to send or receive"
                                  : ": a forward-only schedule has no gradients to send or receive"),
            {p});
  }
}

Findings check_completeness(Model& model) {
  Findings f;
  for (int k = 0; k < model.chunks(); ++k) {
    for (int mb = 0; mb < model.microbatches(); ++mb) {
      check_count(model, {k, Op::Forward, mb}, true, f);
      const bool split = model.split(k, mb);
      check_count(model, {k, Op::Backward, mb}, model.backward() && !split, f);
      check_count(model, {k, Op::BackwardInput, mb}, model.backward() && split, f);
      check_count(model, {k, Op::BackwardWeight, mb}, model.backward() && split, f);
      for (Op op : kCommOps) {
        const Action a{k, op, mb};
        check_count(model, a, model.required(a), f);
      }
    }
  }
  return f;
}

// `first` must come before `second` on their (shared) rank.
void check_before(Model& model, Action first, Action second, const std::string& why,
                  Findings& f) {
  const int i = model.step(first), j = model.step(second);
  if (i < j) return;
  const int rank = model.owner(first.chunk);
  f.add(second.to_string() + " at " + at({rank, j}) + " runs before " + first.to_string() +
            " (step " + std::to_string(i) + "), but " + why,
        {{rank, i}, {rank, j}});
}

Findings check_order(Model& model) {
  Findings f;
  for (int k = 0; k < model.chunks(); ++k) {
    for (int mb = 0; mb < model.microbatches(); ++mb) {
      const Action fwd{k, Op::Forward, mb}, bwd = model.input_gradient(k, mb);
      if (model.backward())
        check_before(model, fwd, bwd, "a backward needs its forward's activations", f);
      if (model.backward() && model.split(k, mb))
        check_before(model, bwd, {k, Op::BackwardWeight, mb},
                     "a weight gradient needs what its input gradient computed", f);
      for (Action c : {fwd, bwd})
        if (c.op == Op::Forward || model.backward())
          if (auto local = model.local_input(c))
          check_before(model, *local, c, "it consumes that action's output on the same rank", f);
      for (Op op : kCommOps) {
        const Action a{k, op, mb};
        if (!model.required(a)) continue;
        const bool send = op == Op::SendForward || op == Op::SendBackward;
        if (send) check_before(model, model.compute_of(a), a, "a send needs its data", f);
        else check_before(model, a, model.compute_of(a), "a compute needs its recv posted", f);
      }
    }
  }
  return f;
}

std::string report(const std::string& what, const Findings& f, const Schedule& s) {
  std::string out = what + " (" + std::to_string(f.problems.size()) + " problem" +
                    (f.problems.size() == 1 ? "" : "s") + "):\n";
  for (size_t i = 0; i < f.problems.size() && i < kMaxListedProblems; ++i)
    out += "  " + f.problems[i] + "\n";
  if (f.problems.size() > kMaxListedProblems)
    out += "  ... and " + std::to_string(f.problems.size() - kMaxListedProblems) + " more\n";
  return out + format_schedule(s, f.marked);
}

// Ends a timed run: a deadlock report, or the makespan and bubble from the ranks' clocks.
void finish(const Findings& stuck, const std::vector<double>& clock, const Schedule& s,
            SimulationResult& result) {
  if (!stuck.problems.empty()) {
    result.busy.clear();
    result.error = report("schedule deadlocks: no rank can make progress", stuck, s);
    return;
  }
  result.ok = true;
  result.finish = clock;
  result.makespan = clock.empty() ? 0.0 : *std::max_element(clock.begin(), clock.end());
  double busy = 0.0;
  for (double b : result.busy) busy += b;
  result.bubble_fraction =
      result.makespan > 0.0 ? 1.0 - busy / (static_cast<double>(clock.size()) * result.makespan) : 0.0;
}

// The timed run under MPI. Each action's time depends only on its rank's previous action and on the sends
// it waits for, so ranks can be advanced in any order, each as far as it can go, until none
// moves; the times come out the same as in a time-ordered event simulation.
void run(Model& model, const SimulationCosts& costs, SimulationResult& result) {
  const Schedule& s = model.schedule();
  const int ranks = static_cast<int>(s.size());
  const double never = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> done(model.keys(), never);  // when each action finished (sends, posts: ran)
  std::vector<size_t> pc(ranks, 0);
  std::vector<double> clock(ranks, 0.0);
  result.busy.assign(ranks, 0.0);
  // Time at which compute `a` may start on its rank as far as its inputs go, or NaN while a
  // send it needs has not run.
  auto inputs_ready = [&](Action a) {
    double t = 0.0;
    if (is_input_gradient(a.op)) t = done[model.key({a.chunk, Op::Forward, a.microbatch})];
    if (auto local = model.local_input(a)) t = std::max(t, done[model.key(*local)]);
    if (auto send = model.input_send(a)) {
      const double sent = done[model.key(*send)];
      if (std::isnan(sent)) return never;
      const double posted = done[model.key(Model::partner(*send))];
      t = std::max(t, std::max(sent, posted) + costs.send);
    }
    return t;
  };
  for (bool moved = true; moved;) {
    moved = false;
    for (int r = 0; r < ranks; ++r) {
      for (; pc[r] < s[r].size(); ++pc[r], moved = true) {
        const Action a = s[r][pc[r]];
        if (a.op == Op::EndStep) continue;
        if (is_compute(a.op)) {
          const double ready = inputs_ready(a);
          if (std::isnan(ready)) break;
          const double cost = costs.of(a);
          clock[r] = std::max(clock[r], ready) + cost;
          result.busy[r] += cost;
        }
        done[model.key(a)] = clock[r];
      }
    }
  }
  Findings stuck;
  for (int r = 0; r < ranks; ++r) {
    if (pc[r] == s[r].size()) continue;
    const ActionPosition here{r, static_cast<int>(pc[r])};
    const Action a = s[r][pc[r]];
    // The order checks leave a send from another rank as the only thing a compute can wait
    // for; should that ever change, still report rather than guess.
    const std::optional<Action> input = model.input_send(a);
    if (!input) {
      stuck.add(at(here) + " (" + a.to_string() + ") waits for an input its own rank never made",
                {here});
      continue;
    }
    const Action send = *input;
    const int peer = model.owner(send.chunk);
    stuck.add(at(here) + " (" + a.to_string() + ") waits for " + send.to_string() + " from " +
                  at({peer, model.step(send)}) + ", but rank " + std::to_string(peer) +
                  " is blocked at step " + std::to_string(pc[peer]) + " (" +
                  s[peer][pc[peer]].to_string() + ")",
              {here});
  }
  finish(stuck, clock, s, result);
}

std::string ordinal(size_t n) {
  const char* suffix = (n % 100 >= 11 && n % 100 <= 13) ? "th"
                       : n % 10 == 1                    ? "st"
                       : n % 10 == 2                    ? "nd"
                       : n % 10 == 3                    ? "rd"
                                                        : "th";
  return std::to_string(n) + suffix;
}

// Under NCCL the k-th send from rank a to rank b is the k-th receive at b from a, whatever the
// two actions say; both must be the same transfer. Reports the first wrong pair of each link.
Findings check_matching(Model& model) {
  Findings f;
  const Schedule& s = model.schedule();
  const size_t ranks = s.size();
  // sent[a][b]: positions of rank a's sends to b in issue order; received[b][a] likewise.
  std::vector<std::vector<std::vector<ActionPosition>>> sent(
      ranks, std::vector<std::vector<ActionPosition>>(ranks)),
      received = sent;
  for (size_t r = 0; r < ranks; ++r) {
    for (size_t i = 0; i < s[r].size(); ++i) {
      const Action a = s[r][i];
      if (!is_communication(a.op)) continue;
      const size_t peer = static_cast<size_t>(model.owner(Model::partner(a).chunk));
      const bool send = a.op == Op::SendForward || a.op == Op::SendBackward;
      (send ? sent : received)[r][peer].push_back({static_cast<int>(r), static_cast<int>(i)});
    }
  }
  for (size_t a = 0; a < ranks; ++a) {
    for (size_t b = 0; b < ranks; ++b) {
      const auto& out = sent[a][b];
      const auto& in = received[b][a];
      for (size_t k = 0; k < out.size() && k < in.size(); ++k) {
        const Action x = s[a][out[k].step], y = s[b][in[k].step];
        if (Model::partner(x) == y) continue;
        f.add("the " + ordinal(k + 1) + " message from rank " + std::to_string(a) + " to rank " +
                  std::to_string(b) + " is " + x.to_string() + " (" + at(out[k]) +
                  "), but rank " + std::to_string(b) + " receives its " + ordinal(k + 1) +
                  " message from rank " + std::to_string(a) + " as " + y.to_string() + " (" +
                  at(in[k]) + "): NCCL matches messages between two ranks in issue order, not by tag",
              {out[k], in[k]});
        break;
      }
    }
  }
  return f;
}

// The timed run under NCCL. Each rank's host runs its list in order: a transfer step is issued
// to the rank's communication stream without waiting; a compute waits until the step receiving
// its input has completed. Each stream runs its steps one at a time, in issue order.
class NcclRun {
 public:
  NcclRun(Model& model, const SimulationCosts& costs, SimulationResult& result)
      : model_(model), s_(model.schedule()), costs_(costs), result_(result),
        ranks_(static_cast<int>(s_.size())), units_(static_cast<size_t>(ranks_)),
        step_of_(model.keys(), -1), matched_(model.keys(), kNever), host_(ranks_, 0),
        stream_(static_cast<size_t>(ranks_)), clock_(ranks_, 0.0), stream_free_(ranks_, 0.0) {
    group_steps();
  }

  void run() {
    result_.busy.assign(ranks_, 0.0);
    for (bool moved = true; moved;) {
      moved = false;
      for (int r = 0; r < ranks_; ++r) moved |= advance_host(r);
      for (int r = 0; r < ranks_; ++r) moved |= advance_stream(r);
    }
    Findings stuck;
    for (int r = 0; r < ranks_; ++r) report_stuck(r, stuck);
    finish(stuck, clock_, s_, result_);
  }

 private:
  static constexpr double kNever = std::numeric_limits<double>::quiet_NaN();
  struct Step {
    int rank = 0;
    std::vector<int> actions;  // positions in the rank's list
    double issued = kNever;
    double done = kNever;
  };
  struct Unit {  // what the host does next: one compute, or issuing one transfer step
    int action = -1;
    int step = -1;
  };

  // Consecutive transfers of a rank's list form one step, issued together.
  void group_steps() {
    for (int r = 0; r < ranks_; ++r) {
      int open = -1;
      for (int i = 0; i < static_cast<int>(s_[r].size()); ++i) {
        const Action a = s_[r][i];
        if (!is_communication(a.op)) {
          open = -1;
          if (is_compute(a.op)) units_[r].push_back({i, -1});
          continue;
        }
        if (open < 0) {
          open = static_cast<int>(steps_.size());
          steps_.push_back({r, {}});
          units_[r].push_back({-1, open});
        }
        steps_[open].actions.push_back(i);
        step_of_[model_.key(a)] = open;
      }
    }
  }

  int input_step(Action a) const {
    const std::optional<Action> send = model_.input_send(a);
    return send ? step_of_[model_.key(Model::partner(*send))] : -1;
  }
  double head_start(int r) const { return std::max(steps_[stream_[r].front()].issued, stream_free_[r]); }

  // Rank r's host runs its list until a compute waits for a transfer step not yet complete.
  bool advance_host(int r) {
    bool moved = false;
    for (; host_[r] < units_[r].size(); ++host_[r], moved = true) {
      const Unit u = units_[r][host_[r]];
      if (u.step >= 0) {
        steps_[u.step].issued = clock_[r];
        stream_[r].push_back(u.step);
        continue;
      }
      const Action a = s_[r][u.action];
      double ready = 0.0;
      if (const int st = input_step(a); st >= 0) {
        if (std::isnan(steps_[st].done)) break;
        ready = steps_[st].done;
      }
      const double cost = costs_.of(a);
      clock_[r] = std::max(clock_[r], ready) + cost;
      result_.busy[r] += cost;
    }
    return moved;
  }

  // Rank r's stream completes its head step once every transfer in it met its partner, which must
  // be at the head of its own rank's stream.
  bool advance_stream(int r) {
    if (stream_[r].empty()) return false;
    bool moved = false;
    const Step& head = steps_[stream_[r].front()];
    const double start = head_start(r);
    double done = start;
    bool complete = true;
    for (int i : head.actions) {
      const Action a = s_[r][i];
      if (std::isnan(matched_[model_.key(a)])) {
        const Action p = Model::partner(a);
        const int q = model_.owner(p.chunk);
        if (stream_[q].empty() || stream_[q].front() != step_of_[model_.key(p)]) {
          complete = false;
          continue;
        }
        matched_[model_.key(a)] = matched_[model_.key(p)] = std::max(start, head_start(q)) + costs_.send;
        moved = true;
      }
      done = std::max(done, matched_[model_.key(a)]);
    }
    if (!complete) return moved;
    steps_[stream_[r].front()].done = stream_free_[r] = done;
    stream_[r].pop_front();
    return true;
  }

  std::string where_host(int r) const {
    if (host_[r] == units_[r].size()) return "has run its whole list";
    const Unit u = units_[r][host_[r]];
    const int i = u.step >= 0 ? steps_[u.step].actions.front() : u.action;
    return "is at step " + std::to_string(i) + " (" + s_[r][i].to_string() + ")";
  }

  // Where rank r stopped, if it did: its host waiting for a step, its stream for a partner.
  void report_stuck(int r, Findings& stuck) const {
    if (host_[r] < units_[r].size()) {
      const int i = units_[r][host_[r]].action;
      const Step& wanted = steps_[input_step(s_[r][i])];
      stuck.add(at({r, i}) + " (" + s_[r][i].to_string() + ") waits for its transfer step at " +
                    at({r, wanted.actions.front()}) + " to complete",
                {{r, i}});
    }
    if (stream_[r].empty()) return;
    const Step& head = steps_[stream_[r].front()];
    for (int i : head.actions) {
      const Action a = s_[r][i];
      if (!std::isnan(matched_[model_.key(a)])) continue;
      const Action p = Model::partner(a);
      const int q = model_.owner(p.chunk);
      const Step& other = steps_[step_of_[model_.key(p)]];
      std::string state;
      if (std::isnan(other.issued))
        state = "not issued yet: rank " + std::to_string(q) + " " + where_host(q);
      else
        state = "queued on rank " + std::to_string(q) + "'s stream behind its step at " +
                at({q, steps_[stream_[q].front()].actions.front()}) + " (" +
                s_[q][steps_[stream_[q].front()].actions.front()].to_string() + ")";
      stuck.add("rank " + std::to_string(r) + "'s stream is blocked at " + at({r, i}) + " (" +
                    a.to_string() + "): it waits for " + p.to_string() + " at " +
                    at({q, model_.step(p)}) + ", " + state,
                {{r, i}});
    }
  }

  Model& model_;
  const Schedule& s_;
  const SimulationCosts& costs_;
  SimulationResult& result_;
  const int ranks_;
  std::vector<Step> steps_;
  std::vector<std::vector<Unit>> units_;
  std::vector<int> step_of_;        // the step holding each communication action
  std::vector<double> matched_;     // when each transfer met its partner
  std::vector<size_t> host_;
  std::vector<std::deque<int>> stream_;  // issued steps not yet complete
  std::vector<double> clock_, stream_free_;
};

void run_nccl(Model& model, const SimulationCosts& costs, SimulationResult& result) {
  NcclRun(model, costs, result).run();
}

// Activations held: forwards done whose backward has not run, counted in list order. A split
// backward holds its microbatch until the weight gradient, which still needs the layers' inputs.
std::vector<int> peak_in_flight(const Schedule& s) {
  std::vector<int> peak(s.size(), 0);
  for (size_t r = 0; r < s.size(); ++r) {
    int held = 0;
    for (const Action& a : s[r]) {
      if (a.op == Op::Forward) peak[r] = std::max(peak[r], ++held);
      if (a.op == Op::Backward || a.op == Op::BackwardWeight) --held;
    }
  }
  return peak;
}

}  // namespace

std::string_view comm_model_name(CommModel model) {
  return model == CommModel::Nccl ? "nccl" : "mpi";
}

double SimulationCosts::of(Action a) const {
  const auto chunk = static_cast<size_t>(a.chunk);
  if (a.op == Op::BackwardInput && !chunk_input.empty()) return chunk_input.at(chunk);
  if (a.op == Op::BackwardWeight && !chunk_weight.empty()) return chunk_weight.at(chunk);
  const std::vector<double>& per_chunk = a.op == Op::Forward ? chunk_forward : chunk_backward;
  const double whole = !per_chunk.empty() ? per_chunk.at(static_cast<size_t>(a.chunk))
                       : a.op == Op::Forward ? forward
                                             : backward;
  if (a.op == Op::BackwardInput) return whole * (1.0 - weight_share);
  if (a.op == Op::BackwardWeight) return whole * weight_share;
  return whole;
}

SimulationResult simulate(const Schedule& with_communication, int stages, int virtual_stages,
                          int microbatches, SimulationCosts costs, CommModel comm,
                          Passes passes, ChunkPlacement placement) {
  if (stages < 1 || virtual_stages < 1 || microbatches < 1)
    throw std::invalid_argument("simulate: stages = " + std::to_string(stages) +
                                ", virtual_stages = " + std::to_string(virtual_stages) +
                                ", microbatches = " + std::to_string(microbatches) +
                                " (each must be at least 1)");
  if (placement == ChunkPlacement::V && virtual_stages != 2)
    throw std::invalid_argument("simulate: virtual_stages = " + std::to_string(virtual_stages) +
                                " under the v placement, which has exactly 2 chunks per rank");
  for (const std::vector<double>* v : {&costs.chunk_forward, &costs.chunk_backward})
    if (!v->empty() && v->size() != static_cast<size_t>(stages) * virtual_stages)
      throw std::invalid_argument("simulate: " + std::to_string(v->size()) + " per-chunk costs for " +
                                  std::to_string(stages * virtual_stages) + " chunks");
  const Schedule& s = with_communication;
  SimulationResult result;
  Model model(s, stages, virtual_stages, microbatches, passes, placement);
  if (Findings f = check_shape(model, stages); !f.problems.empty()) {
    result.error = report("schedule malformed", f, s);
    return result;
  }
  if (Findings f = check_completeness(model); !f.problems.empty()) {
    result.error = report("schedule incomplete", f, s);
    return result;
  }
  if (Findings f = check_order(model); !f.problems.empty()) {
    result.error = report("schedule out of dependency order", f, s);
    return result;
  }
  if (comm == CommModel::Nccl) {
    if (Findings f = check_matching(model); !f.problems.empty()) {
      result.error = report("schedule mismatches messages under nccl", f, s);
      return result;
    }
    run_nccl(model, costs, result);
  } else {
    run(model, costs, result);
  }
  if (!result.ok) result.error = "under " + std::string(comm_model_name(comm)) + ": " + result.error;
  if (result.ok) result.peak_in_flight = peak_in_flight(s);
  return result;
}

double theoretical_bubble(ScheduleKind kind, int stages, int microbatches, int virtual_stages) {
  // Refuse exactly what make_schedule refuses.
  make_schedule(kind, stages, microbatches, virtual_stages);
  const double p = stages, m = microbatches, v = virtual_stages;
  if (kind == ScheduleKind::GPipe && virtual_stages > 1)
    return 1.0 - v * m / ((v - 1) * std::max(m, p) + m + p - 1);
  if (kind == ScheduleKind::ZeroBubbleH1) return 1.0 - 3 * m / std::max(3 * m + p - 1, 2 * (m + p - 1) + 1);
  if (kind == ScheduleKind::ZeroBubbleV) return 1.0 - 6 * m / std::max(6 * m + p - 1, m + 4 * p);
  return (p - 1) / (v * m + p - 1);
}

}  // namespace meshtrain
