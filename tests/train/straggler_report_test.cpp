// The straggler report's detection (train/straggler_report.h), without MPI, and the per-rank
// arrays it writes to metrics.jsonl.

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "meshtrain/io/metrics_writer.h"
#include "meshtrain/train/straggler_report.h"
#include "support/temp_dir.h"

namespace meshtrain {
namespace {

TEST(StragglerReport, Median) {
  EXPECT_EQ(median_of({}), 0.0);
  EXPECT_EQ(median_of({5}), 5.0);
  EXPECT_EQ(median_of({3, 1, 2}), 2.0);
  EXPECT_EQ(median_of({100, 300, 100, 100}), 100.0);
  EXPECT_EQ(median_of({1, 4, 2, 3}), 2.5);
}

TEST(StragglerReport, FlagsRanksAboveThresholdTimesTheMedian) {
  const std::vector<double> compute = {100, 104, 210, 98}, wait = {110, 106, 1, 112};
  const StragglerWindow w = judge_window(4, 2, compute, wait, {}, 1.25, 2);
  EXPECT_EQ(w.step, 4);
  EXPECT_EQ(w.steps, 2);
  EXPECT_DOUBLE_EQ(w.median_compute_ms, 102.0);
  EXPECT_EQ(w.slow, std::vector<int>{2});
  EXPECT_EQ(w.streak, (std::vector<int>{0, 0, 1, 0}));
  EXPECT_TRUE(w.stragglers.empty());  // one window is not yet persistent
  EXPECT_EQ(w.wait_ms, wait);
  // Just at the threshold is not above it.
  EXPECT_TRUE(judge_window(1, 1, {100, 100, 125}, {0, 0, 0}, {}, 1.25, 1).slow.empty());
  EXPECT_EQ(judge_window(1, 1, {100, 100, 125.5}, {0, 0, 0}, {}, 1.25, 1).slow, std::vector<int>{2});
}

TEST(StragglerReport, PersistenceNeedsConsecutiveWindows) {
  const std::vector<double> wait = {0, 0, 0, 0};
  StragglerWindow w = judge_window(1, 1, {100, 100, 300, 100}, wait, {}, 1.25, 2);
  EXPECT_TRUE(w.stragglers.empty());
  w = judge_window(2, 2, {100, 100, 300, 100}, wait, w.streak, 1.25, 2);
  EXPECT_EQ(w.stragglers, std::vector<int>{2});
  EXPECT_EQ(w.streak[2], 2);
  w = judge_window(4, 2, {100, 100, 300, 100}, wait, w.streak, 1.25, 2);
  EXPECT_EQ(w.stragglers, std::vector<int>{2});
  EXPECT_EQ(w.streak[2], 3);
  // A window at normal speed resets the streak; a different rank slow once is not a straggler.
  w = judge_window(6, 2, {100, 100, 100, 300}, wait, w.streak, 1.25, 2);
  EXPECT_EQ(w.slow, std::vector<int>{3});
  EXPECT_EQ(w.streak, (std::vector<int>{0, 0, 0, 1}));
  EXPECT_TRUE(w.stragglers.empty());
}

TEST(StragglerReport, EvenSpeedsAndEmptyWindowsFlagNoOne) {
  EXPECT_TRUE(judge_window(1, 1, {100, 110, 95, 105}, {0, 0, 0, 0}, {}, 1.25, 1).slow.empty());
  EXPECT_TRUE(judge_window(1, 0, {0, 0, 0}, {0, 0, 0}, {}, 1.25, 1).slow.empty());
  EXPECT_TRUE(judge_window(1, 1, {42}, {0}, {}, 1.25, 1).slow.empty());  // one rank: its own median
  EXPECT_THROW(judge_window(1, 1, {1}, {0}, {}, 1.0, 2), std::invalid_argument);
}

TEST(StragglerReport, DescribesTheStraggler) {
  StragglerWindow w = judge_window(2, 2, {104.1, 104.1, 210.3, 104.1}, {0, 0, 0, 0}, {0, 0, 1, 0}, 1.25, 2);
  RankPlace p;
  p.node = "n7";
  p.dp = 2;
  EXPECT_EQ(describe_straggler(w, 2, p),
            "straggler: rank 2 (node n7, dp 2 tp 0 pp 0) computes 2.02x the median (210.3 vs "
            "104.1 ms per step) in 2 consecutive windows");
}

TEST(StragglerReport, MetricsWriterWritesArrays) {
  testing::TempDir dir;
  const std::string path = dir.file("metrics.jsonl");
  {
    MetricsWriter m(path);
    m.write({{"step", int64_t{4}},
             {"rank_compute_ms", std::vector<double>{1.5, 2}},
             {"rank_wait_ms", std::vector<double>{}},
             {"stragglers", std::vector<int64_t>{3}}});
  }
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(),
            "{\"step\": 4, \"rank_compute_ms\": [1.5, 2], \"rank_wait_ms\": [], \"stragglers\": [3]}\n");
}

}  // namespace
}  // namespace meshtrain
