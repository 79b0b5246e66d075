// MESHTRAIN_SLOWDOWN's parser (parallel/slowdown.h) and the padding of compute time.

#include <gtest/gtest.h>

#include <time.h>

#include <chrono>
#include <thread>
#include <stdexcept>
#include <string>

#include "meshtrain/parallel/slowdown.h"

namespace meshtrain {
namespace {

TEST(Slowdown, ParsesRanksAndTheRest) {
  EXPECT_EQ(slowdown_for_rank("", 0), 1.0);
  EXPECT_EQ(slowdown_for_rank("2:3", 2), 3.0);
  EXPECT_EQ(slowdown_for_rank("2:3", 1), 1.0);
  EXPECT_EQ(slowdown_for_rank("0:1.5, 3:2", 3), 2.0);
  EXPECT_EQ(slowdown_for_rank("0:1.5, 3:2", 0), 1.5);
  // "*" is every rank not named, wherever it stands in the list.
  EXPECT_EQ(slowdown_for_rank("*:2,1:1", 1), 1.0);
  EXPECT_EQ(slowdown_for_rank("*:2,1:1", 5), 2.0);
  EXPECT_EQ(slowdown_for_rank("1:4,*:1.25", 1), 4.0);
  EXPECT_EQ(slowdown_for_rank("1:4,*:1.25", 0), 1.25);
  EXPECT_EQ(slowdown_for_rank("7:1", 7), 1.0);
}

TEST(Slowdown, RefusesBadSpecsNamingTheVariable) {
  for (const std::string spec : {"2", "2:", ":3", "x:2", "-1:2", "2:0.5", "2:abc", "2:3x", "2:nan",
                                 "2:inf", "2:3,,1:2", "2:3,2:4", "*:2,*:3", "1.5:2", "2:3:4"}) {
    try {
      slowdown_for_rank(spec, 0);
      ADD_FAILURE() << "accepted \"" << spec << "\"";
    } catch (const std::invalid_argument& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("MESHTRAIN_SLOWDOWN=\"" + spec + "\""), std::string::npos) << what;
      EXPECT_NE(what.find("RANK:FACTOR"), std::string::npos) << what;
    }
  }
}

TEST(Slowdown, PadsComputeBySleeping) {
  EXPECT_EQ(compute_slowdown(), 1.0);
  EXPECT_EQ(pad_compute(0.01), 0.01);  // no slowdown: unchanged, no sleep
  EXPECT_THROW(set_compute_slowdown(0.5), std::invalid_argument);
  set_compute_slowdown(3.0);
  const auto t0 = std::chrono::steady_clock::now();
  const double padded = pad_compute(0.02);
  const double slept = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  set_compute_slowdown(1.0);
  EXPECT_GE(slept, 0.04);          // (3 - 1) x 20 ms
  EXPECT_GE(padded, 0.06);         // 20 ms computed + at least 40 ms slept
  EXPECT_LT(padded, 0.02 + slept + 1e-3);
}

double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Burns `seconds` of this thread's CPU time (longer elapsed, if the thread is descheduled).
void spin_cpu(double seconds) {
  const double until = thread_cpu_seconds() + seconds;
  volatile uint64_t x = 0;
  while (thread_cpu_seconds() < until) x = x + 1;
}

TEST(Slowdown, PadsToElapsedOrCpuTime) {
  {
    PaddedCompute none;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const double t = none.finish();
    EXPECT_GE(t, 0.005);
    EXPECT_LT(t, 0.05);  // nothing slept on top
  }
  // Elapsed: a 20 ms action that waited (no CPU) is padded three-fold all the same.
  set_compute_slowdown(3.0);
  PaddedCompute waited;
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_GE(waited.finish(), 0.06);
  // CPU time: the waiting counts for nothing, the computing three-fold.
  set_compute_slowdown(3.0, PaddingBasis::CpuTime);
  PaddedCompute idle;
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const double idle_padded = idle.finish();
  PaddedCompute busy;
  spin_cpu(0.02);
  const double busy_padded = busy.finish();
  set_compute_slowdown(1.0);
  EXPECT_GE(idle_padded, 0.02);
  EXPECT_LT(idle_padded, 0.05);  // the sleep, its overrun, a little CPU tripled: not 60 ms
  EXPECT_GE(busy_padded, 0.06);  // 3 x 20 ms of CPU
}

// A fixed compute time pads every action to it whatever the factor, and counts those that
// overran it rather than cutting them short.
TEST(Slowdown, PadsToAFixedTimeAndCountsOverruns) {
  EXPECT_THROW(set_fixed_compute_time(-1.0), std::invalid_argument);
  set_compute_slowdown(3.0, PaddingBasis::CpuTime);
  set_fixed_compute_time(0.03);
  const long before = fixed_compute_overruns();
  PaddedCompute quick;
  spin_cpu(0.002);
  const double quick_padded = quick.finish();
  PaddedCompute slow;
  std::this_thread::sleep_for(std::chrono::milliseconds(40));
  const double slow_padded = slow.finish();
  const long overruns = fixed_compute_overruns() - before;
  set_fixed_compute_time(0);
  PaddedCompute after;
  spin_cpu(0.002);
  const double after_padded = after.finish();
  set_compute_slowdown(1.0);
  EXPECT_GE(quick_padded, 0.03);
  EXPECT_LT(quick_padded, 0.045);  // to 30 ms, not to 3 x its CPU time plus 30 ms
  EXPECT_GE(slow_padded, 0.04);    // not cut short
  EXPECT_LT(slow_padded, 0.06);    // nor padded on top
  EXPECT_EQ(overruns, 1);
  EXPECT_EQ(fixed_compute_time(), 0.0);
  EXPECT_LT(after_padded, 0.02);  // off again: 3 x 2 ms of CPU
}

}  // namespace
}  // namespace meshtrain
