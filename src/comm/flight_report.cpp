#include "meshtrain/comm/flight_report.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <ctime>
#include <map>
#include <set>
#include <thread>
#include <utility>

namespace meshtrain {
namespace {

constexpr size_t kMaxFindings = 20;
// A record whose liveness stamp (FlightRecorder::kAliveSeconds apart) lags the newest sign of
// life among the job's records by more than this was left by a process that died. Well above
// the stamp's period, so that a busy machine delaying the stamping thread is not taken for a
// death; below any useful run.comm_timeout, which is how long the others outlive a dead rank.
constexpr double kDeadAfterSeconds = 2.0;

std::string clock_time(double t) {
  // Times come from a file: out of range of time_t (or NaN) the cast would be undefined
  // (found by fuzz/flight_record_fuzz.cpp). 1e12 s is some 30,000 years.
  if (!(t > 0 && t < 1e12)) return "?";
  const std::time_t s = static_cast<std::time_t>(t);
  std::tm tm{};
  localtime_r(&s, &tm);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%02d:%02d:%02d.%03d", tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<int>((t - static_cast<double>(s)) * 1000));
  return buf;
}

std::string size_text(uint64_t bytes) {
  char buf[32];
  if (bytes < 1024) std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  else if (bytes < (1u << 20)) std::snprintf(buf, sizeof buf, "%.1f KiB", bytes / 1024.0);
  else std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / 1048576.0);
  return buf;
}

// One member of a group instance: which record, which of its groups, its rank in the group.
struct Member {
  size_t record;
  int group;
  int rank;
};

struct Instance {
  std::string name;
  int id;
  int size;
  std::vector<Member> members;
};

class Analysis {
 public:
  explicit Analysis(const std::vector<FlightRecord>& records) : records_(records) {
    for (size_t r = 0; r < records_.size(); ++r) {
      const FlightHeader& h = records_[r].header;
      for (int g = 0; g < h.group_count; ++g) {
        const FlightGroup& fg = h.groups[g];
        const auto key = std::make_pair(std::string(fg.name, strnlen(fg.name, sizeof fg.name)), fg.id);
        auto [it, fresh] = index_.try_emplace(key, instances_.size());
        if (fresh) instances_.push_back({key.first, fg.id, fg.size, {}});
        instances_[it->second].members.push_back({r, g, fg.rank});
        instance_of_[{r, g}] = it->second;
      }
      newest_sign_ = std::max(newest_sign_, last_sign(r));
      // Only records of processes that did not end cleanly: a run stopped on SIGTERM closes its
      // record.
      if (h.closed == 0)
        for (const double end : {h.signalled, h.aborted})
          if (end > 0 && (first_signal_ == 0 || end < first_signal_)) first_signal_ = end;
    }
  }

  void run(FlightReport& report) {
    killed_together(report);
    deaths(report);
    for (const Instance& in : instances_) collectives(in, report);
    for (size_t r = 0; r < records_.size(); ++r) messages(r, report);
    std::stable_sort(report.findings.begin(), report.findings.end(),
                     [](const FlightFinding& a, const FlightFinding& b) {
                       return a.quiet != b.quiet ? a.quiet : a.when < b.when;
                     });
    if (report.findings.empty())
      for (const Instance& in : instances_) left_unevenly(in, report);
    if (report.findings.empty()) pending_operations(report);
  }

 private:
  const FlightHeader& header(size_t r) const { return records_[r].header; }
  std::string who(size_t r) const {
    return "rank " + std::to_string(header(r).world_rank) + " (node " +
           std::string(header(r).node, strnlen(header(r).node, sizeof header(r).node)) + ")";
  }
  std::string group_text(const Instance& in) const {
    std::vector<int> ranks;
    for (const Member& m : in.members) ranks.push_back(header(m.record).world_rank);
    std::sort(ranks.begin(), ranks.end());
    std::string list;
    for (int w : ranks) list += (list.empty() ? "" : ", ") + std::to_string(w);
    std::string text = "group '" + in.name + "' (world ranks " + list;
    if (static_cast<int>(in.members.size()) < in.size)
      text += "; " + std::to_string(in.size - static_cast<int>(in.members.size())) +
              " member(s) without a record";
    return text + ")";
  }
  std::string entry_text(size_t r, const FlightEntry& e) const {
    const auto it = instance_of_.find({r, e.group});
    const std::string group = it == instance_of_.end() ? "?" : instances_[it->second].name;
    std::string text = std::string(flight_op_name(e.op)) +
                       (e.op == FlightOp::BlockingCall ? "" : " of " + size_text(e.bytes)) +
                       " on group '" + group + "'";
    if (is_point_to_point(e.op))
      text += (e.op == FlightOp::Send ? " to" : " from") + std::string(" its rank ") +
              std::to_string(e.peer) + " (message #" + std::to_string(e.seq) + ")";
    else
      text += " (collective #" + std::to_string(e.seq) + ")";
    text += ", entered at " + clock_time(e.start);
    text += e.state == FlightState::Completed ? ", completed at " + clock_time(e.end)
                                              : ", still pending";
    return text;
  }
  // The last time rank r's record shows the process alive: closed, stamped, or an operation.
  double last_sign(size_t r) const {
    const FlightHeader& h = header(r);
    double t = std::max({h.opened, h.alive, h.closed});
    if (!records_[r].entries.empty())
      t = std::max({t, records_[r].entries.back().start, records_[r].entries.back().end});
    return t;
  }
  // Whether rank r's process died: its record was neither closed nor stamped alive while the
  // others' went on. Records without stamps (alive = 0, older writers) never count as dead.
  bool died(size_t r) const {
    const FlightHeader& h = header(r);
    return h.closed == 0 && h.alive > 0 &&
           (newest_sign_ - last_sign(r) > kDeadAfterSeconds || died_before_the_launcher(r));
  }
  // A launcher (mpiexec, srun) ends the job within a second of a rank's death, too soon for
  // the liveness stamps to tell: it signals (SIGTERM) the ranks still alive, whose handlers note
  // it in their records (FlightHeader::signalled), or one of them ends the job itself first
  // (FlightHeader::aborted). A record with neither, whose last sign of life came before the
  // first of the others', is the one whose process was already gone.
  bool died_before_the_launcher(size_t r) const {
    const FlightHeader& h = header(r);
    return first_signal_ > 0 && h.signalled == 0 && h.aborted == 0 && last_sign(r) < first_signal_;
  }
  // Whether rank r stopped communicating: none of its operations is pending (its last one
  // completed, and no earlier one, such as a data-parallel reduction overlapping the backward
  // pass, still waits for a peer), or it died, in the middle of an operation too.
  bool went_quiet(size_t r) const {
    const std::vector<FlightEntry>& entries = records_[r].entries;
    const bool waiting = std::any_of(entries.begin(), entries.end(), [](const FlightEntry& e) {
      return e.state == FlightState::Entered;
    });
    return !waiting || died(r);
  }
  std::string last_operation(size_t r) const {
    std::string text = operation_text(r);
    if (died(r)) text += "; its process " + death_text(r);
    return text;
  }
  std::string operation_text(size_t r) const {
    const std::vector<FlightEntry>& entries = records_[r].entries;
    if (entries.empty())
      return "it recorded no communication since it started at " + clock_time(header(r).opened);
    return "its last operation: " + entry_text(r, entries.back());
  }
  std::string death_text(size_t r) const {
    char gap[32];
    std::snprintf(gap, sizeof gap, "%.1f", newest_sign_ - last_sign(r));
    if (newest_sign_ - last_sign(r) <= kDeadAfterSeconds && died_before_the_launcher(r))
      return "died at about " + clock_time(last_sign(r)) + " (its record stopped before " +
             clock_time(first_signal_) + ", when the job was being ended: the others recorded "
             "the launcher's termination signal or their own abort, it recorded neither)";
    return "died at about " + clock_time(last_sign(r)) + " (its record was last kept alive " + gap +
           " s before the others')";
  }

  // Every record unclosed, stamped, without a termination signal or an abort, and all stopping
  // within the same moment: the whole job was killed with SIGKILL at once (MPICH's mpiexec does
  // so to every rank once one dies; an out-of-memory killer or `scancel --signal=KILL` too). The
  // records cannot tell which rank went first, so say so, with what can: the ranks' pids, which
  // the launcher's message names.
  void killed_together(FlightReport& report) const {
    if (records_.size() < 2 || first_signal_ > 0) return;
    double earliest = newest_sign_;
    for (size_t r = 0; r < records_.size(); ++r) {
      if (header(r).closed != 0 || header(r).alive == 0) return;
      earliest = std::min(earliest, last_sign(r));
    }
    if (newest_sign_ - earliest > kDeadAfterSeconds) return;
    constexpr size_t kPidsShown = 16;
    std::string pids;
    for (size_t r = 0; r < records_.size() && r < kPidsShown; ++r)
      pids += (r ? ", " : "") + who(r) + " pid " + std::to_string(header(r).pid);
    if (records_.size() > kPidsShown) pids += ", ...";
    char gap[32];
    std::snprintf(gap, sizeof gap, "%.3f", newest_sign_ - earliest);
    report.killed_whole = FlightReport::KilledWhole{
        newest_sign_,
        "every rank's record stopped within " + std::string(gap) +
        " s of the others', none closed and none noted a termination signal or its own abort: the "
        "whole job was ended at once with SIGKILL (as MPICH's mpiexec does to every rank once one "
        "of them ends, or an out-of-memory killer), so these records cannot tell which rank ended "
        "first. The launcher's output names the process it saw end first (MPICH: 'BAD "
        "TERMINATION ... PID n'); the ranks were " + pids +
        ". With `mpiexec -disable-auto-cleanup` the others outlive a rank that ends and record it "
        "(run.comm_timeout then ends them)."};
  }

  // Ranks whose process died: a finding each, whatever they were doing.
  void deaths(FlightReport& report) {
    std::vector<std::pair<double, size_t>> dead;
    for (size_t r = 0; r < records_.size(); ++r)
      if (died(r)) {
        dead.emplace_back(last_sign(r), r);
        report.findings.push_back(
            {last_sign(r), who(r) + " " + death_text(r) + "; " + operation_text(r), true, {who(r)}});
      }
    std::stable_sort(dead.begin(), dead.end());
    for (const auto& [when, r] : dead) report.deaths.push_back(who(r));
  }
  const FlightEntry* find(size_t r, int group, bool p2p, FlightOp op, int peer, uint64_t seq) const {
    for (const FlightEntry& e : records_[r].entries)
      if (e.group == group && e.seq == seq && is_point_to_point(e.op) == p2p &&
          (!p2p || (e.op == op && e.peer == peer)))
        return &e;
    return nullptr;
  }

  // The first collective some members of the group entered and others did not.
  void collectives(const Instance& in, FlightReport& report) {
    uint64_t lo = UINT64_MAX, hi = 0;
    for (const Member& m : in.members) {
      const uint64_t n = header(m.record).groups[m.group].collectives_entered;
      lo = std::min(lo, n);
      hi = std::max(hi, n);
    }
    if (in.members.empty() || lo == hi) return;
    const uint64_t k = lo + 1;
    std::string entered, missing, what = "collective #" + std::to_string(k);
    double when = 0;
    bool quiet = true;
    std::vector<std::string> quiet_ranks;
    for (const Member& m : in.members) {
      if (header(m.record).groups[m.group].collectives_entered >= k) {
        const FlightEntry* e = find(m.record, m.group, false, FlightOp::AllReduce, -1, k);
        if (e && when == 0) {
          what = entry_text(m.record, *e);
          when = e->start;
        }
        entered += (entered.empty() ? "" : ", ") + who(m.record);
      } else {
        missing += "\n    " + who(m.record) + ": " + last_operation(m.record);
        quiet = quiet && went_quiet(m.record);
        quiet_ranks.push_back(who(m.record));
      }
    }
    report.findings.push_back(
        {when,
         "in " + group_text(in) + ", ranks parted at " + what + "\n  entered by " + entered +
             "\n  not entered by:" + missing,
         quiet, quiet ? quiet_ranks : std::vector<std::string>{}});
  }

  // Every member entered the group's last collective, but some still wait in it while others
  // completed it and recorded nothing since: a rank that died right after a collective, and a
  // launcher that killed the rest before they saw it complete (MPICH's Hydra kills within
  // milliseconds). Looked for only when nothing diverged.
  void left_unevenly(const Instance& in, FlightReport& report) {
    if (in.members.empty()) return;
    const uint64_t k = header(in.members.front().record).groups[in.members.front().group].collectives_entered;
    std::string waiting, quiet_text;
    const FlightEntry* pending = nullptr;
    size_t pending_record = 0;
    std::vector<std::string> quiet_ranks;
    for (const Member& m : in.members) {
      if (header(m.record).groups[m.group].collectives_entered != k) return;
      const FlightEntry* e = find(m.record, m.group, false, FlightOp::AllReduce, -1, k);
      if (!e) return;  // overwritten in the ring, or never recorded
      if (e->state == FlightState::Entered) {
        waiting += (waiting.empty() ? "" : ", ") + who(m.record);
        if (!pending) pending = e, pending_record = m.record;
      } else if (e == &records_[m.record].entries.back()) {
        quiet_ranks.push_back(who(m.record));
        quiet_text += "\n    " + who(m.record) + ": " + last_operation(m.record);
      }
    }
    if (!pending || quiet_ranks.empty()) return;
    std::string completed;
    for (const std::string& w : quiet_ranks) completed += (completed.empty() ? "" : ", ") + w;
    report.findings.push_back(
        {pending->start,
         "in " + group_text(in) + ", " + waiting + " still waited in " +
             entry_text(pending_record, *pending) + ", which " + completed +
             " completed and then recorded nothing more:" + quiet_text,
         true, quiet_ranks});
  }

  // Messages a rank waits for (or sends) that its peer never posted.
  void messages(size_t r, FlightReport& report) {
    for (const FlightEntry& e : records_[r].entries) {
      if (!is_point_to_point(e.op) || e.state != FlightState::Entered) continue;
      const auto it = instance_of_.find({r, e.group});
      if (it == instance_of_.end()) continue;
      const Instance& in = instances_[it->second];
      const int me = header(r).groups[e.group].rank;
      const Member* peer = nullptr;
      for (const Member& m : in.members)
        if (m.rank == e.peer) peer = &m;
      const FlightOp partner = e.op == FlightOp::Send ? FlightOp::Recv : FlightOp::Send;
      std::string text;
      if (!peer) {
        text = who(r) + " waits in " + entry_text(r, e) + "; its peer (rank " +
               std::to_string(e.peer) + " of " + group_text(in) + ") left no record";
      } else if (!find(peer->record, peer->group, true, partner, me, e.seq)) {
        text = who(r) + " waits in " + entry_text(r, e) + ", but " + who(peer->record) +
               " never posted the matching " + std::string(flight_op_name(partner)) + "\n    " +
               who(peer->record) + ": " + last_operation(peer->record);
      } else {
        continue;  // both posted: in flight, or waiting on something recorded elsewhere
      }
      const bool quiet = peer && went_quiet(peer->record);
      report.findings.push_back({e.start, text, quiet,
                                 quiet ? std::vector<std::string>{who(peer->record)}
                                       : std::vector<std::string>{}});
    }
  }

  void pending_operations(FlightReport& report) {
    for (size_t r = 0; r < records_.size(); ++r)
      for (const FlightEntry& e : records_[r].entries)
        if (e.state == FlightState::Entered) report.pending.push_back(who(r) + ": " + entry_text(r, e));
  }

  const std::vector<FlightRecord>& records_;
  double newest_sign_ = 0;  // the newest sign of life among the records
  // The earliest end noted in an unclosed record: a termination signal, or an abort.
  double first_signal_ = 0;
  std::vector<Instance> instances_;
  std::map<std::pair<std::string, int>, size_t> index_;
  std::map<std::pair<size_t, int>, size_t> instance_of_;
};

}  // namespace

FlightReport analyse_flight(const std::vector<FlightRecord>& all) {
  FlightReport report;
  if (all.empty()) return report;
  // The job is the newest record's; records of another world size are an earlier job's.
  const FlightRecord* newest = &all.front();
  for (const FlightRecord& r : all)
    if (r.header.opened > newest->header.opened) newest = &r;
  report.ranks = newest->header.world_size;
  std::vector<FlightRecord> job;
  std::set<int> present;
  for (const FlightRecord& r : all) {
    if (r.header.world_size != report.ranks) {
      report.notes.push_back("skipped " + r.path + ": from a job of " +
                             std::to_string(r.header.world_size) + " ranks");
      continue;
    }
    job.push_back(r);
    present.insert(r.header.world_rank);
  }
  // Absent ranks as ranges ("1, 3-7"), from the gaps between present ones: the world size
  // comes from a file and may be huge, so nothing here counts up to it.
  std::string absent;
  const auto add_gap = [&](int64_t first, int64_t last) {  // [first, last]
    if (first > last) return;
    absent += (absent.empty() ? "" : ", ") + std::to_string(first);
    if (last > first) absent += "-" + std::to_string(last);
  };
  int64_t next = 0;
  for (const int w : present) {
    if (w < 0 || w >= report.ranks) continue;
    add_gap(next, int64_t{w} - 1);
    next = int64_t{w} + 1;
  }
  add_gap(next, int64_t{report.ranks} - 1);
  if (!absent.empty())
    report.notes.push_back("no record of rank(s) " + absent +
                           " (they never started, or ran with run.flight_records = 0)");
  Analysis(job).run(report);
  return report;
}

FlightReport analyse_run_dir(const std::string& run_dir) {
  std::vector<FlightRecord> records;
  std::vector<std::string> unreadable;
  for (const std::string& path : flight_record_paths(run_dir)) {
    try {
      records.push_back(read_flight_record(path));
    } catch (const std::exception& e) {
      unreadable.push_back(std::string("skipped ") + e.what());
    }
  }
  FlightReport report = analyse_flight(records);
  report.records = static_cast<int>(records.size());
  // Records still being stamped are those of a job that runs (a hang diagnosed while it lasts),
  // not of one killed whole. Only a fresh stamp can be either: read them again a few stamping
  // periods later, and drop the note if any moved on.
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  if (report.killed_whole && now - report.killed_whole->newest_sign < kDeadAfterSeconds) {
    std::this_thread::sleep_for(std::chrono::duration<double>(3 * FlightRecorder::kAliveSeconds));
    bool stamped = false;
    for (const FlightRecord& r : records) {
      try {
        stamped = stamped || read_flight_record(r.path).header.alive > r.header.alive;
      } catch (const std::exception&) {
      }
    }
    if (stamped) report.killed_whole.reset();
  }
  report.notes.insert(report.notes.begin(), unreadable.begin(), unreadable.end());
  return report;
}

std::string FlightReport::likely_cause() const {
  std::vector<std::string> quiet = deaths;
  for (const FlightFinding& f : findings)
    for (const std::string& w : f.quiet_ranks)
      if (std::find(quiet.begin(), quiet.end(), w) == quiet.end()) quiet.push_back(w);
  if (quiet.empty()) return "";
  std::string out = "likely cause: ";
  for (size_t i = 0; i < quiet.size(); ++i) out += (i ? ", " : "") + quiet[i];
  return out + " stopped communicating while the others waited for " +
         (quiet.size() == 1 ? "it" : "them") + " (stalled, killed, or on another code path)";
}

std::string FlightReport::text() const {
  std::string out;
  for (const std::string& n : notes) out += "note: " + n + "\n";
  if (killed_whole) out += "note: " + killed_whole->text + "\n";
  if (findings.empty()) {
    out += "no divergence: the members of every group entered the same collectives, and every "
           "pending message was posted on both sides\n";
    for (const std::string& p : pending) out += "  pending: " + p + "\n";
    return out;
  }
  if (const std::string cause = likely_cause(); !cause.empty()) out += cause + "\n";
  out += "first divergence: " + findings.front().text + "\n";
  for (size_t i = 1; i < findings.size() && i < kMaxFindings; ++i)
    out += "then: " + findings[i].text + "\n";
  if (findings.size() > kMaxFindings)
    out += "... and " + std::to_string(findings.size() - kMaxFindings) + " more\n";
  return out;
}

}  // namespace meshtrain
