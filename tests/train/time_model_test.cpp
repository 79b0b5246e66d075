// The time model and the layout advisor on machines built in code: each test changes one thing
// about the machine or the layout and checks that the prediction moves the way the physics
// says, by the amount the model's own terms say.

#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include <omp.h>

#include "meshtrain/config/deck.h"
#include "meshtrain/config/deck_error.h"
#include "meshtrain/config/layout_check.h"
#include "meshtrain/families/registry.h"
#include "meshtrain/parallel/schedule_simulator.h"
#include "meshtrain/train/layout_advisor.h"
#include "meshtrain/train/planner.h"
#include "meshtrain/train/time_model.h"

namespace meshtrain {
namespace {

// A GPU-like node: flat GEMM rate (1e12 FLOP/s at any shape), 1e11 B/s memory, links with no
// latency at 1e10 B/s inside a node and `inter` B/s across nodes.
MachineProfile machine(double inter = 1e9, int ranks_per_node = 8) {
  MachineProfile p;
  p.path = "test.toml";
  p.name = "test";
  p.source = "measured";
  p.device = "cuda";
  p.ranks_per_node = ranks_per_node;
  p.cores_per_node = 64;
  GemmRates g;
  g.peak = 2e12;
  g.sizes = {1, 1e6};
  g.flops = {1e12, 1e12};
  p.gemm_fp32 = g;
  p.memory_bytes_per_s = 1e11;
  for (int k = 0; k < kCollectiveKinds; ++k) {
    p.intra_node[static_cast<size_t>(k)] = AlphaBeta{0, 1e10};
    p.inter_node[static_cast<size_t>(k)] = AlphaBeta{0, inter};
  }
  return p;
}

Config deck(int dp, int tp, int pp, int micro_batch = 1, int global_batch = 16) {
  Config c = parse_deck("t.toml", "");
  c.model = gpt2_spec(8, 256, 8, 128, 512);
  c.run.device = DeviceChoice::Cuda;
  c.train.precision = DType::F32;
  c.train.global_batch = global_batch;
  c.train.micro_batch = micro_batch;
  c.parallel.dp = dp;
  c.parallel.tp = tp;
  c.parallel.pp = pp;
  check_layout(c, dp * tp * pp);
  return c;
}

TEST(TimeModel, OneRankIsComputeAndOptimizerOnly) {
  const StepTimePrediction t = predict_step_time(deck(1, 1, 1), machine());
  EXPECT_GT(t.compute_s, 0);
  EXPECT_EQ(t.tp_comm_s, 0);
  EXPECT_EQ(t.dp_exposed_s, 0);
  EXPECT_NEAR(t.bubble_s, 0, 1e-12);
  EXPECT_NEAR(t.step_s, t.compute_s + t.optimizer_s, 1e-12);
  // MFU: the model's FLOPs over the peak; a flat rate at half the peak bounds it by 1/2.
  EXPECT_GT(t.mfu, 0.1);
  EXPECT_LT(t.mfu, 0.5);
}

TEST(TimeModel, ComputeScalesWithTheGemmRate) {
  MachineProfile fast = machine();
  fast.gemm_fp32->flops = {2e12, 2e12};
  fast.memory_bytes_per_s = 2e11;
  const StepTimePrediction a = predict_step_time(deck(1, 1, 1), machine());
  const StepTimePrediction b = predict_step_time(deck(1, 1, 1), fast);
  EXPECT_NEAR(b.compute_s, a.compute_s / 2, a.compute_s * 1e-9);
}

TEST(TimeModel, PipelineBubbleFollowsTheScheduleShape) {
  // Four stages of two layers each; the first and last carry the embedding and the head, so
  // the bubble is near, not exactly, (p - 1) / (m + p - 1).
  for (int m : {4, 16}) {
    Config c = deck(1, 1, 4, 1, m);
    c.parallel.schedule = ScheduleKind::GPipe;
    const StepTimePrediction t = predict_step_time(c, machine());
    const double pipeline = t.compute_s + t.bubble_s;
    EXPECT_NEAR(t.bubble_s / pipeline, 3.0 / (m + 3), 0.08) << "m = " << m;
  }
  // More micro-batches shrink the bubble; interleaving shrinks it further.
  Config one = deck(1, 1, 4, 1, 8), inter = one;
  inter.parallel.schedule = ScheduleKind::Interleaved;
  inter.parallel.virtual_stages = 2;
  EXPECT_LT(predict_step_time(inter, machine()).bubble_s, predict_step_time(one, machine()).bubble_s);
}

TEST(TimeModel, TensorGroupsCrossingNodesPayTheSlowLink) {
  // tp 8 inside 8-rank nodes vs inside 4-rank nodes (then across two): same work, slower link.
  const Config c = deck(1, 8, 1);
  const StepTimePrediction inside = predict_step_time(c, machine(1e9, 8));
  const StepTimePrediction across = predict_step_time(c, machine(1e9, 4));
  EXPECT_GT(inside.tp_comm_s, 0);
  EXPECT_NEAR(across.tp_comm_s / inside.tp_comm_s, 10.0, 1e-6);  // 1e10 / 1e9 B/s
  EXPECT_NEAR(across.compute_s, inside.compute_s, 1e-12);
}

TEST(TimeModel, DataParallelReductionHidesBehindBackwardUntilItCannot) {
  // Fast links: only the last bucket shows. Slow links: most of the reduction shows.
  const Config c = deck(8, 1, 1);
  const StepTimePrediction fast = predict_step_time(c, machine(1e9, 8));
  MachineProfile slow = machine(1e9, 8);
  for (auto& link : slow.intra_node) link = AlphaBeta{0, 1e7};
  const StepTimePrediction crawl = predict_step_time(c, slow);
  EXPECT_GT(crawl.dp_exposed_s, 50 * fast.dp_exposed_s);
  EXPECT_GT(crawl.stages[0].dp_comm_s, crawl.dp_exposed_s * 0.99);
  // ZeRO-3 gathers parameters for every micro-batch: more communication than ZeRO-1.
  Config z1 = deck(8, 1, 1, 1, 32), z3 = z1;
  z1.parallel.zero = 1;
  z3.parallel.zero = 3;
  EXPECT_GT(predict_step_time(z3, slow).stages[0].dp_comm_s, 3 * predict_step_time(z1, slow).stages[0].dp_comm_s);
}

// train.optimizer = "muon": each block matrix's Newton-Schulz is priced as its three GEMMs per
// iteration at the GEMM rate (here flat, 1e12 FLOP/s), and the owners divide the matrices over
// the replicas: 2 replicas each do half, and add the updates' all-reduce.
TEST(TimeModel, MuonPricesNewtonSchulzDividedOverTheReplicas) {
  const auto muon_share = [](int dp) {
    const Config adamw = deck(dp, 1, 1);
    Config muon = adamw;
    muon.train.optimizer = OptimizerKind::Muon;
    return predict_step_time(muon, machine()).optimizer_s - predict_step_time(adamw, machine()).optimizer_s;
  };
  // GPT-2 at C = 256, 8 layers: qkv 256 x 768, proj 256 x 256, fc 256 x 1024, proj 1024 x 256.
  double flops = 0;
  for (const auto& [n, m] : std::vector<std::pair<double, double>>{{256, 768}, {256, 256}, {256, 1024}, {256, 1024}})
    flops += 2 * (n * n * m + n * n * n + n * m * n);
  const double one_rank = 8 * 5 * flops / 1e12;
  EXPECT_NEAR(muon_share(1), one_rank, 1e-9 * one_rank);
  const double elements = 8 * 256.0 * (768 + 256 + 1024 + 1024);
  const double all_reduce = machine().link(LinkClass::IntraNode, CollectiveKind::AllReduce).seconds(CollectiveKind::AllReduce, elements * 4, 2);
  EXPECT_NEAR(muon_share(2), one_rank / 2 + all_reduce + machine().sync_seconds, 1e-9 * one_rank);
}

// Muon under tp and ZeRO (parallel/muon_matrices.h): the owners are the replicas times the tensor
// ranks, so tp 2 halves the Newton-Schulz like dp 2, and adds the two all-reduces over tp that
// sum the pieces into whole matrices and the updates back; ZeRO gathers its pieces before and
// reduce-scatters the updates after, in place of ZeRO 0's all-reduce.
TEST(TimeModel, MuonPricesTheMovesOfItsMatricesUnderTpAndZero) {
  const auto muon_share = [](int dp, int tp, int zero) {
    Config adamw = deck(dp, tp, 1);
    adamw.parallel.zero = zero;
    Config muon = adamw;
    muon.train.optimizer = OptimizerKind::Muon;
    return predict_step_time(muon, machine()).optimizer_s - predict_step_time(adamw, machine()).optimizer_s;
  };
  const double one_rank = muon_share(1, 1, 0);
  const double bytes = 4 * 8 * 256.0 * (768 + 256 + 1024 + 1024);  // the whole matrices, fp32
  const auto collective = [](CollectiveKind kind, double b) {
    return machine().sync_seconds + machine().link(LinkClass::IntraNode, kind).seconds(kind, b, 2);
  };
  EXPECT_NEAR(muon_share(1, 2, 0), one_rank / 2 + 2 * collective(CollectiveKind::AllReduce, bytes),
              1e-9 * one_rank);
  EXPECT_NEAR(muon_share(2, 1, 1),
              one_rank / 2 + collective(CollectiveKind::AllGather, bytes) +
                  collective(CollectiveKind::ReduceScatter, bytes),
              1e-9 * one_rank);
  // tp 2 x dp 2 under ZeRO 3: a quarter of the work each; the replicas move half-matrices.
  EXPECT_NEAR(muon_share(2, 2, 3),
              one_rank / 4 + 2 * collective(CollectiveKind::AllReduce, bytes) +
                  collective(CollectiveKind::AllGather, bytes / 2) +
                  collective(CollectiveKind::ReduceScatter, bytes / 2),
              1e-9 * one_rank);
}

TEST(TimeModel, RecomputationCostsForwardAgain) {
  Config none = deck(1, 1, 1), full = none, selective = none;
  full.parallel.recompute = Recompute::Full;
  selective.parallel.recompute = Recompute::Selective;
  const double base = predict_step_time(none, machine()).compute_s;
  const double f = predict_step_time(full, machine()).compute_s;
  const double s = predict_step_time(selective, machine()).compute_s;
  EXPECT_GT(f, s);
  EXPECT_GT(s, base);
  EXPECT_LT(f, base * 1.5);  // forward is about a third of forward + backward
}

TEST(TimeModel, SharedCpuCoresLendBubblesToBusyRanks) {
  // 8 ranks on 2 cores: the rates are each rank's share with all busy, so a pipeline runs no
  // longer than the node's work at those rates, and no shorter than its critical path at a
  // whole core's speed.
  MachineProfile cpu = machine();
  cpu.device = "cpu";
  cpu.cores_per_node = 2;
  Config c = deck(2, 1, 4, 1, 8);
  c.run.device = DeviceChoice::Cpu;
  const StepTimePrediction shared = predict_step_time(c, cpu);
  cpu.cores_per_node = 64;
  const StepTimePrediction alone = predict_step_time(c, cpu);
  EXPECT_LT(shared.step_s, alone.step_s);
  ASSERT_FALSE(shared.caveats.empty());
}

// Bubbles lend cores only where waiting ranks leave them: under the MPI libraries' default
// polling (calibrate measures waiting_ranks_lend = 0) 8 ranks on 2 cores run as if every rank kept
// its share, and half-lending ranks land in between (8 ranks on 6 cores: a bubble's lent cores
// shorten the pipeline without reaching the node's whole work).
TEST(TimeModel, WaitingRanksThatSpinLendNoCores) {
  MachineProfile cpu = machine();
  cpu.device = "cpu";
  cpu.cores_per_node = 6;
  Config c = deck(2, 1, 4, 1, 8);
  c.run.device = DeviceChoice::Cpu;
  const double lending = predict_step_time(c, cpu).step_s;
  cpu.waiting_ranks_lend = 0;
  const StepTimePrediction spinning = predict_step_time(c, cpu);
  cpu.waiting_ranks_lend = 0.5;
  const double half = predict_step_time(c, cpu).step_s;
  MachineProfile own_cores = machine();
  own_cores.device = "cpu";
  own_cores.cores_per_node = 64;
  EXPECT_DOUBLE_EQ(spinning.step_s, predict_step_time(c, own_cores).step_s);
  EXPECT_LT(lending, half);
  EXPECT_LT(half, spinning.step_s);
  bool said = false;
  for (const std::string& note : spinning.caveats) said = said || note.find("spin") != std::string::npos;
  EXPECT_TRUE(said) << "the prediction says that waiting ranks keep their cores";
  EXPECT_LE(step_time_lower_bound(c, cpu), half);
}

// A mixture of experts in every block (Llama's block otherwise): 8 SwiGLU experts of width 128,
// top 2, on dp ranks of one node with the experts split over ep of them.
Config moe_deck(int dp, int ep, int zero = 0) {
  Config c = parse_deck("t.toml", "");
  c.model = family_defaults("llama", gpt2_spec(4, 256, 8, 128, 512));
  c.model.feed_forward = FeedForwardKind::Moe;
  c.model.moe.experts = 8;
  c.model.moe.top_k = 2;
  c.model.moe.ffn_hidden_set = 128;
  c.run.device = DeviceChoice::Cuda;
  c.train.precision = DType::F32;
  c.train.global_batch = 16;
  c.train.micro_batch = 2;
  c.parallel.dp = dp;
  c.parallel.ep = ep;
  c.parallel.zero = zero;
  check_layout(c, dp);
  return c;
}

bool has_caveat(const StepTimePrediction& t, const std::string& text) {
  for (const std::string& c : t.caveats)
    if (c.find(text) != std::string::npos) return true;
  return false;
}

// Expert parallelism's exchange, per MoE layer and micro-batch: the counts and the rows out and
// back in forward, the gradients out and back in backward, each an all_to_all over the ep ranks
// of this rank's tokens x top_k rows of d_model, (ep-1)/ep of which leave it.
TEST(TimeModel, ExpertParallelismPricesItsAllToAll) {
  MachineProfile p = machine();
  p.intra_node[static_cast<size_t>(CollectiveKind::AllToAll)] = AlphaBeta{1e-6, 5e9};
  p.sync_seconds = 2e-6;
  const StepTimePrediction ep1 = predict_step_time(moe_deck(4, 1), p);
  const StepTimePrediction ep2 = predict_step_time(moe_deck(4, 2), p);
  EXPECT_EQ(ep1.ep_comm_s, 0);
  const double m = 16 / (2 * 4), layers = 4;
  const double rows = 2.0 * 128 * 2 * 256 * 4;  // tokens x top_k x d_model x fp32
  const double counts = 8 * 8;                   // one int64 per expert
  const auto a2a = [&](double bytes) { return 1 * 1e-6 + 0.5 * bytes / 5e9 + 2e-6; };
  EXPECT_NEAR(ep2.ep_comm_s, m * layers * (a2a(counts) + 4 * a2a(rows)), 1e-15);
  EXPECT_NE(describe_prediction(ep2).find(", ep "), std::string::npos) << describe_prediction(ep2);
  EXPECT_EQ(describe_prediction(ep1).find(", ep "), std::string::npos) << describe_prediction(ep1);
  EXPECT_TRUE(has_caveat(ep2, "routing is priced as balanced"));
  EXPECT_TRUE(has_caveat(ep1, "routing is priced as balanced"));
  EXPECT_FALSE(has_caveat(predict_step_time(deck(4, 1, 1), p), "routing"));
  // Full recomputation re-runs forward, its exchanges included.
  Config full = moe_deck(4, 2);
  full.parallel.recompute = Recompute::Full;
  EXPECT_NEAR(predict_step_time(full, p).ep_comm_s, m * layers * (2 * a2a(counts) + 6 * a2a(rows)), 1e-15);

  // An older profile without all_to_all: all_gather's model (the same steps and bytes), said.
  MachineProfile old = p;
  old.intra_node[static_cast<size_t>(CollectiveKind::AllToAll)].reset();
  old.inter_node[static_cast<size_t>(CollectiveKind::AllToAll)].reset();
  old.intra_node[static_cast<size_t>(CollectiveKind::AllGather)] = AlphaBeta{1e-6, 5e9};
  const StepTimePrediction fallback = predict_step_time(moe_deck(4, 2), old);
  EXPECT_NEAR(fallback.ep_comm_s, ep2.ep_comm_s, 1e-15);
  EXPECT_TRUE(has_caveat(fallback, "no all_to_all measurement"));
  EXPECT_FALSE(has_caveat(ep2, "no all_to_all measurement"));
}

// The experts' GEMMs are priced as the grouped GEMM each rank runs (Backend::
// grouped_matmul_forward): experts / ep groups, each of a balanced share of the routed rows,
// tokens x top_k x ep / experts. ep 1 here: 8 groups of 2 x 128 x 2 / 8 = 64 rows; ep 2: 4 groups
// of 128. The same FLOPs, so where the GEMM rate does not depend on size the two cost the same;
// where it rises with size the larger groups of ep 2 are faster, by exactly the difference of
// the groups' own times (the rest of the step is the same work).
TEST(TimeModel, ExpertGemmsArePricedAsGroupedGemmsOfBalancedRouting) {
  const MachineProfile flat = machine();
  EXPECT_NEAR(predict_step_time(moe_deck(4, 2), flat).compute_s,
              predict_step_time(moe_deck(4, 1), flat).compute_s, 1e-12);

  MachineProfile rising = machine();
  rising.gemm_fp32->sizes = {1, 1024};
  rising.gemm_fp32->flops = {1e10, 1e12};
  const GemmRates& g = *rising.gemm_fp32;
  const double C = 256, F = 128;
  // One micro-batch's expert GEMMs in one layer: gate and up (C -> F), down (F -> C), each
  // forward, input gradient and weight gradient, for every group.
  const auto experts = [&](double groups, double rows) {
    const double gate_or_up = g.seconds(rows, F, C) + g.seconds(rows, C, F) + g.seconds(C, F, rows);
    const double down = g.seconds(rows, C, F) + g.seconds(rows, F, C) + g.seconds(F, C, rows);
    return groups * (2 * gate_or_up + down);
  };
  const double micro_batches = 16 / (2 * 4), layers = 4;
  const StepTimePrediction ep1 = predict_step_time(moe_deck(4, 1), rising);
  const StepTimePrediction ep2 = predict_step_time(moe_deck(4, 2), rising);
  const double want = micro_batches * layers * (experts(8, 64) - experts(4, 128));
  EXPECT_GT(want, 0);
  EXPECT_NEAR(ep1.compute_s - ep2.compute_s, want, 1e-9 * want);
}

// Expert groups crossing nodes pay the inter-node all_to_all; the experts' gradients are
// reduced over the expert-data group only, so an ep spanning every replica reduces none of them.
TEST(TimeModel, ExpertParallelismLinksAndReductions) {
  MachineProfile two_per_node = machine(1e9, 2);
  const StepTimePrediction inside = predict_step_time(moe_deck(4, 2), two_per_node);
  const StepTimePrediction across = predict_step_time(moe_deck(4, 4), two_per_node);
  // Inter-node: 10x slower links; 3/4 of the rows leave a rank under ep 4 against 1/2 under ep 2.
  EXPECT_NEAR(across.ep_comm_s / inside.ep_comm_s, 10 * (3.0 / 4) / (1.0 / 2), 1e-9);

  const StepTimePrediction ep1 = predict_step_time(moe_deck(4, 1), machine());
  const StepTimePrediction ep4 = predict_step_time(moe_deck(4, 4), machine());
  EXPECT_LT(ep4.stages[0].dp_comm_s, ep1.stages[0].dp_comm_s);
  EXPECT_LT(ep4.optimizer_s, ep1.optimizer_s);  // each rank steps a quarter of the experts
  // ZeRO-1 shards the experts over their expert-data group (2 ranks under ep 2 of dp 4).
  const StepTimePrediction z1 = predict_step_time(moe_deck(4, 2, 1), machine());
  EXPECT_GT(z1.stages[0].dp_comm_s, 0);
}

TEST(TimeModel, MissingRatesAreNamed) {
  Config c = deck(1, 1, 1);
  c.train.precision = DType::BF16;
  try {
    predict_step_time(c, machine());
    FAIL() << "no bf16 rates";
  } catch (const DeckError& e) {
    EXPECT_NE(std::string(e.what()).find("test.toml"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bf16"), std::string::npos) << e.what();
  }
}

TEST(LayoutAdvisor, RanksByTimeAndKeepsToTheBudgetAndTheDeck) {
  Config base = deck(8, 1, 1, 1, 16);
  const AdvisorResult all = advise_layouts(base, 8, machine(), LayoutFreedom{}, 0, 1, 5);
  ASSERT_EQ(all.fitting, 5u);
  for (size_t i = 1; i < all.fitting; ++i) EXPECT_LE(all.ranked[i - 1].time.step_s, all.ranked[i].time.step_s);
  // A budget below the best layout's plan moves the choice to one that fits.
  const size_t tight = all.ranked[0].peak_bytes - 1;
  const AdvisorResult fitted = advise_layouts(base, 8, machine(), LayoutFreedom{}, tight, 1, 1);
  ASSERT_EQ(fitted.fitting, 1u);
  EXPECT_LE(fitted.ranked[0].peak_bytes, tight);
  EXPECT_GT(fitted.planned + fitted.stopped_over_budget, 1u);  // the faster ones stopped past it
  // Nothing fits one byte.
  EXPECT_EQ(advise_layouts(base, 8, machine(), LayoutFreedom{}, 1, 1, 1).fitting, 0u);
  // Only what the deck leaves "auto" moves.
  LayoutFreedom only_zero;
  only_zero = LayoutFreedom{false, false, false, false, false, true, false};
  const AdvisorResult z = advise_layouts(base, 8, machine(), only_zero, 0, 1, 0);
  EXPECT_EQ(z.layouts, 4u);  // zero 0-3
  for (const RankedLayout& r : z.ranked) {
    EXPECT_EQ(r.config.parallel.tp, 1);
    EXPECT_EQ(r.config.parallel.dp, 8);
    EXPECT_EQ(r.config.train.micro_batch, 1);
  }
}

// The advisor chooses ep for a mixture of experts among the divisors of dp x cp that divide the
// experts (ep 1 included), ranked by the same prediction; a dense model's layouts keep ep 1.
TEST(LayoutAdvisor, ChoosesExpertParallelismForAMixtureOnly) {
  std::set<int> eps;
  for (const Config& c : enumerate_layouts(moe_deck(4, 1), 4)) {
    const int replicas = c.parallel.dp * c.parallel.cp;
    EXPECT_EQ(replicas % c.parallel.ep, 0);
    EXPECT_EQ(c.model.moe.experts % c.parallel.ep, 0);
    eps.insert(c.parallel.ep);
  }
  EXPECT_EQ(eps, (std::set<int>{1, 2, 4}));
  for (const Config& c : enumerate_layouts(deck(4, 1, 1), 4)) EXPECT_EQ(c.parallel.ep, 1);

  MachineProfile p = machine();
  p.intra_node[static_cast<size_t>(CollectiveKind::AllToAll)] = AlphaBeta{1e-6, 5e9};
  const AdvisorResult ranked = advise_layouts(moe_deck(4, 1), 4, p, LayoutFreedom{}, 0, 1, 0);
  size_t expert_parallel = 0;
  for (const RankedLayout& r : ranked.ranked) {
    if (r.config.parallel.ep > 1) ++expert_parallel;
    // The bound the advisor prunes by holds for these layouts too.
    if (r.time.step_s > 0) {
      EXPECT_LE(r.lower_bound_s, r.time.step_s * (1 + 1e-12) + 1e-15) << layout_name(r.config);
    }
  }
  EXPECT_GT(expert_parallel, 0u);
  // A deck's ep stays where the deck fixes it (no "auto" for ep).
  LayoutFreedom fixed;
  fixed.ep = false;
  for (const RankedLayout& r : advise_layouts(moe_deck(4, 2), 4, p, fixed, 0, 1, 0).ranked)
    EXPECT_EQ(r.config.parallel.ep, 2);
}

// The advisor skips simulating layouts by this bound, so it must never exceed the prediction:
// every layout of a deck, on a GPU-like node and on CPU ranks sharing cores (whose bubbles lend
// cores, the case where the bound divides by the sharing).
TEST(TimeModel, LowerBoundNeverExceedsThePrediction) {
  MachineProfile cpu = machine();
  cpu.device = "cpu";
  cpu.cores_per_node = 2;
  for (const MachineProfile& profile : {machine(), cpu}) {
    Config base = deck(16, 1, 1, 1, 32);
    if (profile.device == "cpu") base.run.device = DeviceChoice::Cpu;
    int below = 0, layouts = 0;
    for (const Config& c : enumerate_layouts(base, 16)) {
      const double bound = step_time_lower_bound(c, profile), time = predict_step_time(c, profile).step_s;
      EXPECT_LE(bound, time * (1 + 1e-12)) << layout_name(c) << " on " << profile.device;
      below += bound < time * (1 - 1e-9) ? 1 : 0;
      ++layouts;
    }
    EXPECT_GT(below, layouts / 4) << "the bound is the prediction itself almost everywhere: no bound";
  }
}

// Bounded work, the same answer: the listed layouts and their order are those of simulating and
// planning every layout, while most layouts are never simulated.
TEST(LayoutAdvisor, SimulatesOnlyLayoutsThatCouldBeatTheListed) {
  const Config base = deck(8, 1, 1, 1, 16);
  const AdvisorResult every = advise_layouts(base, 8, machine(), LayoutFreedom{}, 0, 1, 0);
  const AdvisorResult top = advise_layouts(base, 8, machine(), LayoutFreedom{}, 0, 1, 5);
  ASSERT_EQ(top.fitting, 5u);
  EXPECT_EQ(every.predicted, every.layouts);
  EXPECT_LT(top.predicted, top.layouts / 2) << "simulated " << top.predicted << " of " << top.layouts;
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(layout_name(top.ranked[i].config), layout_name(every.ranked[i].config)) << i;
    EXPECT_EQ(top.ranked[i].time.step_s, every.ranked[i].time.step_s) << i;
  }
  // Under a budget that only slower layouts meet, the planned ones are still the fastest that fit.
  const size_t tight = every.ranked[0].peak_bytes - 1;
  const AdvisorResult fitted = advise_layouts(base, 8, machine(), LayoutFreedom{}, tight, 1, 3);
  const AdvisorResult fitted_every = advise_layouts(base, 8, machine(), LayoutFreedom{}, tight, 1, 0);
  for (size_t i = 0; i < fitted.fitting; ++i)
    EXPECT_EQ(layout_name(fitted.ranked[i].config), layout_name(fitted_every.ranked[i].config)) << i;
}

TEST(LayoutAdvisor, DeckAutoKeysLeaveChoicesOpen) {
  const Config c = parse_deck("a.toml", "[parallel]\ntp = \"auto\"\nzero = \"auto\"\nrecompute = \"auto\"\n"
                                        "schedule = \"auto\"\npp = 2\n[train]\nmicro_batch = \"auto\"\n");
  const LayoutFreedom f = freedom_of(c);
  EXPECT_TRUE(f.dp && f.tp && f.zero && f.recompute && f.schedule && f.micro_batch);
  EXPECT_FALSE(f.pp);
  EXPECT_EQ(c.parallel.pp, 2);
  try {
    parse_deck("a.toml", "[parallel]\ntp = \"automatic\"\n");
    FAIL() << "accepted";
  } catch (const DeckError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("parallel.tp"), std::string::npos) << m;
    EXPECT_NE(m.find("automatic"), std::string::npos) << m;
    EXPECT_NE(m.find("\"auto\""), std::string::npos) << m;
  }
}

// `plan --all` and the advisor run their dry runs side by side: each plan must be the one the
// dry run gives alone, in the order asked, and an error the first layout's in that order (two
// bad layouts fail at different moments on different threads).
TEST(Planner, SideBySideDryRunsGiveThePlansOfOneAtATime) {
  std::vector<Config> configs;
  for (const Config& c : enumerate_layouts(deck(4, 1, 1, 1, 8), 4)) configs.push_back(c);
  ASSERT_GE(configs.size(), 8u);
  configs.resize(24 < configs.size() ? 24 : configs.size());
  const int threads_before = omp_get_max_threads();
  omp_set_num_threads(4);  // side by side even where the test runs under OMP_NUM_THREADS=1
  const std::vector<LayoutPlan> together = plan_layouts(configs, 4, 1);
  ASSERT_EQ(together.size(), configs.size());
  for (size_t i = 0; i < configs.size(); ++i) {
    const LayoutPlan alone = plan_layout(configs[i], 4, 1);
    EXPECT_EQ(together[i].layout(), alone.layout()) << i;
    ASSERT_EQ(together[i].stages.size(), alone.stages.size()) << alone.layout();
    for (size_t s = 0; s < alone.stages.size(); ++s) {
      EXPECT_EQ(together[i].stages[s].peak, alone.stages[s].peak) << alone.layout() << " stage " << s;
      EXPECT_EQ(together[i].stages[s].at_peak, alone.stages[s].at_peak) << alone.layout() << " stage " << s;
      EXPECT_EQ(together[i].stages[s].peak_total, alone.stages[s].peak_total) << alone.layout();
    }
  }
  // Two layouts that 4 ranks cannot take: tp 3 (does not divide 4), then pp 8 (more than 4).
  std::vector<Config> bad = configs;
  bad[5].parallel.tp = 3;
  bad[2].parallel.pp = 8;
  std::string first_error;
  try {
    plan_layout(bad[2], 4, 1);
  } catch (const DeckError& e) {
    first_error = e.what();
  }
  ASSERT_FALSE(first_error.empty());
  try {
    plan_layouts(bad, 4, 1);
    ADD_FAILURE() << "plan_layouts took a layout 4 ranks cannot run";
  } catch (const DeckError& e) {
    EXPECT_EQ(std::string(e.what()), first_error);
  }
  omp_set_num_threads(threads_before);
}

}  // namespace
}  // namespace meshtrain
