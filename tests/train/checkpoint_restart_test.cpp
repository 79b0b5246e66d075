// Checkpoint/restart (DESIGN invariant 2):
//  - same layout: 10 steps straight and 5 steps + save + a new Trainer + load + 5 steps give
//    bitwise identical losses, parameters and AdamW moments, for each ZeRO stage, tp, pp;
//  - another layout: a run saved on one layout and continued on others, a chain of them,
//    follows the uninterrupted single-rank trajectory within the layout-parity tolerances
//    (tests/parallel/layout_parity_test.cpp): fp32 1e-5, fp64 to round-off; the world can also
//    hand its checkpoint to a single rank (MPI_COMM_SELF);
//  - precision: an fp64 checkpoint loads into an fp32 run as the rounded values, and back; a
//    bf16 run (fp32 master weights) saves and loads like an fp32 one: bit for bit on the same
//    layout, other layouts within the bf16 layout-parity tolerances.
//
// One binary, launched by CTest under mpiexec with 1, 2 and 4 ranks.

#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/comm/agreement.h"
#include "meshtrain/config/layout_check.h"
#include "meshtrain/families/registry.h"
#include "meshtrain/parallel/process_grid.h"
#include "meshtrain/tensor/bf16.h"
#include "meshtrain/checkpoint/checkpointer.h"
#include "meshtrain/train/trainer.h"
#include "support/mpi_world.h"
#include "support/parity.h"
#include "support/sanitized.h"
#include "support/shared_temp_dir.h"
#include "support/tensors.h"

namespace meshtrain {
namespace {

using testing::world_rank;
using testing::world_size;

struct Layout {
  int dp, tp, pp, zero;
  int micro_batch;  // global batch 16
  ScheduleKind schedule = ScheduleKind::OneFOneB;
  int virtual_stages = 1;
  bool sequence_parallel = false;
  int cp = 1;
  int ep = 1;  // a mixture of experts' expert ranks (the MoE chains)

  int ranks() const { return dp * tp * pp * cp; }
  std::string name() const {
    return "dp" + std::to_string(dp) + "_tp" + std::to_string(tp) + "_pp" + std::to_string(pp) +
           "_zero" + std::to_string(zero) + "_mb" + std::to_string(micro_batch) + "_" +
           std::string(schedule_name(schedule)) + "_v" + std::to_string(virtual_stages) +
           (sequence_parallel ? "_sp" : "") + (cp > 1 ? "_cp" + std::to_string(cp) : "") +
           (ep > 1 ? "_ep" + std::to_string(ep) : "");
  }
  Config apply(Config c) const {
    c.parallel.dp = dp;
    c.parallel.tp = tp;
    c.parallel.pp = pp;
    c.parallel.cp = cp;
    c.parallel.ep = ep;
    c.parallel.zero = zero;
    c.parallel.schedule = schedule;
    c.parallel.virtual_stages = virtual_stages;
    c.parallel.sequence_parallel = sequence_parallel;
    c.parallel.bucket_mb = 0.01;  // several buckets, so ZeRO shards cut through parameters
    c.train.micro_batch = micro_batch;
    return c;
  }
};

using S = ScheduleKind;

// This rank's parameters and both moments, every owned piece in order, as doubles.
std::vector<double> owned_state(Trainer& trainer, Backend& be) {
  std::vector<double> out;
  for (const OwnedPiece& p : trainer.state().owned_pieces())
    for (const Tensor* t : {&p.value, &p.exp_avg, &p.exp_avg_sq}) {
      std::vector<double> host(static_cast<size_t>(t->numel()));
      if (t->dtype() == DType::F64) {
        be.copy_to_host(host.data(), *t);
      } else {
        std::vector<float> f(host.size());
        be.copy_to_host(f.data(), *t);
        host.assign(f.begin(), f.end());
      }
      out.insert(out.end(), host.begin(), host.end());
    }
  return out;
}

// Every parameter's value and moments as global tensors, each element from the one rank that
// holds it as primary, the same on every rank: comparable between runs whose ZeRO shards differ
// (buckets are sized in bytes, so a bf16 bucket holds twice the elements of an fp32 one). Data
// parallelism only (with pipeline stages, ranks would hold different parameters).
std::map<std::string, std::vector<double>> global_state(Trainer& trainer, Backend& be) {
  std::map<std::string, std::vector<double>> out;
  for (const Parameter* p : trainer.model().params().params())  // every rank: the same keys
    out[p->spec.name].assign(static_cast<size_t>(3 * p->spec.global_shape.numel()), 0.0);
  for (const OwnedPiece& p : trainer.state().owned_pieces()) {
    if (!p.primary) continue;
    std::vector<double>& g = out[p.param->spec.name];
    const int64_t n = p.param->spec.global_shape.numel();
    int k = 0;
    for (const Tensor* t : {&p.value, &p.exp_avg, &p.exp_avg_sq}) {
      const std::vector<double> host = testing::to_host(be, *t);
      for (int64_t i = 0; i < p.count; ++i)
        g[static_cast<size_t>(k * n + p.param->global_index(p.local_begin + i))] = host[static_cast<size_t>(i)];
      ++k;
    }
  }
  for (auto& [name, g] : out)
    MPI_Allreduce(MPI_IN_PLACE, g.data(), static_cast<int>(g.size()), MPI_DOUBLE, MPI_SUM,
                  MPI_COMM_WORLD);
  return out;
}

bool same_on_every_rank(bool mine) {
  int ok = mine ? 1 : 0, all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1;
}

constexpr int kSteps = 10, kSaveAt = 5;

// The model a test trains: the tiny GPT-2, its mixture of experts (testing::tiny_moe), or the
// tiny GPT-2 with 2 key/value heads, which tp 4 shares over pairs of ranks (k and v stored whole
// on each, with their biases: model/linear.h).
enum class ChainModel { Gpt2, Moe, SharedKv };

Config with_model(Config c, ChainModel model) {
  if (model == ChainModel::Moe) c.model = testing::tiny_moe(c.model);
  if (model == ChainModel::SharedKv) c.model.kv_heads_set = 2;
  return c;
}

std::vector<Layout> same_layouts(int world) {
  switch (world) {
    case 1: return {{1, 1, 1, 0, 4}, {1, 1, 1, 3, 8, S::GPipe}};
    case 2: return {{2, 1, 1, 1, 4}, {2, 1, 1, 2, 2}, {1, 2, 1, 0, 8, S::OneFOneB, 1, true},
                    {1, 1, 2, 0, 4}, {1, 1, 1, 3, 4, S::GPipe, 1, false, 2}};
    case 4: return {{2, 2, 1, 3, 4}, {1, 2, 2, 0, 4}, {2, 1, 2, 1, 2, S::Interleaved, 2}};
    default: return {};
  }
}

void check_same_layout(const Layout& l, DType precision, testing::SharedTempDir& dir,
                       OptimizerKind optimizer = OptimizerKind::AdamW,
                       ChainModel model = ChainModel::Gpt2) {
  const std::string name = l.name() + "_" + std::string(dtype_name(precision)) + "_" + optimizer_name(optimizer);
  SCOPED_TRACE(name);
  Config c = l.apply(with_model(testing::tiny_config(dir.path()), model));
  c.train.precision = precision;
  c.train.optimizer = optimizer;
  c.checkpoint.dir = dir.file("ckpt_" + name);
  check_layout(c, world_size());
  CpuBackend be(1);
  ProcessGrid grid(MPI_COMM_WORLD, c.grid_shape(), c.run.comm_timeout);

  std::vector<double> straight_losses, restart_losses;
  std::vector<double> straight_state, restart_state;
  {
    Trainer t(c, grid, be);
    for (int s = 0; s < kSteps; ++s) straight_losses.push_back(t.train_step(s).loss);
    straight_state = owned_state(t, be);
  }
  std::string path;
  {
    Trainer t(c, grid, be);
    for (int s = 0; s < kSaveAt; ++s) restart_losses.push_back(t.train_step(s).loss);
    path = Checkpointer(c, grid).save(t.state(), t.step()).path;
  }
  {
    Trainer t(c, grid, be);
    t.set_step(static_cast<int>(Checkpointer(c, grid).load(t.state(), path).step));
    ASSERT_EQ(t.step(), kSaveAt);
    ASSERT_EQ(t.state().steps_taken(), kSaveAt);
    for (int s = t.step(); s < kSteps; ++s) restart_losses.push_back(t.train_step(s).loss);
    restart_state = owned_state(t, be);
  }
  EXPECT_EQ(restart_losses, straight_losses);
  EXPECT_TRUE(same_on_every_rank(restart_state == straight_state))
      << "parameters or moments differ bitwise on some rank";
}

TEST(CheckpointRestart, SameLayoutContinuesBitForBit) {
  const std::vector<Layout> layouts = same_layouts(world_size());
  if (layouts.empty()) GTEST_SKIP() << "no layouts for " << world_size() << " ranks";
  testing::SharedTempDir dir;
  for (const Layout& l : layouts) check_same_layout(l, DType::F32, dir);
}

// Muon (train.optimizer = "muon"): its momentum is saved as the matrices' exp_avg, so a restart
// on the same layout repeats the uninterrupted run bit for bit, on one rank, over dp 2 (each
// matrix orthogonalised by its owner), over pp 2, over tp 2 and over dp 2 under ZeRO 2 (the
// momentum sharded), in fp32 and bf16 (fp32 master weights).
TEST(CheckpointRestart, MuonSameLayoutContinuesBitForBit) {
  std::vector<Layout> layouts;
  if (world_size() == 1) layouts = {{1, 1, 1, 0, 4}};
  if (world_size() == 2) layouts = {{2, 1, 1, 0, 4}, {1, 1, 2, 0, 4}, {1, 2, 1, 0, 4}, {2, 1, 1, 2, 4}};
  if (layouts.empty()) GTEST_SKIP() << "no Muon layouts for " << world_size() << " ranks";
  testing::SharedTempDir dir;
  for (const Layout& l : layouts) {
    check_same_layout(l, DType::F32, dir, OptimizerKind::Muon);
    if (cpu_runs_bf16()) check_same_layout(l, DType::BF16, dir, OptimizerKind::Muon);
  }
}

// The stage's buffers (the sigmoid router's expert bias, every layer's), in order.
std::vector<double> expert_bias(Trainer& t) {
  std::vector<double> out;
  for (const StageBuffer& b : t.model().buffers()) out.insert(out.end(), b.values->begin(), b.values->end());
  return out;
}

// A mixture of experts with DeepSeek-V3's router: a checkpoint carries its expert bias, which is
// no parameter, so that a resumed run repeats the uninterrupted one bit for bit, losses,
// parameters, moments and bias alike. gamma 0.01 moves the bias far enough within the run to
// change choices; a softmax-routed model (which has no bias) refuses the file.
// With pipeline stages, each rank still holds and saves every layer's bias.
TEST(CheckpointRestart, SigmoidRouterBiasContinuesBitForBit) {
  std::vector<Layout> layouts;
  if (world_size() == 1) layouts = {{1, 1, 1, 0, 4}};
  if (world_size() == 2) layouts = {{1, 1, 2, 0, 4}, {2, 1, 1, 1, 4}};
  if (world_size() == 4) layouts = {{2, 1, 2, 3, 4}};
  if (layouts.empty()) GTEST_SKIP() << "no layouts for " << world_size() << " ranks";
  testing::SharedTempDir dir;
  for (const Layout& l : layouts) {
    SCOPED_TRACE(l.name());
    Config c = l.apply(testing::tiny_config(dir.path()));
    ModelSpec& m = c.model;
    m = family_defaults("llama", gpt2_spec(4, 32, 4, 16, 256));
    m.ffn_hidden_set = 48;
    m.feed_forward = FeedForwardKind::Moe;
    m.moe.experts = 4;
    m.moe.top_k = 2;
    m.moe.ffn_hidden_set = 24;
    m.moe.first_dense_layers = 1;
    m.moe.router = RouterKind::Sigmoid;
    m.moe.route_scale = 2.0;
    m.moe.bias_update_rate = 0.01;
    c.checkpoint.dir = dir.file("ckpt_sigmoid_" + l.name());
    check_layout(c, world_size());
    CpuBackend be(1);
    ProcessGrid grid(MPI_COMM_WORLD, c.grid_shape(), c.run.comm_timeout);
    std::vector<double> straight_losses, restart_losses, straight_state, restart_state;
    std::vector<double> straight_bias, saved_bias, restart_bias;
    {
      Trainer t(c, grid, be);
      for (int s = 0; s < kSteps; ++s) straight_losses.push_back(t.train_step(s).loss);
      straight_state = owned_state(t, be);
      straight_bias = expert_bias(t);
    }
    std::string path;
    {
      Trainer t(c, grid, be);
      for (int s = 0; s < kSaveAt; ++s) restart_losses.push_back(t.train_step(s).loss);
      saved_bias = expert_bias(t);
      Checkpointer ck(c, grid);
      path = ck.save(t.state(), t.step()).path;
    }
    {
      Config softmax = c;
      softmax.model.moe.router = RouterKind::Softmax;
      softmax.model.moe.route_scale = 1.0;
      softmax.model.moe.bias_update_rate = 0;
      Trainer t(softmax, grid, be);
      EXPECT_THROW(Checkpointer(softmax, grid).load(t.state(), path), AgreedError) << "the deck's model has no bias";
    }
    {
      Trainer t(c, grid, be);
      Checkpointer ck(c, grid);
      t.set_step(static_cast<int>(ck.load(t.state(), path).step));
      EXPECT_EQ(expert_bias(t), saved_bias) << "the bias is not restored";
      for (int s = t.step(); s < kSteps; ++s) restart_losses.push_back(t.train_step(s).loss);
      restart_state = owned_state(t, be);
      restart_bias = expert_bias(t);
    }
    ASSERT_EQ(straight_bias.size(), 3u * 4u);
    EXPECT_NE(saved_bias, std::vector<double>(saved_bias.size(), 0.0)) << "the bias never moved";
    EXPECT_NE(saved_bias, straight_bias) << "the bias stopped moving after the save";
    EXPECT_EQ(restart_losses, straight_losses);
    EXPECT_EQ(restart_bias, straight_bias);
    EXPECT_TRUE(same_on_every_rank(restart_state == straight_state))
        << "parameters or moments differ bitwise on some rank";
  }
}

// bf16 mixed precision: the checkpoint holds the fp32 master weights and moments, the bf16
// parameters are their cast, so a restart continues bit for bit too. The first and last layout
// of each world size (ZeRO 3 on one rank; dp with ZeRO 1, and pp; tp x pp, and interleaved
// dp x pp with ZeRO 1).
TEST(CheckpointRestart, Bf16SameLayoutContinuesBitForBit) {
  const std::vector<Layout> layouts = same_layouts(world_size());
  if (layouts.empty()) GTEST_SKIP() << "no layouts for " << world_size() << " ranks";
  testing::SharedTempDir dir;
  check_same_layout(layouts.front(), DType::BF16, dir);
  check_same_layout(layouts.back(), DType::BF16, dir);
}

// Segments of one run: steps [begin of segment, end) on a layout, saved at its end and loaded
// by the next.
struct Segment {
  Layout layout;
  int end_step;
};

std::vector<std::vector<Segment>> chains(int world) {
  switch (world) {
    case 1: return {{{{1, 1, 1, 3, 4}, 5}, {{1, 1, 1, 0, 16}, 10}}};
    case 2: return {
        {{{2, 1, 1, 0, 8}, 3}, {{1, 2, 1, 0, 8}, 6}, {{1, 1, 2, 3, 4}, 10}},
        {{{1, 1, 2, 0, 4, S::Interleaved, 2}, 5}, {{2, 1, 1, 2, 2}, 10}},
        // Context parallelism saves the same layout-free file: ZeRO-3 over the cp pair, then dp.
        {{{1, 1, 1, 3, 4, S::OneFOneB, 1, false, 2}, 5}, {{2, 1, 1, 1, 4}, 10}},
    };
    case 4: return {
        {{{2, 2, 1, 1, 4, S::OneFOneB, 1, true}, 3}, {{1, 2, 2, 0, 4}, 6},
         {{4, 1, 1, 3, 2}, 8}, {{2, 1, 2, 2, 2}, 10}},
        {{{1, 2, 1, 0, 4, S::OneFOneB, 1, true, 2}, 3}, {{1, 1, 1, 2, 4, S::GPipe, 1, false, 4}, 6},
         {{2, 1, 1, 1, 2, S::OneFOneB, 1, false, 2}, 8}, {{1, 1, 2, 0, 4, S::ZeroBubbleV, 2, false, 2}, 10}},
    };
    default: return {};
  }
}

// A mixture of experts (testing::tiny_moe) saved with its experts split over ep ranks resumes
// on another split, or none: its checkpoints hold the experts as global tensors.
std::vector<std::vector<Segment>> moe_chains(int world) {
  switch (world) {
    case 2: return {
        {{{2, 1, 1, 0, 8, S::OneFOneB, 1, false, 1, 2}, 3}, {{1, 1, 2, 3, 4}, 6},
         {{1, 1, 1, 1, 4, S::OneFOneB, 1, false, 2, 2}, 10}},
    };
    case 4: return {
        {{{4, 1, 1, 1, 2, S::OneFOneB, 1, false, 1, 4}, 4}, {{2, 1, 2, 2, 2, S::OneFOneB, 1, false, 1, 2}, 7},
         {{1, 2, 2, 0, 4, S::OneFOneB, 1, true}, 10}},
    };
    default: return {};
  }
}

// Muon's momentum is saved by parameter name (exp_avg) whatever owned its matrices: a run saved
// over dp 2 resumes on pp 2, then on cp 2; over tp 2 (its pieces of split matrices), on dp 2
// under ZeRO 3 (the owned shards), then under ZeRO 1; over dp 4, on dp 2 x pp 2.
std::vector<std::vector<Segment>> muon_chains(int world) {
  switch (world) {
    case 2: return {{{{2, 1, 1, 0, 8}, 3}, {{1, 1, 2, 0, 4}, 6}, {{1, 1, 1, 0, 4, S::OneFOneB, 1, false, 2}, 10}},
                    {{{1, 2, 1, 0, 4}, 3}, {{2, 1, 1, 3, 8}, 6}, {{2, 1, 1, 1, 4}, 10}}};
    case 4: return {{{{4, 1, 1, 0, 2}, 4}, {{2, 1, 2, 0, 2}, 10}}};
    default: return {};
  }
}

// tp 4 beyond the 2 key/value heads (with sp), resumed at tp 1 over dp 4 under ZeRO 1: the
// shared heads' weights are stored once, as global tensors.
std::vector<std::vector<Segment>> shared_kv_chains(int world) {
  if (world != 4) return {};
  return {{{{1, 4, 1, 0, 4, S::OneFOneB, 1, true}, 5}, {{4, 1, 1, 1, 2}, 10}}};
}

std::string chain_name(const std::vector<Segment>& chain) {
  std::string out;
  for (const Segment& s : chain) out += (out.empty() ? "" : " -> ") + s.layout.name();
  return out;
}

// Runs every chain of this world size (`model`: another model's chains on it; `optimizer`
// Muon: Muon's chains) against the single-rank reference of 10 steps.
void check_chains(DType precision, double loss_tol, double params_tol,
                  ChainModel model = ChainModel::Gpt2,
                  OptimizerKind optimizer = OptimizerKind::AdamW) {
  const bool muon = optimizer == OptimizerKind::Muon, moe = model == ChainModel::Moe;
  const std::vector<std::vector<Segment>> all =
      muon                              ? muon_chains(world_size())
      : moe                             ? moe_chains(world_size())
      : model == ChainModel::SharedKv ? shared_kv_chains(world_size())
                                        : chains(world_size());
  if (all.empty()) GTEST_SKIP() << "no chains for " << world_size() << " ranks";
  // Under the sanitizers the dense fp64 chains are left to the Release run: they save and load
  // through the code the fp32 chains run, with another HDF5 type (the mixture's chains, fp64,
  // still run: they alone split experts).
  if (testing::kSanitized && precision == DType::F64 && !moe)
    GTEST_SKIP() << "under the sanitizers the dense fp64 chains are left to the Release run";
  testing::SharedTempDir dir;
  Config base = with_model(testing::tiny_config(dir.path()), model);
  base.train.precision = precision;
  base.train.steps = kSteps;
  base.train.optimizer = optimizer;
  const testing::Reference ref = testing::run_reference(base, kSteps);
  for (size_t k = 0; k < all.size(); ++k) {
    const std::vector<Segment>& chain = all[k];
    SCOPED_TRACE(chain_name(chain));
    std::string path;
    std::vector<double> losses;
    testing::ParityResult r;
    int step = 0;
    for (size_t i = 0; i < chain.size(); ++i) {
      Config c = chain[i].layout.apply(base);
      c.checkpoint.dir = dir.file("chain" + std::to_string(k));
      // Both transfer modes write and read every layout (the tiny model's "auto" would always
      // choose collective).
      c.checkpoint.io = (i + k + (precision == DType::F64)) % 2 ? CheckpointIo::Independent
                                                                 : CheckpointIo::Collective;
      check_layout(c, world_size());
      CpuBackend be(1);
      ProcessGrid grid(MPI_COMM_WORLD, c.grid_shape(), c.run.comm_timeout);
      Trainer t(c, grid, be);
      Checkpointer ck(c, grid);
      if (!path.empty()) {
        t.set_step(static_cast<int>(ck.load(t.state(), path).step));
        ASSERT_EQ(t.step(), step);
      }
      for (; step < chain[i].end_step; ++step) losses.push_back(t.train_step(step).loss);
      if (i + 1 < chain.size()) path = ck.save(t.state(), t.step()).path;
      else r = testing::compare_with_reference(t, be, MPI_COMM_WORLD, losses, 0, ref);
    }
    if (world_rank() == 0)
      std::printf("  %s %-100s loss %.2e params %.2e\n", std::string(dtype_name(precision)).c_str(),
                  chain_name(chain).c_str(), r.max_loss_error, r.params_l2_error);
    EXPECT_LT(r.max_loss_error, loss_tol);
    EXPECT_LT(r.params_l2_error, params_tol);
  }
}

TEST(CheckpointRestart, Fp32OtherLayoutsFollowTheSingleRankTrajectory) {
  check_chains(DType::F32, 1e-5, 1e-5);
}

// The bf16 layout-parity tolerances for layouts with tensor parallelism (the chains have some):
// loss 1e-4, parameters 3e-3 (tests/parallel/layout_parity_test.cpp says why).
TEST(CheckpointRestart, Bf16OtherLayoutsFollowTheSingleRankBf16Trajectory) {
  check_chains(DType::BF16, 1e-4, 3e-3);
}

TEST(CheckpointRestart, Fp64OtherLayoutsFollowTheSingleRankTrajectoryToRoundoff) {
  check_chains(DType::F64, 1e-12, 1e-12);
}

// Expert parallelism saves and loads the experts as global tensors: another ep, or none, resumes.
TEST(CheckpointRestart, Fp64MixtureOfExpertsResumesOnAnotherExpertSplit) {
  check_chains(DType::F64, 1e-12, 1e-12, ChainModel::Moe);
}

TEST(CheckpointRestart, Fp64MuonResumesOnOtherLayoutsToRoundoff) {
  check_chains(DType::F64, 1e-12, 1e-12, ChainModel::Gpt2, OptimizerKind::Muon);
}

// tp beyond the key/value heads (issue 55): a run on tp 4 over 2 key/value heads continues bit
// for bit on the same layout, and resumed at tp 1 follows the single rank to round-off.
TEST(CheckpointRestart, Fp64SharedKeyValueHeadsResumeOnTheirLayoutAndAtTp1) {
  if (world_size() != 4) GTEST_SKIP() << "runs on 4 ranks (tp 4 over 2 key/value heads)";
  testing::SharedTempDir dir;
  check_same_layout({1, 4, 1, 0, 4, S::OneFOneB, 1, true}, DType::F64, dir, OptimizerKind::AdamW,
                    ChainModel::SharedKv);
  check_chains(DType::F64, 1e-12, 1e-12, ChainModel::SharedKv);
}

// The world's checkpoint continued by one rank alone (every rank runs it on MPI_COMM_SELF),
// against the straight run on the world.
TEST(CheckpointRestart, WorldCheckpointContinuesOnOneRank) {
  const std::vector<Layout> layouts = same_layouts(world_size());
  if (world_size() == 1 || layouts.empty()) GTEST_SKIP() << "needs more than one rank";
  testing::SharedTempDir dir;
  Config base = testing::tiny_config(dir.path());
  base.train.steps = kSteps;
  const testing::Reference ref = testing::run_reference(base, kSteps);
  const Layout& l = layouts.front();
  Config c = l.apply(base);
  c.checkpoint.dir = dir.file("ckpt");
  check_layout(c, world_size());
  std::vector<double> losses;
  std::string path;
  {
    CpuBackend be(1);
    ProcessGrid grid(MPI_COMM_WORLD, c.grid_shape(), c.run.comm_timeout);
    Trainer t(c, grid, be);
    for (int s = 0; s < kSaveAt; ++s) losses.push_back(t.train_step(s).loss);
    path = Checkpointer(c, grid).save(t.state(), t.step()).path;
  }
  Config one = Layout{1, 1, 1, 0, 16}.apply(base);
  one.checkpoint.dir = c.checkpoint.dir;
  check_layout(one, 1);
  CpuBackend be(1);
  ProcessGrid grid(MPI_COMM_SELF, one.grid_shape(), one.run.comm_timeout);
  Trainer t(one, grid, be);
  Checkpointer(one, grid).load(t.state(), path);
  for (int s = kSaveAt; s < kSteps; ++s) losses.push_back(t.train_step(s).loss);
  const testing::ParityResult r = testing::compare_with_reference(t, be, MPI_COMM_SELF, losses, 0, ref);
  EXPECT_LT(r.max_loss_error, 1e-5) << l.name() << " -> one rank";
  EXPECT_LT(r.params_l2_error, 1e-5) << l.name() << " -> one rank";
}

// A checkpoint of one precision loads into a run of another: fp64 values become the nearest
// fp32 values, fp32 values become exact fp64 values. A bf16 run's checkpoint holds its fp32
// master weights and moments: an fp32 run continues from them exactly, and a bf16 run takes an
// fp32 checkpoint's values as its master weights (fp64 ones rounded to fp32).
TEST(CheckpointRestart, PrecisionIsConvertedOnLoad) {
  testing::SharedTempDir dir;
  const std::pair<DType, DType> pairs[] = {{DType::F64, DType::F32}, {DType::F32, DType::F64},
                                           {DType::BF16, DType::F32}, {DType::F32, DType::BF16},
                                           {DType::F64, DType::BF16}, {DType::BF16, DType::F64}};
  for (const auto& [from, to] : pairs) {
    SCOPED_TRACE(std::string(dtype_name(from)) + " -> " + std::string(dtype_name(to)));
    Config c = Layout{world_size(), 1, 1, world_size() > 1 ? 1 : 0, 16 / world_size()}.apply(
        testing::tiny_config(dir.path()));
    c.checkpoint.dir = dir.file(std::string("ckpt_") + std::string(dtype_name(from)) + "_" +
                                std::string(dtype_name(to)));
    check_layout(c, world_size());
    CpuBackend be(1);
    ProcessGrid grid(MPI_COMM_WORLD, c.grid_shape(), c.run.comm_timeout);
    c.train.precision = from;
    Trainer a(c, grid, be);
    for (int s = 0; s < 2; ++s) a.train_step(s);
    const std::string path = Checkpointer(c, grid).save(a.state(), a.step()).path;
    std::map<std::string, std::vector<double>> want = global_state(a, be);
    if (from == DType::F64)  // the state of an fp32 or bf16 run is fp32
      for (auto& [name, values] : want)
        for (double& v : values) v = static_cast<float>(v);
    Config d = c;
    d.train.precision = to;
    Trainer b(d, grid, be);
    b.set_step(static_cast<int>(Checkpointer(d, grid).load(b.state(), path).step));
    EXPECT_TRUE(global_state(b, be) == want);
    EXPECT_EQ(b.step(), 2);
    if (to == DType::BF16) {  // the bf16 parameters are the loaded master weights, rounded
      std::vector<Parameter*> pa = a.model().params().params(), pb = b.model().params().params();
      ASSERT_EQ(pa.size(), pb.size());
      bool same = true;
      for (size_t i = 0; i < pa.size(); ++i) {
        std::vector<double> values = testing::to_host(be, pa[i]->value);
        for (double& v : values) v = bf16_bits_to_float(float_to_bf16_bits(static_cast<float>(v)));
        same = same && testing::to_host(be, pb[i]->value) == values;
      }
      EXPECT_TRUE(same_on_every_rank(same)) << "bf16 parameters are not the rounded masters";
    }
  }
}

}  // namespace
}  // namespace meshtrain
