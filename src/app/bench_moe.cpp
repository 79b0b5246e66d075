// The `moe` suite (mpiexec -n N, N >= 2 dividing 8): a mixture of experts against its ceiling.
//  1. Training steps of a Llama-block model whose every feed-forward is 8 SwiGLU experts of
//     which each token takes 2, at ep 1 and ep N over N data ranks, against the dense model of
//     the same active parameters (one SwiGLU of twice the expert width) on the same ranks: the
//     ceiling, a model that computes what a token uses and routes nothing (ratio = its step
//     time / this one).
//  2. The expert exchange of one layer (the rows of N ranks' tokens to their experts' ranks
//     and back) with a shared expert computing while the rows travel, against the exchange alone
//     and the shared expert alone: hidden = 1 - (overlapped - shared alone) / exchange alone,
//     the share of the all-to-all the shared expert hides.

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "meshtrain/app/bench_suites.h"
#include "bench_measure.h"
#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/comm/mpi_communicator.h"
#include "meshtrain/config/layout_check.h"
#include "meshtrain/families/registry.h"
#include "meshtrain/model/expert_exchange.h"
#include "meshtrain/train/straggler_report.h"  // median_of
#include "meshtrain/train/trainer.h"

namespace meshtrain {

namespace {

constexpr int kExperts = 8, kTopK = 2;
constexpr int64_t kExpertWidth = 256;

ModelSpec moe_bench_model(bool moe) {
  ModelSpec m = family_defaults("llama", gpt2_spec(4, 256, 4, 128, 256));
  if (!moe) {
    m.ffn_hidden_set = kTopK * kExpertWidth;  // the experts a token passes, as one
    return m;
  }
  m.feed_forward = FeedForwardKind::Moe;
  m.moe.experts = kExperts;
  m.moe.top_k = kTopK;
  m.moe.ffn_hidden_set = kExpertWidth;
  return m;
}

void training_steps(const BenchArgs& args, BenchReport& report, int ranks, CpuBackend& backend) {
  report.columns({"ep", "step_ms", "tokens_per_s", "peak_MiB", "ratio"});
  report.header("moe: dp " + std::to_string(ranks) + ", Llama block 4 layers d_model 256 T 128, " +
                std::to_string(kExperts) + " experts of width " + std::to_string(kExpertWidth) +
                ", top " + std::to_string(kTopK) + "; ceiling: the dense model of the same active "
                "parameters (ffn " + std::to_string(kTopK * kExpertWidth) + "); ratio = its step "
                "time / this one");
  double ceiling = 0;
  struct Case {
    const char* name;
    bool moe;
    int ep;
  };
  for (const Case& k : {Case{"dense, same active parameters", false, 1}, Case{"moe, ep 1", true, 1},
                        Case{"moe, ep all ranks", true, ranks}}) {
    Config c = bench_deck("moe", moe_bench_model(k.moe));
    c.train.micro_batch = 4;
    c.train.global_batch = 8 * ranks;
    c.parallel.dp = ranks;
    c.parallel.ep = k.ep;
    check_layout(c, ranks);
    ProcessGrid grid(MPI_COMM_WORLD, c.grid_shape(), 600.0);
    Trainer trainer(c, grid, backend);
    trainer.reset_memory_peaks();
    std::vector<double> ms;
    int wrong = 0;
    for (int s = 0; s <= args.steps; ++s) {
      const StepResult r = trainer.train_step(s);
      if (!std::isfinite(r.loss)) wrong = 1;
      if (s > 0) ms.push_back(r.seconds * 1e3);
    }
    const double t = median_of(ms);
    if (ceiling == 0) ceiling = t;
    const double tokens = static_cast<double>(c.train.global_batch * c.model.seq_len);
    const MemoryPeaks& p = trainer.memory_peaks()[0];
    report.row(k.name, {static_cast<double>(k.ep), t, tokens / (t / 1e3),
                        static_cast<double>(p.peak_total) / (1 << 20), ceiling / t},
               wrong);
  }
}

void exchange_overlap(const BenchArgs& args, BenchReport& report, int ranks, CpuBackend& be) {
  MpiCommunicator comm(MPI_COMM_WORLD, "ep");
  ProgressThread progress;  // as the trainer drives the exchange
  const ExpertParallel ep{&comm, &progress};
  const int64_t N = 4 * 128, C = 256, shared_width = kTopK * kExpertWidth;
  MoeSpec spec;
  spec.experts = kExperts;
  spec.top_k = kTopK;
  // Each rank's tokens routed on random logits (its own seed): uneven counts between peers.
  std::vector<double> logits(static_cast<size_t>(N * kExperts));
  std::mt19937 gen(100 + comm.rank());
  std::normal_distribution<double> normal(0.0, 1.0);
  for (double& v : logits) v = normal(gen);
  const Routing routing = route_tokens(logits.data(), N, spec);
  const int64_t M = static_cast<int64_t>(routing.token_of_row.size());
  const Tensor x = random_normal_tensor(be, {N, C}, 7), rows = random_normal_tensor(be, {M, C}, 8);
  const Tensor w_gate = random_normal_tensor(be, {shared_width, C}, 9), w_up = random_normal_tensor(be, {shared_width, C}, 10);
  const Tensor w_down = random_normal_tensor(be, {C, shared_width}, 11);
  Tensor g = be.empty({N, shared_width}, DType::F32, MemoryCategory::Workspace);
  Tensor u = be.empty({N, shared_width}, DType::F32, MemoryCategory::Workspace);
  Tensor h = be.empty({N, shared_width}, DType::F32, MemoryCategory::Workspace);
  Tensor y = be.empty({N, C}, DType::F32, MemoryCategory::Workspace);
  auto shared_expert = [&] {
    be.matmul_forward(g, x, w_gate, nullptr);
    be.matmul_forward(u, x, w_up, nullptr);
    be.swiglu_forward(h, g, u);
    be.matmul_forward(y, h, w_down, nullptr);
  };
  const int runs = std::max(args.steps, 1) * 5;
  auto exchange = [&](const std::function<void()>& meanwhile) {
    const ExpertExchange ex(be, ep, routing, MemoryCategory::Workspace);
    const Tensor there = ex.to_experts(rows, MemoryCategory::Workspace, meanwhile);
    ex.from_experts(there, MemoryCategory::Workspace);
  };
  const double alone = median_slowest_seconds(comm, runs, [&] { exchange(nullptr); });
  const double compute = median_slowest_seconds(comm, runs, shared_expert);
  const double both = median_slowest_seconds(comm, runs, [&] { exchange(shared_expert); });
  const double hidden = alone > 0 ? std::clamp(1.0 - (both - compute) / alone, 0.0, 1.0) : 0.0;
  report.columns({"exchange_ms", "shared_ms", "overlapped_ms", "hidden"});
  report.header("moe exchange: ep " + std::to_string(ranks) + ", " + std::to_string(N) +
                " tokens per rank x top " + std::to_string(kTopK) + " of " +
                std::to_string(kExperts) + " experts, rows of " + std::to_string(C) +
                " fp32, there and back; a shared expert of width " + std::to_string(shared_width) +
                " computing meanwhile; hidden = 1 - (overlapped - shared) / exchange");
  report.row("dispatch + combine", {alone * 1e3, compute * 1e3, both * 1e3, hidden}, 0);
}

}  // namespace

void bench_moe(const BenchArgs& args, BenchReport& report) {
  int ranks = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  if (ranks < 2 || kExperts % ranks != 0)
    throw DeckError("bench --suite moe runs on 2, 4 or 8 ranks (the experts, 8, split over all "
                    "of them; launch mpiexec -n 2, 4 or 8), not " + std::to_string(ranks));
  CpuBackend backend(1);
  training_steps(args, report, ranks, backend);
  exchange_overlap(args, report, ranks, backend);
}

}  // namespace meshtrain
