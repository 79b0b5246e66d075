// The flight recorder's file (written, wrapped, read back) and the analysis that merges every
// rank's record: a collective some members never entered, one a rank completed and died after
// while the others still waited in it, a message never sent, a rank that died inside an
// operation, records of another job, ranks without a record.

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "meshtrain/comm/flight_recorder.h"
#include "meshtrain/comm/flight_report.h"
#include "support/temp_dir.h"

namespace meshtrain {
namespace {

using testing::TempDir;

TEST(FlightRecorder, WritesEveryOperationAndReadsItBack) {
  TempDir dir;
  const std::string path = flight_record_path(dir.path(), 3);
  {
    FlightRecorder rec(path, 3, 4, 8);
    const int dp = rec.add_group("dp", 1, 2, 1);
    const int pp = rec.add_group("pp", 2, 2, 0);
    rec.end(rec.begin(dp, FlightOp::AllReduce, -1, 4096));
    rec.end(rec.begin(pp, FlightOp::Send, 1, 512));
    rec.begin(pp, FlightOp::Send, 1, 512);   // pending
    rec.begin(dp, FlightOp::AllReduce, -1, 4096);
    // While the recorder lives, its thread stamps the record alive; it is not closed. Until
    // published it goes by its pending name, which is what a reader of the directory takes.
    std::this_thread::sleep_for(std::chrono::duration<double>(3 * FlightRecorder::kAliveSeconds));
    EXPECT_EQ(flight_record_paths(dir.path()), std::vector<std::string>{path + kPendingSuffix});
    const FlightRecord live = read_flight_record(path + kPendingSuffix);
    EXPECT_GT(live.header.alive, live.header.opened + FlightRecorder::kAliveSeconds / 2);
    EXPECT_EQ(live.header.closed, 0.0);
    rec.publish();
  }
  const FlightRecord r = read_flight_record(path);
  EXPECT_GE(r.header.closed, r.header.alive);  // destroyed: closed cleanly
  EXPECT_EQ(r.header.world_rank, 3);
  EXPECT_EQ(r.header.world_size, 4);
  ASSERT_EQ(r.header.group_count, 2);
  EXPECT_STREQ(r.header.groups[0].name, "dp");
  EXPECT_EQ(r.header.groups[0].collectives_entered, 2u);
  EXPECT_EQ(r.header.groups[0].collectives_completed, 1u);
  ASSERT_EQ(r.entries.size(), 4u);
  EXPECT_EQ(r.entries[0].op, FlightOp::AllReduce);
  EXPECT_EQ(r.entries[0].state, FlightState::Completed);
  EXPECT_GE(r.entries[0].end, r.entries[0].start);
  EXPECT_EQ(r.entries[1].seq, 1u);  // first send to that peer
  EXPECT_EQ(r.entries[2].seq, 2u);
  EXPECT_EQ(r.entries[2].state, FlightState::Entered);
  EXPECT_EQ(r.entries[3].seq, 2u);  // second collective on dp
  EXPECT_EQ(flight_record_paths(dir.path()), std::vector<std::string>{path});
}

// A start refused before it was accepted (a bad deck in the directory of a run that ended) never
// publishes: its pending record is removed and the previous run's record stays as it was.
TEST(FlightRecorder, AnUnpublishedRecordLeavesThePreviousOne) {
  TempDir dir;
  const std::string path = flight_record_path(dir.path(), 1);
  {
    FlightRecorder previous(path, 1, 2, 4);
    previous.publish();
  }
  const FlightRecord before = read_flight_record(path);
  {
    FlightRecorder refused(path, 1, 4, 8);
    const int g = refused.add_group("dp", 0, 4, 1);
    refused.end(refused.begin(g, FlightOp::AllReduce, -1, 8));
  }
  const FlightRecord after = read_flight_record(path);
  EXPECT_EQ(after.header.world_size, 2);
  EXPECT_EQ(after.header.opened, before.header.opened);
  EXPECT_EQ(after.header.closed, before.header.closed);
  EXPECT_EQ(flight_record_paths(dir.path()), std::vector<std::string>{path});
}

TEST(FlightRecorder, KeepsTheLastEntriesAndTheCountsAcrossWrapAround) {
  TempDir dir;
  const std::string path = flight_record_path(dir.path(), 0);
  {
    FlightRecorder rec(path, 0, 2, 4);
    rec.publish();
    const int g = rec.add_group("tp", 0, 2, 0);
    for (int i = 0; i < 10; ++i) rec.end(rec.begin(g, FlightOp::AllReduce, -1, 8));
    const FlightRecorder::Ticket late = rec.begin(g, FlightOp::AllReduce, -1, 8);
    for (int i = 0; i < 4; ++i) rec.begin(g, FlightOp::Barrier, -1, 0);
    rec.end(late);  // its slot was reused: the newer entry must stay as it is
  }
  const FlightRecord r = read_flight_record(path);
  ASSERT_EQ(r.entries.size(), 4u);
  EXPECT_EQ(r.entries.front().serial, 12u);
  EXPECT_EQ(r.entries.back().serial, 15u);
  for (const FlightEntry& e : r.entries) EXPECT_EQ(e.state, FlightState::Entered);
  EXPECT_EQ(r.header.groups[0].collectives_entered, 15u);
  EXPECT_EQ(r.header.groups[0].collectives_completed, 11u);
}

TEST(FlightRecorder, RefusesFilesThatAreNotRecords) {
  TempDir dir;
  EXPECT_THROW(read_flight_record(dir.file("missing.rec")), std::runtime_error);
  const std::string junk = dir.file("junk.rec");
  FILE* f = std::fopen(junk.c_str(), "w");
  std::fputs("not a record", f);
  std::fclose(f);
  try {
    read_flight_record(junk);
    ADD_FAILURE() << "read a junk file";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(junk), std::string::npos) << e.what();
  }
}

// Synthetic records: `ops` collectives on one group, each rank entering some of them.
FlightRecord rank_record(int world_rank, int world_size, const char* node, double opened) {
  FlightRecord r;
  r.path = "rank_" + std::to_string(world_rank) + ".rec";
  r.header.world_rank = world_rank;
  r.header.world_size = world_size;
  r.header.opened = opened;
  r.header.capacity = 64;
  std::snprintf(r.header.node, sizeof r.header.node, "%s", node);
  return r;
}

int add_group(FlightRecord& r, const char* name, int id, int size, int rank) {
  FlightGroup& g = r.header.groups[r.header.group_count];
  std::snprintf(g.name, sizeof g.name, "%s", name);
  g.id = id;
  g.size = size;
  g.rank = rank;
  return r.header.group_count++;
}

void add_entry(FlightRecord& r, int group, FlightOp op, int peer, uint64_t seq, double start,
               bool completed) {
  FlightEntry e;
  e.serial = r.entries.size() + 1;
  e.seq = seq;
  e.op = op;
  e.group = group;
  e.peer = peer;
  e.bytes = 1024;
  e.start = start;
  e.end = completed ? start + 0.001 : 0;
  e.state = completed ? FlightState::Completed : FlightState::Entered;
  r.entries.push_back(e);
  r.header.serial = e.serial;
  if (!is_point_to_point(op)) {
    ++r.header.groups[group].collectives_entered;
    if (completed) ++r.header.groups[group].collectives_completed;
  }
}

TEST(FlightReport, NamesTheCollectiveAStalledRankNeverEntered) {
  // dp group of world ranks 0, 1, 2: ranks 0 and 2 enter all_reduce #2, rank 1 went quiet
  // after #1.
  std::vector<FlightRecord> records;
  for (int w = 0; w < 3; ++w) {
    FlightRecord r = rank_record(w, 3, w == 1 ? "node-b" : "node-a", 100.0);
    const int g = add_group(r, "dp", 0, 3, w);
    add_entry(r, g, FlightOp::AllReduce, -1, 1, 101.0, true);
    if (w != 1) add_entry(r, g, FlightOp::AllReduce, -1, 2, 102.0 + w, false);
    records.push_back(r);
  }
  const FlightReport report = analyse_flight(records);
  ASSERT_EQ(report.findings.size(), 1u) << report.text();
  const std::string text = report.text();
  EXPECT_NE(text.find("likely cause: rank 1 (node node-b) stopped communicating"), std::string::npos)
      << text;
  EXPECT_NE(text.find("in group 'dp' (world ranks 0, 1, 2), ranks parted at all_reduce of 1.0 KiB "
                      "on group 'dp' (collective #2)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("entered by rank 0 (node node-a), rank 2 (node node-a)"), std::string::npos)
      << text;
  EXPECT_NE(text.find("not entered by:\n    rank 1 (node node-b): its last operation: all_reduce"),
            std::string::npos)
      << text;
}

TEST(FlightReport, NamesAMessageThePeerNeverSent) {
  // pp group: rank 1 waits for message #2 from rank 0, which sent only #1 and went quiet.
  FlightRecord a = rank_record(0, 2, "n0", 1.0), b = rank_record(1, 2, "n1", 1.0);
  const int ga = add_group(a, "pp", 0, 2, 0), gb = add_group(b, "pp", 0, 2, 1);
  add_entry(a, ga, FlightOp::Send, 1, 1, 2.0, true);
  add_entry(b, gb, FlightOp::Recv, 0, 1, 2.0, true);
  add_entry(b, gb, FlightOp::Recv, 0, 2, 3.0, false);
  const FlightReport report = analyse_flight({a, b});
  const std::string text = report.text();
  ASSERT_EQ(report.findings.size(), 1u) << text;
  EXPECT_TRUE(report.findings[0].quiet);
  EXPECT_NE(text.find("rank 1 (node n1) waits in recv of 1.0 KiB on group 'pp' from its rank 0 "
                      "(message #2)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("but rank 0 (node n0) never posted the matching send"), std::string::npos)
      << text;
}

TEST(FlightReport, QuietRanksComeBeforeTheirVictims) {
  // tp group {0, 1}: rank 1 went quiet, rank 0 waits in tp. dp group {0, 2}: rank 2 waits in dp
  // for rank 0, which is stuck in tp (a victim, entered earlier).
  FlightRecord r0 = rank_record(0, 3, "n", 1.0), r1 = rank_record(1, 3, "n", 1.0),
               r2 = rank_record(2, 3, "n", 1.0);
  const int t0 = add_group(r0, "tp", 0, 2, 0), d0 = add_group(r0, "dp", 0, 2, 0);
  const int t1 = add_group(r1, "tp", 0, 2, 1);
  const int d2 = add_group(r2, "dp", 0, 2, 1);
  add_entry(r1, t1, FlightOp::AllReduce, -1, 1, 5.0, true);
  add_entry(r0, t0, FlightOp::AllReduce, -1, 1, 5.0, true);
  add_entry(r0, t0, FlightOp::AllReduce, -1, 2, 6.0, false);
  add_entry(r2, d2, FlightOp::AllReduce, -1, 1, 4.0, false);  // earlier than the tp one
  (void)d0;
  const FlightReport report = analyse_flight({r0, r1, r2});
  ASSERT_EQ(report.findings.size(), 2u) << report.text();
  EXPECT_NE(report.findings[0].text.find("group 'tp'"), std::string::npos) << report.text();
  EXPECT_NE(report.text().find("likely cause: rank 1 (node n)"), std::string::npos) << report.text();
}

TEST(FlightReport, ARankWithAnOverlappedReductionPendingIsAVictim) {
  // dp group {0, 2}: rank 2 stalled after all_reduce #1. Rank 0 started all_reduce #2 (a bucket
  // overlapping the backward pass), then completed a pp send: its last entry is complete, but it
  // waits for rank 2 all the same, so rank 1, waiting for it in tp, names only rank 2.
  FlightRecord r0 = rank_record(0, 3, "n1", 1.0), r1 = rank_record(1, 3, "n1", 1.0),
               r2 = rank_record(2, 3, "n2", 1.0);
  const int d0 = add_group(r0, "dp", 0, 2, 0), t0 = add_group(r0, "tp", 0, 2, 0),
            p0 = add_group(r0, "pp", 0, 2, 0);
  const int t1 = add_group(r1, "tp", 0, 2, 1), p1 = add_group(r1, "pp", 0, 2, 1);
  const int d2 = add_group(r2, "dp", 0, 2, 1);
  (void)t0;
  add_entry(r0, d0, FlightOp::AllReduce, -1, 1, 2.0, true);
  add_entry(r2, d2, FlightOp::AllReduce, -1, 1, 2.0, true);
  add_entry(r0, d0, FlightOp::AllReduce, -1, 2, 3.0, false);
  add_entry(r0, p0, FlightOp::Send, 1, 1, 3.1, true);
  add_entry(r1, p1, FlightOp::Recv, 0, 1, 3.1, true);
  add_entry(r1, t1, FlightOp::AllReduce, -1, 1, 3.2, false);
  const std::string text = analyse_flight({r0, r1, r2}).text();
  EXPECT_NE(text.find("likely cause: rank 2 (node n2) stopped communicating"), std::string::npos) << text;
}

TEST(FlightReport, NamesARankThatDiedInsideAnOperation) {
  // tp group {0, 1}: both entered all_reduce #1 and rank 1 was killed there: its last entry is
  // as pending as rank 0's, only its liveness stamp (5 s behind) tells. dp group {1, 2}: rank 2
  // waits in all_reduce #1 that rank 1 never entered.
  FlightRecord r0 = rank_record(0, 3, "n1", 1.0), r1 = rank_record(1, 3, "n2", 1.0),
               r2 = rank_record(2, 3, "n3", 1.0);
  const int t0 = add_group(r0, "tp", 0, 2, 0), t1 = add_group(r1, "tp", 0, 2, 1);
  add_group(r1, "dp", 1, 2, 0);
  const int d2 = add_group(r2, "dp", 1, 2, 1);
  add_entry(r0, t0, FlightOp::AllReduce, -1, 1, 5.0, false);
  add_entry(r1, t1, FlightOp::AllReduce, -1, 1, 5.0, false);
  add_entry(r2, d2, FlightOp::AllReduce, -1, 1, 4.0, false);
  r0.header.alive = r2.header.alive = 10.5;
  r1.header.alive = 5.5;
  const FlightReport report = analyse_flight({r0, r1, r2});
  const std::string text = report.text();
  EXPECT_NE(text.find("likely cause: rank 1 (node n2) stopped communicating"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 1 (node n2) died at about "), std::string::npos) << text;  // local time
  EXPECT_NE(text.find(" (its record was last kept alive 5.0 s before the others'); its last "
                      "operation: all_reduce of 1.0 KiB on group 'tp' (collective #1)"),
            std::string::npos) << text;
  EXPECT_NE(text.find("not entered by:\n    rank 1 (node n2): its last operation: all_reduce of "
                      "1.0 KiB on group 'tp' (collective #1), entered at "), std::string::npos) << text;
  EXPECT_NE(text.find(", still pending; its process died at about "), std::string::npos) << text;
  EXPECT_EQ(text.find("rank 0 (node n1) died"), std::string::npos) << text;

  // Closed cleanly, or stamped less than the threshold ago, or never stamped (an older
  // writer): alive as far as the records tell.
  for (auto [alive, closed] : {std::pair{5.5, 6.0}, std::pair{9.5, 0.0}, std::pair{0.0, 0.0}}) {
    r1.header.alive = alive;
    r1.header.closed = closed;
    const std::string t = analyse_flight({r0, r1, r2}).text();
    EXPECT_EQ(t.find("died"), std::string::npos) << "alive " << alive << " closed " << closed << "\n" << t;
    // Every record unclosed and stopped together, none signalled: killed whole (MPICH's
    // mpiexec), which the records cannot order; said so, with the pids the launcher names.
    EXPECT_EQ(t.find("the whole job was ended at once with SIGKILL") != std::string::npos,
              alive == 9.5) << t;
  }
}

TEST(FlightReport, NamesARankKilledInsideAnOperationWhenTheLauncherEndedTheRestAtOnce) {
  // dp group {0, 1}: rank 1 was killed (kill -9) inside all_reduce #7, where rank 0 waits too.
  // The launcher sent rank 0 SIGTERM a second later and killed it: the liveness stamps are a
  // second apart, under the threshold, and only the signal rank 0 noted, and rank 1 did not,
  // tells them apart. Before signals were noted the report said "no divergence".
  FlightRecord r0 = rank_record(0, 2, "n1", 1.0), r1 = rank_record(1, 2, "n2", 1.0);
  const int g0 = add_group(r0, "dp", 0, 2, 0), g1 = add_group(r1, "dp", 0, 2, 1);
  add_entry(r0, g0, FlightOp::AllReduce, -1, 7, 5.0, false);
  add_entry(r1, g1, FlightOp::AllReduce, -1, 7, 5.0, false);
  r0.header.alive = 6.1;
  r1.header.alive = 5.1;
  r0.header.signalled = 6.0;
  r0.header.signal = 15;
  const std::string text = analyse_flight({r0, r1}).text();
  EXPECT_NE(text.find("likely cause: rank 1 (node n2) stopped communicating"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 1 (node n2) died at about "), std::string::npos) << text;
  EXPECT_NE(text.find("the others recorded the launcher's termination signal or their own abort, it "
                      "recorded neither"), std::string::npos) << text;
  EXPECT_EQ(text.find("rank 0 (node n1) died"), std::string::npos) << text;

  // Every rank signalled (scancel, a stop of the whole job), or the unsignalled one alive after
  // the first signal, or closed cleanly: nobody died.
  FlightRecord both = r1;
  both.header.signalled = 6.0;
  FlightRecord later = r1;
  later.header.alive = 6.05;
  FlightRecord closed = r1;
  closed.header.closed = 5.2;
  for (const FlightRecord& other : {both, later, closed}) {
    const std::string t = analyse_flight({r0, other}).text();
    EXPECT_EQ(t.find("died"), std::string::npos) << t;
  }

  // A stall: rank 0 timed out and aborted the job at 6.0 (no signal: its handler was gone),
  // then the launcher signalled the stalled rank 1. Neither died; rank 1 is named as before,
  // as the rank that never entered the collective.
  FlightRecord aborter = rank_record(0, 2, "n1", 1.0), stalled = rank_record(1, 2, "n2", 1.0);
  const int a0 = add_group(aborter, "dp", 0, 2, 0), s1 = add_group(stalled, "dp", 0, 2, 1);
  add_entry(aborter, a0, FlightOp::AllReduce, -1, 1, 2.0, false);
  (void)s1;
  aborter.header.alive = 5.9;
  aborter.header.aborted = 6.0;
  stalled.header.alive = 6.2;
  stalled.header.signalled = 6.1;
  const std::string t = analyse_flight({aborter, stalled}).text();
  EXPECT_EQ(t.find("died"), std::string::npos) << t;
  EXPECT_NE(t.find("likely cause: rank 1 (node n2) stopped communicating"), std::string::npos) << t;
  // And a rank killed before the survivor's own abort (its timeout came first): named dead.
  FlightRecord killed = stalled;
  killed.header.signalled = 0;
  killed.header.alive = 5.0;
  EXPECT_NE(analyse_flight({aborter, killed}).text().find("rank 1 (node n2) died"), std::string::npos);
}

TEST(FlightReport, NamesTheFirstDeathFirstWhenOneBroughtDownAnother) {
  // As MPICH over UCX did in CI: rank 1 is killed after a pp send; rank 3, its dp partner, is
  // aborted by its transport 9 ms later, inside the dp all_reduce. Rank 2 has long waited for a
  // pp message from rank 3, so the finding that names rank 3 is the earliest; the cause is still
  // rank 1, and rank 3 comes after it.
  FlightRecord r0 = rank_record(0, 4, "n1", 1.0), r1 = rank_record(1, 4, "n2", 1.0),
               r2 = rank_record(2, 4, "n1", 1.0), r3 = rank_record(3, 4, "n2", 1.0);
  const int p0 = add_group(r0, "pp", 0, 2, 0), p1 = add_group(r1, "pp", 0, 2, 1);
  const int p2 = add_group(r2, "pp", 1, 2, 0);
  add_group(r3, "pp", 1, 2, 1);
  const int d1 = add_group(r1, "dp", 2, 2, 0), d3 = add_group(r3, "dp", 2, 2, 1);
  add_entry(r1, d1, FlightOp::AllReduce, -1, 1, 2.0, true);
  add_entry(r3, d3, FlightOp::AllReduce, -1, 1, 2.0, true);
  add_entry(r2, p2, FlightOp::Recv, 1, 1, 4.790, false);
  add_entry(r1, p1, FlightOp::Send, 0, 1, 4.800, true);
  add_entry(r0, p0, FlightOp::Recv, 1, 1, 4.800, true);
  add_entry(r3, d3, FlightOp::AllReduce, -1, 2, 4.809, false);
  r0.header.alive = r2.header.alive = 12.7;
  r1.header.alive = 4.5;
  r3.header.alive = 4.5;
  const FlightReport report = analyse_flight({r0, r1, r2, r3});
  ASSERT_EQ(report.deaths.size(), 2u) << report.text();
  EXPECT_EQ(report.deaths[0], "rank 1 (node n2)");
  EXPECT_EQ(report.deaths[1], "rank 3 (node n2)");
  EXPECT_EQ(report.likely_cause().rfind("likely cause: rank 1 (node n2), rank 3 (node n2) stopped", 0), 0u)
      << report.text();
}

TEST(FlightReport, NamesARankThatDiedRightAfterACollectiveTheOthersStillWaitedIn) {
  // dp group {0, 1}: both entered all_reduce #2; rank 1 completed it and exited, and the
  // launcher killed rank 0 before it saw #2 complete (Hydra does so within milliseconds).
  FlightRecord a = rank_record(0, 2, "n0", 1.0), b = rank_record(1, 2, "n1", 1.0);
  const int ga = add_group(a, "dp", 0, 2, 0), gb = add_group(b, "dp", 0, 2, 1);
  for (FlightRecord* r : {&a, &b}) add_entry(*r, r == &a ? ga : gb, FlightOp::AllReduce, -1, 1, 2.0, true);
  add_entry(a, ga, FlightOp::AllReduce, -1, 2, 3.0, false);
  add_entry(b, gb, FlightOp::AllReduce, -1, 2, 3.0, true);
  const FlightReport report = analyse_flight({a, b});
  const std::string text = report.text();
  ASSERT_EQ(report.findings.size(), 1u) << text;
  EXPECT_NE(text.find("likely cause: rank 1 (node n1) stopped communicating"), std::string::npos)
      << text;
  EXPECT_NE(text.find("in group 'dp' (world ranks 0, 1), rank 0 (node n0) still waited in "
                      "all_reduce of 1.0 KiB on group 'dp' (collective #2)"),
            std::string::npos)
      << text;

  // Both still inside #2 (killed together mid-collective): no cause to name.
  b.entries.back().state = FlightState::Entered;
  EXPECT_TRUE(analyse_flight({a, b}).findings.empty());
}

TEST(FlightReport, SkipsAnotherJobsRecordsAndNamesRanksWithoutOne) {
  FlightRecord old = rank_record(5, 8, "n", 1.0);
  FlightRecord r0 = rank_record(0, 3, "n", 2.0), r2 = rank_record(2, 3, "n", 2.0);
  add_group(r0, "dp", 0, 3, 0);
  add_group(r2, "dp", 0, 3, 2);
  const FlightReport report = analyse_flight({old, r0, r2});
  EXPECT_EQ(report.ranks, 3);
  const std::string text = report.text();
  EXPECT_NE(text.find("skipped rank_5.rec: from a job of 8 ranks"), std::string::npos) << text;
  EXPECT_NE(text.find("no record of rank(s) 1"), std::string::npos) << text;
  EXPECT_NE(text.find("no divergence"), std::string::npos) << text;
}

}  // namespace
}  // namespace meshtrain
