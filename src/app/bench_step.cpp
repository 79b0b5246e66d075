// The `step` suite: how close a full training step gets to the machine's GEMM ceilings, how it
// scales on one node, and where the rest of its time goes. FLOPs per step follow the PaLM
// convention (6 x multiplying parameters + attention per token, from the layers' cost sheets:
// ModelSpec::flops_per_token).
// The ceilings are square GEMMs through the backend's own Gemm on the same threads as the step
// they judge: OpenBLAS sgemm, oneDNN fp32 matmul and oneDNN bf16 matmul (bf16 inputs, fp32
// accumulation). The fp32 step is judged against the oneDNN fp32 ceiling (the faster fp32
// library here), and against OpenBLAS; the bf16 mixed-precision step against the oneDNN bf16
// ceiling.
//
// One rank: the step at 1 thread and at --threads threads, each against ceilings measured at
// that thread count. N ranks (mpiexec -n N ... --threads T): data parallelism, dp = N with the
// same micro-batch per rank, against the sum of the ranks' ceilings measured at the same time
// (N x the T-thread ceiling, as the ranks share the node), with the share of the step the
// gradient all-reduce leaves exposed after backward.

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "meshtrain/app/bench_suites.h"
#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/backend/kernel_profile.h"
#include "meshtrain/config/layout_check.h"
#include "meshtrain/families/registry.h"
#include "meshtrain/parallel/process_grid.h"
#include "meshtrain/train/trainer.h"

namespace meshtrain {

namespace {

constexpr GemmCeiling kCeilings[] = {GemmCeiling::OpenBlasF32, GemmCeiling::OneDnnF32,
                                     GemmCeiling::OneDnnBf16};

// The measured model: GPT-2 124M (the suite's figure), a Llama 3 block at the same scale, or a
// tiny one of either whose ratios mean nothing but which runs every line of the suite in a
// second (the tests).
struct StepModel {
  std::string name;
  ModelSpec gpt;
  int micro_batch = 4;
  int ceiling_size = 2048;  // side of the square ceiling GEMMs
  int ceiling_repeats = 8;
};

// Llama 3's block (RMSNorm, rotary positions, grouped-query attention with 3 query heads per
// key/value head as Llama 3 8B has 4, SwiGLU at 8/3 of d_model, no biases, untied) at the sizes
// and vocabulary of the GPT-2 it stands beside, so that the two rows compare blocks, not sizes.
ModelSpec llama_step_spec(int layers, int64_t d_model, int64_t heads, int64_t seq_len,
                          int64_t vocab_size) {
  ModelSpec m = gpt2_spec(layers, d_model, heads, seq_len, vocab_size);
  m = family_defaults("llama", m);
  m.kv_heads_set = heads / 3;
  m.ffn_hidden_set = 8 * d_model / 3;
  return m;
}

// DeepSeek-V3's multi-head latent attention (model/latent_attention.h) in the same Llama block
// and sizes: queries through a rank-384 path, a key/value latent of 256, query/key heads of 64 +
// 32 rotary channels and value heads of 64 (DeepSeek-V3's 128 + 64 and 128 at half its 128-wide
// heads, the ranks near its shares of d_model), so that its row beside the Llama block's shows
// what latent attention costs on the CPU.
ModelSpec mla_step_spec(int layers, int64_t d_model, int64_t heads, int64_t seq_len,
                        int64_t vocab_size, LatentSpec latent) {
  ModelSpec m = llama_step_spec(layers, d_model, heads, seq_len, vocab_size);
  m.kv_heads_set = 0;
  m.attention = AttentionKind::Latent;
  m.latent = latent;
  return m;
}

StepModel step_model(const std::string& which) {
  if (which == "tiny-mla")
    return {"tiny-mla", mla_step_spec(2, 48, 3, 32, 256, LatentSpec{24, 16, 8, 4, 10}), 4, 256, 2};
  if (which == "mla")
    return {"mla-block-124M", mla_step_spec(12, 768, 12, 256, 50257, LatentSpec{384, 256, 64, 32, 64}), 4, 2048, 8};
  if (which == "tiny") return {"tiny", gpt2_spec(2, 64, 2, 32, 256), 4, 256, 2};
  if (which == "tiny-llama") return {"tiny-llama", llama_step_spec(2, 48, 3, 32, 256), 4, 256, 2};
  if (which == "llama") return {"llama-block-124M", llama_step_spec(12, 768, 12, 256, 50257), 4, 2048, 8};
  return {"gpt2-124M", gpt2_spec(12, 768, 12, 256, 50257), 4, 2048, 8};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

bool cpu_has_flag(const std::string& flag) {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("flags", 0) == 0) return (line + " ").find(" " + flag + " ") != std::string::npos;
  return false;
}

std::string plural(int n, const char* what) {
  return std::to_string(n) + " " + what + (n == 1 ? "" : "s");
}

// GFLOP/s of the three ceilings, summed over the ranks of the world, which measure at the same
// time (one rank: its own). The machine may be shared: each ceiling is the best of its runs
// before and after the steps, so that noise can only lower the reported ratios.
struct Ceilings {
  double before[3] = {}, after[3] = {};
  int wrong[3] = {};
  double best(GemmCeiling c) const {
    const int i = static_cast<int>(c);
    return std::max(before[i], after[i]);
  }
};

void measure_ceilings(const StepModel& m, double (&out)[3], int (&wrong)[3]) {
  for (GemmCeiling c : kCeilings) {
    const int i = static_cast<int>(c);
    MPI_Barrier(MPI_COMM_WORLD);
    const double mine = measure_gemm_ceiling(c, m.ceiling_size, m.ceiling_repeats, wrong[i]);
    MPI_Allreduce(&mine, &out[i], 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  }
}

// One precision's steps: the measured times (the slowest rank's), the exposed all-reduce, every
// loss, and this rank's kernel profile.
struct PrecisionRun {
  DType precision = DType::F32;
  KernelProfile profile;
  std::vector<double> seconds, exposed, losses;
};

// One row group: `ranks` ranks (dp = ranks) of `threads` threads each, the fp32 and bf16 steps
// alternating step by step so that both see the same moments of a shared machine.
struct Measurement {
  int ranks = 1, threads = 1;
  Ceilings ceilings;
  PrecisionRun runs[2];
};

Measurement measure(const BenchArgs& args, const StepModel& m, int ranks, int threads) {
  Measurement out;
  out.ranks = ranks;
  out.threads = threads;
  Config config = bench_deck("step", m.gpt);
  config.train.micro_batch = m.micro_batch;
  config.train.global_batch = m.micro_batch * ranks;
  config.parallel.dp = ranks;
  check_layout(config, ranks);
  std::unique_ptr<CpuBackend> backends[2];
  std::unique_ptr<ProcessGrid> grids[2];
  std::unique_ptr<Trainer> trainers[2];
  for (int p = 0; p < 2; ++p) {
    out.runs[p].precision = p == 0 ? DType::F32 : DType::BF16;
    Config c = config;
    c.train.precision = out.runs[p].precision;
    backends[p] = std::make_unique<CpuBackend>(threads);  // sets the OpenMP team size
    grids[p] = std::make_unique<ProcessGrid>(MPI_COMM_WORLD, c.grid_shape(), 3600.0);
    trainers[p] = std::make_unique<Trainer>(c, *grids[p], *backends[p]);
  }
  measure_ceilings(m, out.ceilings.before, out.ceilings.wrong);
  for (int s = 0; s <= args.steps; ++s) {  // step 0 warms up the allocator and primitive caches
    for (int p = 0; p < 2; ++p) {
      PrecisionRun& r = out.runs[p];
      const StepResult result = trainers[p]->train_step(s);
      // Exposed communication: the latest completion of the reductions minus the latest end of
      // backward over the ranks (one node: one steady clock; a rank waiting for a slower one is
      // skew, not communication).
      const ModelState& state = trainers[p]->state();
      Communicator& world = grids[p]->world();
      const double backward_end = world.all_reduce_scalar(state.reducer().backward_end_time(), ReduceOp::Max);
      const double done = world.all_reduce_scalar(state.reducer().reductions_done_time(), ReduceOp::Max);
      r.losses.push_back(result.loss);
      if (s == 0) {
        backends[p]->set_profile(&r.profile);
      } else {
        r.seconds.push_back(result.seconds);
        r.exposed.push_back(std::max(0.0, done - backward_end));
      }
    }
  }
  for (auto& b : backends) b->set_profile(nullptr);
  measure_ceilings(m, out.ceilings.after, out.ceilings.wrong);
  return out;
}

// The result checks of a row: every loss finite, and at initialisation, where the logits are
// near zero, the first loss near log(vocab).
int loss_wrong(const PrecisionRun& r, double log_vocab) {
  int wrong = std::abs(r.losses.front() - log_vocab) < 0.5 ? 0 : 1;
  for (double l : r.losses) wrong += std::isfinite(l) ? 0 : 1;
  return wrong;
}

double ceiling_of(const Measurement& m, DType precision) {
  return m.ceilings.best(precision == DType::BF16 ? GemmCeiling::OneDnnBf16 : GemmCeiling::OneDnnF32);
}

double mean_seconds(const PrecisionRun& r) {
  double total = 0;
  for (double s : r.seconds) total += s;
  return total / static_cast<double>(r.seconds.size());
}

// GEMMs are the matmul operations (named "matmul_forward MxNxK" etc. in the profile); the rest
// of the step (attention, norms, activations, the loss, the optimizer, casts, fills, and what no
// kernel holds) is what a faster GEMM library does not speed up, the issue-40 figure.
bool is_gemm(const std::string& op) { return op.rfind("matmul", 0) == 0; }

double gemm_seconds_per_step(const PrecisionRun& r, int steps) {
  double t = 0;
  for (const KernelProfile::Entry& e : r.profile.entries())
    if (is_gemm(e.op)) t += e.seconds;
  return t / steps;
}

// The share of the (mean) step outside the GEMMs.
double non_gemm_share(const PrecisionRun& r, int steps) {
  const double step = mean_seconds(r);
  return std::max(0.0, step - gemm_seconds_per_step(r, steps)) / step;
}

// Per precision: the step split into GEMMs and the rest, then the slowest non-GEMM kernels with
// their milliseconds, so that the next kernel to fuse or speed up can be read off one table.
void report_non_gemm(BenchReport& report, const std::string& what,
                     const std::vector<std::pair<std::string, const PrecisionRun*>>& runs,
                     int steps) {
  constexpr int kTop = 8;
  report.header("non-GEMM share, " + what + ": the mean step split into its GEMMs (matmul "
                "operations) and the rest (other kernels and what no kernel holds), then the " +
                std::to_string(kTop) + " slowest non-GEMM kernels");
  report.columns({"ms/step", "share"});
  for (const auto& [name, run] : runs) {
    const double step = mean_seconds(*run), gemm = gemm_seconds_per_step(*run, steps);
    report.row(name + ": GEMMs", {gemm * 1e3, gemm / step}, 0);
    report.row(name + ": non-GEMM", {(step - gemm) * 1e3, non_gemm_share(*run, steps)}, 0);
    int shown = 0;
    for (const KernelProfile::Entry& e : run->profile.entries()) {
      if (is_gemm(e.op)) continue;
      if (shown++ == kTop) break;
      const double per_step = e.seconds / steps;
      report.row(name + ": non-GEMM " + e.op, {per_step * 1e3, per_step / step}, 0);
    }
  }
}

void report_ceilings(BenchReport& report, const StepModel& m, const std::vector<Measurement>& ms,
                     const std::string& what) {
  char line[512];
  std::snprintf(line, sizeof line,
                "ceilings: %dx%dx%d GEMMs through the backend's Gemm%s, best of %d before and of "
                "%d after the steps; the higher is the ceiling; vs_fp32: over oneDNN fp32 at the "
                "same threads", m.ceiling_size, m.ceiling_size, m.ceiling_size, what.c_str(),
                m.ceiling_repeats, m.ceiling_repeats);
  report.header(line);
  report.columns({"threads", "GFLOP/s", "before", "after", "vs_fp32"});
  for (const Measurement& x : ms)
    for (GemmCeiling c : kCeilings) {
      const int i = static_cast<int>(c);
      // "oneDNN fp32 matmul, 2 threads" on one rank, "..., 2x1 thread" for 2 ranks of 1 thread
      const std::string name = std::string(gemm_ceiling_name(c)) + ", " +
                               (x.ranks > 1 ? std::to_string(x.ranks) + "x" : "") +
                               plural(x.threads, "thread");
      report.row(name, {static_cast<double>(x.threads), x.ceilings.best(c), x.ceilings.before[i],
                        x.ceilings.after[i],
                        x.ceilings.best(c) / x.ceilings.best(GemmCeiling::OneDnnF32)},
                 x.ceilings.wrong[i]);
    }
}

std::string model_line(const StepModel& m, const Config& c, int steps) {
  char line[256];
  std::snprintf(line, sizeof line,
                "%s: %.1fM parameters, T %lld, micro-batch %d per rank, %.2f GFLOP per rank and "
                "step (PaLM convention), median of %d steps, fp32 and bf16 steps alternating, "
                "log V = %.3f", m.name.c_str(), c.model.parameter_count() / 1e6,
                static_cast<long long>(m.gpt.seq_len), m.micro_batch,
                c.model.flops_per_token() * m.micro_batch * m.gpt.seq_len / 1e9, steps,
                std::log(static_cast<double>(m.gpt.vocab_size)));
  return line;
}

// One rank: the step at 1 thread and at args.threads threads.
void bench_step_threads(const BenchArgs& args, const StepModel& m, BenchReport& report) {
  std::vector<int> counts{1};
  if (args.threads > 1) counts.push_back(args.threads);
  std::vector<Measurement> ms;
  for (int t : counts) ms.push_back(measure(args, m, 1, t));
  report_ceilings(report, m, ms, " on one rank");

  const Config config = bench_deck("step", m.gpt);
  const double tokens = static_cast<double>(m.micro_batch) * m.gpt.seq_len;
  const double flops = config.model.flops_per_token() * tokens;
  const double log_vocab = std::log(static_cast<double>(m.gpt.vocab_size));
  report.header(model_line(m, config, args.steps) +
                "; ratio: to the oneDNN ceiling of the step's precision at the same threads "
                "(target: fp32 0.70, bf16 0.55); best_ratio: the same for the fastest step (a "
                "ceiling is a best-of too); ratio_openblas: to OpenBLAS sgemm; vs_fp32: speed-up "
                "over the fp32 step; scaling: over the same precision at 1 thread; wrong: a "
                "non-finite loss, a first loss off log V by 0.5 or more, or a first loss that "
                "differs from 1 thread's by more than reassociation (fp32 1e-4, bf16 1e-2); "
                "non_gemm: share of the mean step outside the GEMMs (table below)");
  report.columns({"threads", "tokens", "time_ms", "tokens/s", "GFLOP/s", "ratio", "best_ratio",
                  "ratio_openblas", "vs_fp32", "scaling", "non_gemm"});
  for (const Measurement& x : ms) {
    const double fp32_time = median(x.runs[0].seconds);
    for (int p = 0; p < 2; ++p) {
      const PrecisionRun& r = x.runs[p];
      const PrecisionRun& one = ms.front().runs[p];
      int wrong = loss_wrong(r, log_vocab);
      const double tolerance = r.precision == DType::BF16 ? 1e-2 : 1e-4;
      if (std::abs(r.losses.front() - one.losses.front()) > tolerance * one.losses.front()) ++wrong;
      const double t = median(r.seconds);
      const double rate = flops / t / 1e9;
      const double ceiling = ceiling_of(x, r.precision);
      const double best = *std::min_element(r.seconds.begin(), r.seconds.end());
      report.row(m.name + " " + std::string(dtype_name(r.precision)) + ", " +
                     plural(x.threads, "thread"),
                 {static_cast<double>(x.threads), tokens, t * 1e3, tokens / t, rate,
                  rate / ceiling, flops / best / 1e9 / ceiling,
                  rate / x.ceilings.best(GemmCeiling::OpenBlasF32), fp32_time / t,
                  median(one.seconds) / t, non_gemm_share(r, args.steps)},
                 wrong);
    }
  }
  const Measurement& last = ms.back();
  std::vector<std::pair<std::string, const PrecisionRun*>> runs;
  for (const PrecisionRun& r : last.runs)
    runs.push_back({m.name + " " + std::string(dtype_name(r.precision)) + " (" +
                        plural(last.threads, "thread") + ")",
                    &r});
  report_non_gemm(report, plural(last.threads, "thread"), runs, args.steps);
  // Where the time goes at the highest thread count, and how each kernel scaled from 1 thread.
  const Measurement& top = ms.back();
  for (int p = 0; p < 2; ++p) {
    const PrecisionRun& r = top.runs[p];
    report.header("the " + std::string(dtype_name(r.precision)) + " step, " +
                  plural(top.threads, "thread") + ":");
    if (ms.size() > 1)
      report_breakdown(report, r.profile, args.steps, mean_seconds(r), &ms.front().runs[p].profile,
                       "1 thread");
    else
      report_breakdown(report, r.profile, args.steps, mean_seconds(r));
  }
}

// N ranks: data parallelism, dp = N, args.threads threads per rank.
void bench_step_dp(const BenchArgs& args, const StepModel& m, BenchReport& report, int ranks) {
  const unsigned cores = std::thread::hardware_concurrency();
  if (cores > 0 && static_cast<unsigned>(ranks * args.threads) > cores)
    report.header("warning: " + std::to_string(ranks) + " ranks x " +
                  plural(args.threads, "thread") + " oversubscribe this node's " +
                  std::to_string(cores) + " cores (pass --threads " +
                  std::to_string(std::max(1u, cores / static_cast<unsigned>(ranks))) + ")");
  const Measurement x = measure(args, m, ranks, args.threads);
  report_ceilings(report, m, {x}, ", every rank at the same time, summed over the ranks");

  Config config = bench_deck("step", m.gpt);
  const double tokens = static_cast<double>(m.micro_batch) * m.gpt.seq_len * ranks;
  const double flops = config.model.flops_per_token() * tokens;
  const double log_vocab = std::log(static_cast<double>(m.gpt.vocab_size));
  report.header(model_line(m, config, args.steps) + "; data parallel: dp " +
                std::to_string(ranks) + ", " + plural(args.threads, "thread") +
                " per rank, one node; ratio: to the summed oneDNN ceiling of the step's "
                "precision; allreduce: share of the step the gradient all-reduce runs after the "
                "last rank's backward (the part backward did not hide); wrong: a non-finite loss "
                "or a first loss off log V by 0.5 or more; non_gemm: share of rank 0's mean step "
                "outside the GEMMs");
  report.columns({"ranks", "threads", "tokens", "time_ms", "tokens/s", "GFLOP/s", "ratio",
                  "best_ratio", "allreduce", "vs_fp32", "non_gemm"});
  const double fp32_time = median(x.runs[0].seconds);
  for (const PrecisionRun& r : x.runs) {
    const double t = median(r.seconds);
    const double rate = flops / t / 1e9;
    const double ceiling = ceiling_of(x, r.precision);
    const double best = *std::min_element(r.seconds.begin(), r.seconds.end());
    report.row(m.name + " " + std::string(dtype_name(r.precision)) + ", dp " +
                   std::to_string(ranks) + "x" + plural(args.threads, "thread"),
               {static_cast<double>(ranks), static_cast<double>(args.threads), tokens, t * 1e3,
                tokens / t, rate, rate / ceiling, flops / best / 1e9 / ceiling,
                median(r.exposed) / t, fp32_time / t, non_gemm_share(r, args.steps)},
               loss_wrong(r, log_vocab));
  }
  std::vector<std::pair<std::string, const PrecisionRun*>> runs;
  for (const PrecisionRun& r : x.runs)
    runs.push_back({m.name + " " + std::string(dtype_name(r.precision)) + " (dp " +
                        std::to_string(ranks) + "x" + plural(args.threads, "thread") + ")",
                    &r});
  report_non_gemm(report, "rank 0", runs, args.steps);
  for (const PrecisionRun& r : x.runs) {
    report.header("the " + std::string(dtype_name(r.precision)) + " step, dp " +
                  std::to_string(ranks) + ", rank 0 (the exposed all-reduce is part of what no "
                  "kernel holds):");
    const double step = mean_seconds(r);
    report_breakdown(report, r.profile, args.steps, step);
    double exposed = 0;
    for (double e : r.exposed) exposed += e;
    exposed /= static_cast<double>(r.exposed.size());
    report.row("  of which gradient all-reduce", {0, exposed * 1e3, exposed / step, 0}, 0);
  }
}

}  // namespace

// The step's kernels by time: calls and milliseconds per step, share of the step, GFLOP/s where
// counted, with a baseline the speed-up of each kernel over the same kernel there; then what no
// kernel holds (optimizer bookkeeping, allocation, the loss on the host, communication).
void report_breakdown(BenchReport& report, const KernelProfile& profile, int steps,
                      double step_seconds, const KernelProfile* baseline,
                      const std::string& baseline_name) {
  std::map<std::string, double> base;
  if (baseline)
    for (const KernelProfile::Entry& e : baseline->entries())
      base[e.op] = e.calls > 0 ? e.seconds / static_cast<double>(e.calls) : 0;
  std::vector<std::string> columns{"calls", "ms/step", "share", "GFLOP/s"};
  if (baseline) columns.push_back("speedup");
  report.columns(columns);
  report.header("where the step's time goes (per-kernel wall time over the measured steps; GEMMs "
                "named by M x N x K, GFLOP/s for GEMMs and attention (causal work counted full, "
                "as PaLM does))" +
                (baseline ? "; speedup: time per call in " + baseline_name + " over here" : ""));
  for (const KernelProfile::Entry& e : profile.entries()) {
    const double per_step = e.seconds / steps;
    std::vector<double> values{static_cast<double>(e.calls) / steps, per_step * 1e3,
                               per_step / step_seconds,
                               e.flops > 0 ? e.flops / e.seconds / 1e9 : 0.0};
    if (baseline) {
      const auto it = base.find(e.op);
      values.push_back(it != base.end() && e.calls > 0
                           ? it->second / (e.seconds / static_cast<double>(e.calls)) : 0.0);
    }
    report.row(e.op, values, 0);
  }
  const double other = step_seconds - profile.total_seconds() / steps;
  std::vector<double> values{0, other * 1e3, other / step_seconds, 0};
  if (baseline) values.push_back(0);
  report.row("outside the kernels", values, 0);
}

void bench_step(const BenchArgs& args, BenchReport& report) {
  int ranks = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  const StepModel m = step_model(args.model);
  const std::string bf16_isa = cpu_bf16_instructions();
  report.header("suite step: " + cpu_model() + ", " + plural(ranks, "rank") + "; " +
                cpu::Gemm::onednn_version() + ", avx512_bf16 in /proc/cpuinfo: " +
                (cpu_has_flag("avx512_bf16") ? "yes" : "no") + ", bf16 instructions for oneDNN: " +
                (bf16_isa.empty() ? "none (bf16 emulated)" : bf16_isa));
  if (ranks == 1) bench_step_threads(args, m, report);
  else bench_step_dp(args, m, report, ranks);
}

}  // namespace meshtrain
