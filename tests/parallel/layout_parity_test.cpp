// Layout invariance (DESIGN invariant 1): the same deck trained on any dp x tp x pp x cp layout,
// with any schedule, micro-batch count, sequence parallelism, ZeRO stage or recomputation, follows
// the single-rank trajectory (one micro-batch, no ZeRO) over 5 AdamW steps: in fp64 to
// round-off, element by element; in fp32 within 1e-5 for the loss and the parameters; in bf16
// mixed precision the single-rank bf16 run, within fp32's tolerances without tensor parallelism
// and looser ones with it (see the tolerances below). The same layout run twice is bitwise
// identical, in fp32 and bf16.
//
// One binary, launched by CTest under mpiexec with 1, 2, 4 and 8 ranks; each launch runs the
// layouts of its world size.

#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "meshtrain/parallel/slowdown.h"
#include "support/mpi_world.h"
#include "support/parity.h"
#include "support/temp_dir.h"

namespace meshtrain {
namespace {

using testing::world_rank;
using testing::world_size;

struct Layout {
  int dp, tp, pp;
  ScheduleKind schedule;
  int virtual_stages;
  int micro_batch;  // sequences per micro-batch; global batch 16
  bool sequence_parallel;
  int zero = 0;
  Recompute recompute = Recompute::None;
  // Declared rank speeds (parallel.balance = "declared"): uneven data-parallel shares and a
  // speed-weighted pipeline partition (train/work_balance.h).
  std::vector<double> speeds = {};
  int cp = 1;  // context-parallel ranks: each holds 2 of the 2 cp chunks of every sequence

  std::string name() const {
    const char* rc[] = {"none", "selective", "full"};
    return "dp" + std::to_string(dp) + "_tp" + std::to_string(tp) + "_pp" + std::to_string(pp) +
           "_" + std::string(schedule_name(schedule)) + "_v" + std::to_string(virtual_stages) +
           "_m" + std::to_string(16 / (dp * micro_batch)) + (sequence_parallel ? "_sp" : "") +
           "_zero" + std::to_string(zero) + "_rc-" + rc[static_cast<int>(recompute)] +
           (speeds.empty() ? "" : "_uneven") + (cp > 1 ? "_cp" + std::to_string(cp) : "");
  }
  Config apply(Config c) const {
    c.parallel.dp = dp;
    c.parallel.tp = tp;
    c.parallel.pp = pp;
    c.parallel.cp = cp;
    c.parallel.schedule = schedule;
    c.parallel.virtual_stages = virtual_stages;
    c.parallel.sequence_parallel = sequence_parallel;
    c.parallel.zero = zero;
    c.parallel.recompute = recompute;
    c.parallel.bucket_mb = 0.01;  // several buckets even for the tiny model
    c.train.micro_batch = micro_batch;
    if (!speeds.empty()) {
      c.parallel.balance = Balance::Declared;
      c.parallel.rank_speeds = speeds;
    }
    return c;
  }
};

using S = ScheduleKind;
using R = Recompute;

// `l` with its sequences split over `cp` ranks besides its dp x tp x pp.
Layout context_parallel(Layout l, int cp) {
  l.cp = cp;
  return l;
}

// Every axis alone and combined; 1 to 8 micro-batches; all schedules; SP on and off; each ZeRO
// stage and recompute mode, alone and with tp and pp.
std::vector<Layout> layouts_for(int world) {
  switch (world) {
    case 1: return {
        {1, 1, 1, S::OneFOneB, 1, 2, false},            // 8 micro-batches of gradient accumulation
        {1, 1, 1, S::GPipe, 2, 4, false},               // two chunks on one rank
        {1, 1, 1, S::OneFOneB, 1, 4, false, 1},
        {1, 1, 1, S::OneFOneB, 1, 4, false, 2},
        {1, 1, 1, S::GPipe, 1, 4, false, 3},
        {1, 1, 1, S::OneFOneB, 1, 4, false, 0, R::Selective},
        {1, 1, 1, S::OneFOneB, 1, 4, false, 0, R::Full},
        {1, 1, 1, S::ZeroBubbleH1, 1, 2, false},        // I and W apart on one rank
        {1, 1, 1, S::ZeroBubbleH1, 1, 4, false, 3, R::Full},
        {1, 1, 1, S::ZeroBubbleV, 2, 2, false},         // both V chunks on one rank
    };
    case 2: return {
        {2, 1, 1, S::OneFOneB, 1, 8, false},
        {2, 1, 1, S::OneFOneB, 1, 2, false},
        {1, 2, 1, S::OneFOneB, 1, 8, false},
        {1, 2, 1, S::GPipe, 1, 4, true},
        {1, 1, 2, S::GPipe, 1, 2, false},
        {1, 1, 2, S::OneFOneB, 1, 4, false},
        {1, 1, 2, S::OneFOneB, 1, 16, false},           // one micro-batch
        {1, 1, 2, S::Interleaved, 2, 2, false},
        {1, 1, 2, S::Interleaved, 4, 4, false},
        {2, 1, 1, S::OneFOneB, 1, 2, false, 1},
        {2, 1, 1, S::OneFOneB, 1, 2, false, 2},
        {2, 1, 1, S::OneFOneB, 1, 4, false, 3},
        {2, 1, 1, S::GPipe, 1, 2, false, 3, R::Full},
        {1, 2, 1, S::OneFOneB, 1, 4, true, 0, R::Selective},
        {1, 1, 2, S::OneFOneB, 1, 2, false, 0, R::Full},
        {2, 1, 1, S::OneFOneB, 1, 2, false, 0, R::None, {1.0, 0.4}},   // shares 6 and 2
        {2, 1, 1, S::GPipe, 1, 1, false, 1, R::Selective, {0.3, 1.0}},  // ZeRO-1, shares 4 and 12
        {1, 1, 2, S::OneFOneB, 1, 2, false, 0, R::None, {1.0, 0.5}},   // 3 + 1 layers
        {1, 1, 2, S::ZeroBubbleH1, 1, 2, false},
        {1, 1, 2, S::ZeroBubbleH1, 1, 4, false, 0, R::Selective},
        {1, 1, 2, S::ZeroBubbleV, 2, 2, false},         // embedding and head on rank 0
        {1, 1, 2, S::ZeroBubbleV, 2, 4, false, 0, R::Selective},
        context_parallel({1, 1, 1, S::OneFOneB, 1, 4, false}, 2),
        context_parallel({1, 1, 1, S::GPipe, 1, 16, false, 1, R::Full}, 2),
        context_parallel({1, 1, 1, S::OneFOneB, 1, 2, false, 3, R::Selective}, 2),
    };
    case 4: return {
        {1, 1, 4, S::GPipe, 1, 2, false},
        {1, 1, 4, S::OneFOneB, 1, 2, false},
        {1, 1, 4, S::Interleaved, 2, 4, false},
        {2, 2, 1, S::OneFOneB, 1, 4, false},
        {2, 2, 1, S::OneFOneB, 1, 2, true},
        {2, 1, 2, S::OneFOneB, 1, 2, false},
        {2, 1, 2, S::GPipe, 1, 8, false},
        {1, 2, 2, S::OneFOneB, 1, 4, true},
        {1, 2, 2, S::Interleaved, 2, 4, false},
        {4, 1, 1, S::OneFOneB, 1, 1, false},
        {2, 2, 1, S::OneFOneB, 1, 4, true, 1},
        {2, 2, 1, S::OneFOneB, 1, 4, true, 2},
        {2, 2, 1, S::OneFOneB, 1, 2, true, 3},
        {2, 1, 2, S::OneFOneB, 1, 2, false, 2, R::Selective},
        {2, 1, 2, S::Interleaved, 2, 4, false, 3, R::Full},
        {1, 2, 2, S::OneFOneB, 1, 4, true, 1, R::Full},
        {4, 1, 1, S::OneFOneB, 1, 1, false, 0, R::None, {1.0, 1.0, 1.0, 0.5}},  // 5 5 4 2
        {2, 1, 2, S::OneFOneB, 1, 1, false, 1, R::None, {1.0, 0.5, 1.0, 1.0}},  // stage and replica
        {2, 1, 2, S::Interleaved, 2, 1, false, 0, R::Full, {0.5, 1.0, 1.0, 1.0}},  // shares of 2
        {1, 1, 4, S::ZeroBubbleH1, 1, 2, false},
        {2, 1, 2, S::ZeroBubbleH1, 1, 2, false, 3, R::Full},
        {1, 2, 2, S::ZeroBubbleH1, 1, 4, true, 2},
        {2, 1, 2, S::ZeroBubbleH1, 1, 1, false, 1, R::None, {1.0, 0.5, 1.0, 1.0}},
        {1, 1, 4, S::ZeroBubbleV, 2, 2, false},
        {2, 1, 2, S::ZeroBubbleV, 2, 2, false, 1},
        {1, 2, 2, S::ZeroBubbleV, 2, 4, true, 0, R::Full},
        context_parallel({1, 1, 1, S::OneFOneB, 1, 4, false}, 4),
        context_parallel({1, 1, 1, S::GPipe, 1, 2, false, 3, R::Full}, 4),  // ZeRO-3 over cp
        context_parallel({1, 2, 1, S::OneFOneB, 1, 4, true}, 2),
        context_parallel({1, 1, 2, S::ZeroBubbleH1, 1, 2, false, 1}, 2),
        context_parallel({2, 1, 1, S::OneFOneB, 1, 2, false, 2}, 2),
    };
    case 8: return {
        {2, 2, 2, S::GPipe, 1, 2, false},
        {2, 2, 2, S::OneFOneB, 1, 2, true},
        {2, 2, 2, S::OneFOneB, 1, 8, false},
        {2, 2, 2, S::Interleaved, 2, 4, true},
        {2, 2, 2, S::Interleaved, 4, 2, false},
        {1, 2, 4, S::OneFOneB, 1, 2, true},
        {2, 1, 4, S::Interleaved, 2, 2, false},
        {2, 2, 2, S::OneFOneB, 1, 2, true, 1},
        {2, 2, 2, S::OneFOneB, 1, 4, true, 2, R::Selective},
        {2, 2, 2, S::Interleaved, 2, 2, true, 3, R::Full},
        {2, 2, 2, S::OneFOneB, 1, 1, true, 1, R::Selective, {1, 1, 1, 1, 1, 1, 0.5, 0.5}},
        {2, 2, 2, S::ZeroBubbleH1, 1, 2, true, 3, R::Selective},
        {1, 2, 4, S::ZeroBubbleH1, 1, 2, true, 1},
        context_parallel({1, 2, 2, S::OneFOneB, 1, 2, true}, 2),
        context_parallel({1, 2, 2, S::ZeroBubbleV, 2, 4, true, 1, R::Selective}, 2),
        context_parallel({2, 1, 1, S::OneFOneB, 1, 2, false, 3, R::Full}, 4),
        context_parallel({1, 1, 2, S::Interleaved, 2, 4, false, 2}, 4),
    };
    default: return {};
  }
}

constexpr int kSteps = 5;

struct Tolerances {
  double loss;          // per step, relative
  double params;        // all parameters as one vector, norm-wise relative
  double each_tensor;   // every parameter tensor, norm-wise relative
  double each_element;  // every element (every copy), relative to its tensor's largest value
};

// `tp_tol`, when given, holds for the layouts with tensor parallelism, `tol` for the others.
void check_matrix(DType precision, const Tolerances& tol, const Tolerances* tp_tol = nullptr) {
  const std::vector<Layout> layouts = layouts_for(world_size());
  if (layouts.empty()) GTEST_SKIP() << "no layouts for " << world_size() << " ranks";
  testing::TempDir dir;
  Config base = testing::tiny_config(dir.path());
  base.train.precision = precision;
  const testing::Reference ref = testing::run_reference(base, kSteps);
  if (world_rank() == 0)
    std::printf("# %s: %-46s %10s %10s %10s %10s\n", std::string(dtype_name(precision)).c_str(),
                "layout", "loss", "params", "tensor", "element");
  // MESHTRAIN_PARITY_LAYOUTS=zb-v runs only the layouts whose name holds that text (a quick
  // check of one schedule; CTest sets nothing and runs them all).
  const char* only = std::getenv("MESHTRAIN_PARITY_LAYOUTS");
  for (const Layout& l : layouts) {
    if (only && l.name().find(only) == std::string::npos) continue;
    SCOPED_TRACE(l.name());
    const Tolerances& t = (l.tp > 1 || l.cp > 1) && tp_tol ? *tp_tol : tol;
    const testing::ParityResult r = testing::run_parallel(l.apply(base), kSteps, ref);
    if (world_rank() == 0)
      std::printf("  %-52s %10.2e %10.2e %10.2e %10.2e  %s\n", l.name().c_str(), r.max_loss_error,
                  r.params_l2_error, r.max_param_l2_error, r.max_param_error,
                  r.worst_l2_param.c_str());
    EXPECT_LT(r.max_loss_error, t.loss);
    EXPECT_LT(r.params_l2_error, t.params);
    EXPECT_LT(r.max_param_l2_error, t.each_tensor) << "worst tensor: " << r.worst_l2_param;
    EXPECT_LT(r.max_param_error, t.each_element) << "worst element in: " << r.worst_param;
  }
}

// The proof of the logic: in double precision reassociation costs ~1e-16 per operation, so
// any layout must agree with the single rank to round-off, element by element. A wrong slice,
// a missing micro-batch or a double-counted gradient shows up as 1e-3 or worse.
TEST(LayoutParity, Fp64EveryLayoutMatchesSingleRankToRoundoff) {
  check_matrix(DType::F64, {1e-12, 1e-12, 1e-11, 1e-10});
}

// The statement for training precision: loss after every step, and all parameters, within
// 1e-5 of the single rank. Element by element fp32 cannot promise that under Adam: an element
// whose gradient is a sum that nearly cancels carries a large relative rounding error, and
// Adam normalises it into a full-size update (the largest element error, ~2e-4 of its tensor's
// scale at lr 6e-4, appears already between 1 and 8 micro-batches on ONE rank). So each tensor
// is held norm-wise to the measured fp32 floor times ~5, and elements to 1e-3.
TEST(LayoutParity, Fp32EveryLayoutFollowsTheSingleRankTrajectory) {
  check_matrix(DType::F32, {1e-5, 1e-5, 1e-4, 1e-3});
}

// bf16 mixed precision against the single-rank bf16 run. bf16 keeps 8 significant bits: a
// value rounded to bf16 from fp32 sums that differ in their last bits (reassociated by another
// layout) lands on a neighbouring bf16 value now and then, an error of up to 2^-7 of it. How
// often depends on the layout:
//  - without tensor parallelism every activation comes from the same kernels on the same rows;
//    only fp32 sums are reassociated (gradients over micro-batches and data-parallel ranks, GEMM
//    blocking for other row counts), and the flips are rare: the loss and the parameters as a
//    whole stay at fp32's level (measured loss <= 3.3e-6, params <= 5.8e-6; held to 1e-5 and
//    3e-5). One flip in a gradient that nearly cancels is enough for Adam to give an element of
//    a zero-initialised bias a different update: measured in the sanitizer build (every layout
//    alike against the single rank) 3.9e-4 of a tensor and 1.2e-3 of an element, held to 5e-3
//    and 2e-2;
//  - with tensor parallelism each row-parallel GEMM's partial sums are rounded to bf16 before
//    the tensor group adds them (in fp32) and rounds again: two roundings where the single rank
//    makes one, in every block, every micro-batch, so activations differ by about an ulp
//    throughout. Measured loss 1.1e-5 and params 5.8e-4 (the bf16 single rank is 7e-5 and
//    7.5e-4 from the fp32 one), held to 1e-4 and 3e-3: a lost micro-batch or a wrong slice costs
//    1e-3 and 1e-2 or more. Per tensor and per element the differences are Adam's, as above but
//    everywhere: an element whose gradient is within bf16 noise of zero (zero-initialised biases
//    after 5 steps) gets a full-size update of either sign, so it may differ by its tensor's
//    whole scale, as it does between the bf16 and fp32 single-rank runs (tensor 0.14, element
//    0.69; TP layouts: 0.14, 0.63). Held to 0.5 and 2: they catch a tensor gone wrong as a whole
//    and blow-ups, no more; the loss and the parameters as a whole carry the check;
//  - context parallelism (ring attention) merges each query row's attention over 2 to 2 cp
//    blocks, rounding the bf16 output at every merge where the single rank rounds once: the
//    same kind of difference as tensor parallelism's, held to the same tolerances (measured
//    loss <= 3.8e-5, params <= 6.5e-4).
TEST(LayoutParity, Bf16EveryLayoutFollowsTheSingleRankBf16Trajectory) {
  const Tolerances tp{1e-4, 3e-3, 0.5, 2.0};
  check_matrix(DType::BF16, {1e-5, 3e-5, 5e-3, 2e-2}, &tp);
}

// The same losses, and the same parameter bits on every rank.
void expect_bitwise_equal(const testing::ParityResult& a, const testing::ParityResult& b) {
  EXPECT_EQ(a.losses, b.losses);
  int same = a.owned_values == b.owned_values ? 1 : 0, all_same = 0;
  MPI_Allreduce(&same, &all_same, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  EXPECT_EQ(all_same, 1) << "parameters differ bitwise on some rank";
}

TEST(LayoutParity, SameLayoutTwiceIsBitwiseIdentical) {
  const std::vector<Layout> layouts = layouts_for(world_size());
  if (layouts.empty()) GTEST_SKIP() << "no layouts for " << world_size() << " ranks";
  for (DType precision : {DType::F32, DType::BF16}) {
    testing::TempDir dir;
    Config base = testing::tiny_config(dir.path());
    base.train.precision = precision;
    const testing::Reference ref = testing::run_reference(base, kSteps);
    for (const Layout& l : {layouts.front(), layouts.back()}) {
      SCOPED_TRACE(l.name() + " " + std::string(dtype_name(precision)));
      const testing::ParityResult a = testing::run_parallel(l.apply(base), kSteps, ref);
      const testing::ParityResult b = testing::run_parallel(l.apply(base), kSteps, ref);
      expect_bitwise_equal(a, b);
    }
  }
}

// A zero-bubble schedule only moves each weight gradient later; every rank still adds its
// micro-batches' gradients into each element in micro-batch order. So where the gradients are
// reduced once per step (ZeRO 0 and 1) ZB-H1 and 1F1B of the same layout agree bit for bit.
TEST(LayoutParity, ZeroBubbleIsBitwiseOneFOneB) {
  std::vector<Layout> pairs;
  for (const Layout& l : layouts_for(world_size()))
    if (l.schedule == S::ZeroBubbleH1 && l.zero <= 1) pairs.push_back(l);
  if (pairs.empty()) GTEST_SKIP() << "no zb-h1 layouts with ZeRO 0 or 1 for " << world_size() << " ranks";
  testing::TempDir dir;
  const Config base = testing::tiny_config(dir.path());
  const testing::Reference ref = testing::run_reference(base, kSteps);
  for (const Layout& zb : pairs) {
    Layout one_f_one_b = zb;
    one_f_one_b.schedule = S::OneFOneB;
    SCOPED_TRACE(zb.name());
    const testing::ParityResult a = testing::run_parallel(zb.apply(base), kSteps, ref);
    const testing::ParityResult b = testing::run_parallel(one_f_one_b.apply(base), kSteps, ref);
    expect_bitwise_equal(a, b);
  }
}

// Under ZB-H1 the executor pulls a weight gradient forward while it waits for a transfer, so
// which actions a weight gradient runs between depends on timing. The sums must not: a rank
// slowed four-fold (its peers then wait, and pull) gives the bits of an unslowed run. ZB-V pulls
// none; re-planned for measured costs (parallel.schedule_costs), each timing gives it its own
// schedule, and the bits of the unit schedule.
TEST(LayoutParity, ZeroBubbleIsBitwiseWhateverTheTiming) {
  std::vector<Layout> zero_bubble;
  for (const Layout& l : layouts_for(world_size()))
    if ((l.schedule == S::ZeroBubbleH1 || l.schedule == S::ZeroBubbleV) && l.pp > 1)
      zero_bubble.push_back(l);
  if (zero_bubble.empty()) GTEST_SKIP() << "no zero-bubble pipelines for " << world_size() << " ranks";
  testing::TempDir dir;
  const Config base = testing::tiny_config(dir.path());
  const testing::Reference ref = testing::run_reference(base, kSteps);
  for (const Layout& l : zero_bubble) {
    SCOPED_TRACE(l.name());
    const testing::ParityResult even = testing::run_parallel(l.apply(base), kSteps, ref);
    // zb-v re-planned for the measured costs (after the second of the kSteps steps): another
    // schedule for every timing, the same bits.
    Config run = l.apply(base);
    run.parallel.measured_schedule_costs = l.schedule == S::ZeroBubbleV;
    if (run.parallel.measured_schedule_costs)
      expect_bitwise_equal(even, testing::run_parallel(run, kSteps, ref));
    for (int slowed = 0; slowed < 2; ++slowed) {
      SCOPED_TRACE("world rank " + std::to_string(slowed) + " four times slower");
      if (world_rank() == slowed) set_compute_slowdown(4);
      const testing::ParityResult skewed = testing::run_parallel(run, kSteps, ref);
      set_compute_slowdown(1);
      expect_bitwise_equal(even, skewed);
    }
  }
}

}  // namespace
}  // namespace meshtrain
