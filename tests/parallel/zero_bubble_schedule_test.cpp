// Zero-bubble pipeline schedules (split backward: BackwardInput + BackwardWeight): the action
// text, the simulator's checks of split backwards, and the ZB-H1 generator proven complete,
// deadlock-free and within its bubble and memory bounds over 1-8 stages and 1-16 microbatches.

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "meshtrain/parallel/schedule.h"
#include "meshtrain/parallel/schedule_simulator.h"
#include "support/schedule_text.h"

namespace meshtrain {
namespace {

using testing::parse_schedule;

TEST(ZeroBubbleActions, PrintAndParse) {
  EXPECT_EQ((Action{2, Op::BackwardInput, 3}).to_string(), "2I3");
  EXPECT_EQ((Action{0, Op::BackwardWeight, 11}).to_string(), "0W11");
  EXPECT_EQ(Action::parse("2I3"), (Action{2, Op::BackwardInput, 3}));
  EXPECT_EQ(Action::parse("0W11"), (Action{0, Op::BackwardWeight, 11}));
  EXPECT_TRUE(is_compute(Op::BackwardInput));
  EXPECT_TRUE(is_compute(Op::BackwardWeight));
  EXPECT_TRUE(is_input_gradient(Op::BackwardInput));
  EXPECT_FALSE(is_input_gradient(Op::BackwardWeight));
  EXPECT_FALSE(is_communication(Op::BackwardWeight));
  EXPECT_EQ(schedule_name(ScheduleKind::ZeroBubbleH1), "zb-h1");
}

// A split backward must have both halves, W after I, and no whole B beside them.
TEST(ZeroBubbleSimulator, RefusesBrokenSplits) {
  const SimulationResult missing_w = simulate(parse_schedule({{"0F0", "0I0"}}), 1, 1, 1);
  ASSERT_FALSE(missing_w.ok);
  EXPECT_NE(missing_w.error.find("missing 0W0"), std::string::npos) << missing_w.error;

  const SimulationResult both = simulate(parse_schedule({{"0F0", "0B0", "0I0", "0W0"}}), 1, 1, 1);
  ASSERT_FALSE(both.ok);
  EXPECT_NE(both.error.find("unexpected 0B0"), std::string::npos) << both.error;

  const SimulationResult early_w = simulate(parse_schedule({{"0F0", "0W0", "0I0"}}), 1, 1, 1);
  ASSERT_FALSE(early_w.ok);
  EXPECT_NE(early_w.error.find("0W0 at rank 0 step 1 runs before 0I0"), std::string::npos)
      << early_w.error;
  EXPECT_NE(early_w.error.find("weight gradient needs"), std::string::npos) << early_w.error;
}

// Two stages by hand: the input gradient is what crosses ranks, the weight gradient stays.
TEST(ZeroBubbleSimulator, InputGradientIsWhatIsSent) {
  const Schedule compute = parse_schedule({{"0F0", "0I0", "0W0"}, {"1F0", "1I0", "1W0"}});
  const Schedule s = insert_communication(compute, 2, 1);
  const SimulationResult r = simulate(s, 2, 1, 1);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(s[1], (std::vector<Action>{Action::parse("1RECV_F0"), Action::parse("1F0"),
                                       Action::parse("1I0"), Action::parse("1SEND_B0"),
                                       Action::parse("1W0")}));
  // F 1 + I 1 on rank 0 after rank 1's F and I: 0F0 [0,1), 1F0 [1,2), 1I0 [2,3), 0I0 [3,4),
  // 0W0 [4,5).
  EXPECT_DOUBLE_EQ(r.makespan, 5.0);
}

// The property the generator promises, over the whole grid and under both communicator models:
// complete and deadlock-free, 3m units of work per rank, at most 1F1B's peak of microbatches
// held (min(m, p), rank 0's), and the bubble of arXiv 2401.10241's ZB-H1 where m >= p.
TEST(ZeroBubbleSimulator, EveryZbH1ScheduleIsCompleteDeadlockFreeAndWithinBounds) {
  int checked = 0;
  for (CommModel model : {CommModel::Mpi, CommModel::Nccl}) {
    for (int p = 1; p <= 8; ++p) {
      for (int m = 1; m <= 16; ++m) {
        SCOPED_TRACE("zb-h1 pp=" + std::to_string(p) + " m=" + std::to_string(m) + " under " +
                     std::string(comm_model_name(model)));
        const Schedule s = insert_communication(make_schedule(ScheduleKind::ZeroBubbleH1, p, m, 1), p, 1);
        const SimulationResult r = simulate(s, p, 1, m, {}, model);
        ASSERT_TRUE(r.ok) << r.error;
        for (int rank = 0; rank < p; ++rank) {
          EXPECT_DOUBLE_EQ(r.busy[rank], 3.0 * m);
          EXPECT_LE(r.peak_in_flight[rank], std::min(m, p)) << "rank " << rank;
        }
        EXPECT_NEAR(r.bubble_fraction, theoretical_bubble(ScheduleKind::ZeroBubbleH1, p, m, 1), 1e-9)
            << format_schedule(s);
        if (m >= p) {
          EXPECT_DOUBLE_EQ(r.makespan, 3.0 * m + p - 1);
        }
        // Always below 1F1B's.
        if (p > 1) {
          EXPECT_LT(r.bubble_fraction, double(p - 1) / (m + p - 1));
        }
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 2 * 8 * 16);
}

// Weight gradients accumulate in microbatch order on every rank, as in every other schedule:
// switching from 1F1B to ZB-H1 leaves each parameter's gradient sums in the same order.
TEST(ZeroBubbleSchedules, WeightGradientsRunInMicrobatchOrder) {
  for (int p = 1; p <= 8; ++p)
    for (int m = 1; m <= 16; ++m) {
      const Schedule s = make_zb_h1(p, m);
      for (int r = 0; r < p; ++r) {
        int next_w = 0, next_i = 0;
        for (const Action& a : s[r]) {
          if (a.op == Op::BackwardWeight) {
            EXPECT_EQ(a.microbatch, next_w++);
          }
          if (a.op == Op::BackwardInput) {
            EXPECT_EQ(a.microbatch, next_i++);
          }
        }
        EXPECT_EQ(next_w, m);
      }
    }
}

TEST(ZeroBubbleSchedules, RefusesVirtualStages) {
  try {
    make_schedule(ScheduleKind::ZeroBubbleH1, 4, 8, 2);
    FAIL() << "accepted virtual_stages = 2";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("zb-h1 schedule: virtual_stages = 2"), std::string::npos);
  }
}

}  // namespace
}  // namespace meshtrain
