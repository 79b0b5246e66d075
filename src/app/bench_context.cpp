// The `context` suite (mpiexec -n CP): context parallelism on long sequences.
//  1. Ring attention, forward and backward, of one layer's T = 4096 and 8192 token sequence
//     split over the CP ranks, against the same ranks' blocks computed without any transfer
//     (the ceiling: a ring whose transfers cost nothing) and the transfers alone. The ring's
//     time spent waiting for transfers is what compute did not hide: hidden = 1 - waited /
//     transfer time.
//  2. The planner's memory per rank for GPT-2 124M (bf16, one sequence per micro-batch,
//     selective recomputation) at T = 8192 with cp 1, 2, 4, and the longest T (a multiple of
//     1024) whose plan fits 16 GiB per rank.

#include <mpi.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "meshtrain/app/bench_suites.h"
#include "bench_measure.h"
#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/comm/mpi_communicator.h"
#include "meshtrain/config/layout_check.h"
#include "meshtrain/model/ring_attention.h"
#include "meshtrain/train/planner.h"
#include "meshtrain/train/straggler_report.h"  // median_of

namespace meshtrain {

namespace {

void ring_overlap(const BenchArgs& args, BenchReport& report) {
  MpiCommunicator comm(MPI_COMM_WORLD, "cp");
  const ContextParallel cp{&comm};
  const int n = comm.size();
  CpuBackend be(args.threads);
  const bool tiny = args.model == "tiny";
  const int64_t NH = tiny ? 2 : 12, HS = tiny ? 16 : 64, C = NH * HS, B = 1;
  report.columns({"cp", "T", "ring_ms", "compute_ms", "transfer_ms", "waited_ms", "hidden", "ratio"});
  report.header("ring attention of one layer, forward + backward, " + std::to_string(NH) + " heads of " +
                std::to_string(HS) + ", fp32, " + std::to_string(args.threads) + " thread(s) per rank; "
                "compute = the same blocks without transfers (the ceiling), transfer = the ring's "
                "sends alone, waited = the ring's time blocked on them; hidden = 1 - waited / transfer; "
                "ratio = compute / ring");
  for (const int64_t T : tiny ? std::vector<int64_t>{256} : std::vector<int64_t>{4096, 8192}) {
    const int64_t Tl = T / n, N = B * Tl;
    Tensor qkv = random_normal_tensor(be, {N, 3 * C}, 11u + static_cast<uint32_t>(comm.rank()));
    Tensor dout = random_normal_tensor(be, {N, C}, 97u + static_cast<uint32_t>(comm.rank()));
    Tensor out = be.empty({N, C}, DType::F32, MemoryCategory::Workspace);
    Tensor lse = be.empty({B, NH, Tl}, DType::F32, MemoryCategory::Workspace);
    Tensor dqkv = be.empty({N, 3 * C}, DType::F32, MemoryCategory::Workspace);
    Tensor kv = be.empty({N, 2 * C}, DType::F32, MemoryCategory::Workspace);
    Tensor partial = be.empty({N, 2 * C}, DType::F32, MemoryCategory::Workspace);
    Tensor other = be.empty({N, 2 * C}, DType::F32, MemoryCategory::Workspace);
    be.copy_columns(kv, 0, qkv, C, 2 * C);

    std::vector<double> waits;
    const double ring = median_slowest_seconds(comm, args.steps, [&] {
      double waited = 0;
      ring_attention_forward(be, cp, out, lse, qkv, B, Tl, NH, NH, HS, &waited);
      ring_attention_backward(be, cp, dqkv, dout, qkv, out, lse, B, Tl, NH, NH, HS, &waited);
      waits.push_back(waited);
    });
    waits.erase(waits.begin());  // the warm-up run's
    const double waited = comm.all_reduce_scalar(median_of(waits), ReduceOp::Max);
    // Every block of every step, against this rank's own keys: the same arithmetic (and the
    // same adds of the travelling gradient), no transfer.
    const double compute = median_slowest_seconds(comm, args.steps, [&] {
      be.fill(lse, -std::numeric_limits<double>::infinity());
      for (int step = 0; step < n; ++step)
        for (const auto& b : ring_attention_blocks(cp, (comm.rank() - step + n) % n, Tl))
          be.attention_block_forward(out, lse, qkv, kv, B, NH, NH, HS, b);
      be.fill(dqkv, 0.0);
      for (int step = 0; step < n; ++step) {
        be.fill(partial, 0.0);
        for (const auto& b : ring_attention_blocks(cp, (comm.rank() - step + n) % n, Tl))
          be.attention_block_backward(dqkv, partial, dout, out, lse, qkv, kv, B, NH, NH, HS, b);
        if (step > 0) be.add_inplace(partial, other);
      }
    });
    // The ring's transfers alone: keys and values n - 1 times each way, the gradient n times.
    const int next = (comm.rank() + 1) % n, prev = (comm.rank() + n - 1) % n;
    auto pass = [&](const Tensor& mine, Tensor& theirs) {
      std::vector<Work> w = comm.exchange({Transfer{Transfer::Kind::Send, mine, next, 5},
                                           Transfer{Transfer::Kind::Recv, theirs, prev, 5}});
      wait_all(w);
    };
    const double transfer = median_slowest_seconds(comm, args.steps, [&] {
      for (int step = 0; step + 1 < n; ++step) pass(kv, other);
      for (int step = 0; step + 1 < n; ++step) pass(kv, other);
      for (int step = 0; step < n; ++step) pass(partial, other);
    });
    const double hidden = transfer > 0 ? std::clamp(1.0 - waited / transfer, 0.0, 1.0) : 1.0;
    report.row("ring T=" + std::to_string(T),
               {static_cast<double>(n), static_cast<double>(T), ring * 1e3, compute * 1e3,
                transfer * 1e3, waited * 1e3, hidden, compute / ring},
               0);
  }
}

Config long_sequence_deck(int64_t T, int cp) {
  Config c = bench_deck("context", gpt2_spec(12, 768, 12, T, 50304));
  c.train.precision = DType::BF16;
  c.train.micro_batch = 1;
  c.train.global_batch = 1;
  c.parallel.cp = cp;
  c.parallel.dp = 1;
  c.parallel.recompute = Recompute::Selective;
  return c;
}

size_t planned_peak(int64_t T, int cp) { return plan_layout(long_sequence_deck(T, cp), cp, 1).peak(); }

void memory_per_rank(const BenchArgs& args, BenchReport& report) {
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  const double limit = 16 * kGiB;
  const bool tiny = args.model == "tiny";
  const int64_t fixed_T = tiny ? 1024 : 8192;
  report.columns({"cp", "T", "peak_GiB", "activations_GiB", "workspace_GiB", "of_cp1",
                  "longest_T_in_16GiB"});
  report.header("planned memory per rank, GPT-2 124M, bf16, 1 sequence per micro-batch, selective "
                "recomputation (cp 1's workspace holds a layer's T x T softmax; ring attention's "
                "blocks are L x L); at the moment of the peak; of_cp1 = activations / cp 1's");
  double cp1_activations = 0;
  for (int cp : {1, 2, 4}) {
    const LayoutPlan plan = plan_layout(long_sequence_deck(fixed_T, cp), cp, 1);
    const StagePlan& s = plan.stages[static_cast<size_t>(plan.peak_stage())];
    const double activations = static_cast<double>(s.at_peak[static_cast<size_t>(MemoryCategory::Activations)]);
    const double workspace = static_cast<double>(s.at_peak[static_cast<size_t>(MemoryCategory::Workspace)]);
    if (cp == 1) cp1_activations = activations;
    // The longest T in steps of 1024 that fits: the peak grows with T.
    int64_t fits = 0;
    if (!tiny) {
      int64_t lo = 0, hi = 8;
      while (static_cast<double>(planned_peak(hi * 1024, cp)) <= limit) lo = hi, hi *= 2;
      while (hi - lo > 1) {
        const int64_t mid = (lo + hi) / 2;
        (static_cast<double>(planned_peak(mid * 1024, cp)) <= limit ? lo : hi) = mid;
      }
      fits = lo * 1024;
    }
    report.row("plan cp=" + std::to_string(cp),
               {static_cast<double>(cp), static_cast<double>(fixed_T),
                static_cast<double>(plan.peak()) / kGiB, activations / kGiB, workspace / kGiB,
                activations / cp1_activations, static_cast<double>(fits)},
               0);
  }
}

}  // namespace

void bench_context(const BenchArgs& args, BenchReport& report) {
  int ranks = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  if (ranks < 2) throw std::runtime_error("bench --suite context needs 2 or more ranks (mpiexec -n 2)");
  ring_overlap(args, report);
  memory_per_rank(args, report);  // every rank plans (rows are collective): the same numbers
}

}  // namespace meshtrain
