#pragma once
// Benchmark suites of `meshtrain bench`. Each measures its ceiling in the same run and reports
// through BenchReport.

#include <string>
#include <string_view>

#include "meshtrain/app/bench_report.h"
#include "meshtrain/app/commands.h"
#include "meshtrain/backend/kernel_profile.h"
#include "meshtrain/config/config.h"
#include "meshtrain/model/model_spec.h"

namespace meshtrain {

// The deck every suite starts from: `model` on 1 MiB of generated text, no validation, a
// schedule long enough that the learning rate never decays during a measurement, no re-run of
// a step whose gradient norm spikes (it would be timed as part of the step), run directory
// runs/bench-<suite>.
Config bench_deck(const std::string& suite, const ModelSpec& model);
// A suite's GPT-2 model (gpt2_spec), or with args.model "tiny" the same layers at d_model 64,
// 2 heads, at most 32 positions and 256 tokens: every line of the suite in seconds, for the
// tests of its examples (ratios meaningless). The comm, pipeline, zero, checkpoint, hetero and
// async suites.
ModelSpec bench_gpt2(const BenchArgs& args, int layers, int64_t d_model, int64_t heads,
                     int64_t seq_len, int64_t vocab_size);

// Emulated devices for the suites with a slow rank (hetero, async), collective over the world:
// where a node's ranks outnumber its usable cores, ranks computing at once are bounded by the
// cores and no division of the work can beat that bound, whereas a cluster's ranks each have a
// device. So every rank's compute is stretched by `factor` (by sleeping, parallel/slowdown.h)
// first; 1 where every rank has a core.
struct DeviceEmulation {
  int ranks_per_node = 1, cores = 1;
  double factor = 1;
};
DeviceEmulation device_emulation();

// GEMM ceilings (OpenBLAS sgemm, oneDNN fp32 and bf16 matmul) and a full GPT-2 124M training
// step (fp32 and bf16) against them, with a per-kernel breakdown of the step. One rank: at 1
// thread and at args.threads threads, each against the ceilings at its thread count. N ranks:
// data parallel (dp = N, args.threads per rank) against the sum of the ranks' ceilings, with the
// share of the step in the exposed gradient all-reduce. args.model "tiny" runs a 2-layer model
// instead (the tests: every line of the suite, ratios meaningless).
void bench_step(const BenchArgs& args, BenchReport& report);
// Rows of `profile` by time per step, with the share of `step_seconds` and GFLOP/s where
// counted, then what no kernel holds (bench --suite step and gpu). With a `baseline` profile,
// also each kernel's speed-up per call over the same kernel there (named `baseline_name`).
void report_breakdown(BenchReport& report, const KernelProfile& profile, int steps,
                      double step_seconds, const KernelProfile* baseline = nullptr,
                      const std::string& baseline_name = "");
// Data-parallel gradient sync bus bandwidth against raw MPI_Allreduce, and how much of it
// backward hides (2+ ranks).
void bench_comm(const BenchArgs& args, BenchReport& report);
// Measured pipeline bubble of GPipe and 1F1B against (p-1)/(m+p-1) (2+ ranks).
void bench_pipeline(const BenchArgs& args, BenchReport& report);
// Context parallelism (2+ ranks, all in one cp group): ring attention's hidden transfer share
// at T 4096 and 8192, and the planned memory per rank and longest sequence for cp 1, 2, 4.
void bench_context(const BenchArgs& args, BenchReport& report);
// One slow rank (dp 4) or stage (dp 2 x pp 2) on 4 ranks: even work against work divided by
// declared, probed and rebalanced speeds (train/work_balance.h).
void bench_hetero(const BenchArgs& args, BenchReport& report);
// Synchronous against asynchronous data parallelism with a slow replica (mpiexec -n 5).
void bench_async(const BenchArgs& args, BenchReport& report);
// A mixture of experts (8 experts, top 2) at ep 1 and ep N against the dense model of the same
// active parameters, and the share of its expert exchange a shared expert hides (2, 4, 8 ranks).
void bench_moe(const BenchArgs& args, BenchReport& report);
// The CPU's causal attention of one layer (GPT-2's heads), forward and backward at T 1024 and
// 2048, fp32 and bf16, GFLOP/s on the causal FLOPs against the oneDNN GEMM ceiling of the same
// precision (one rank; args.model "tiny": T 128, small heads, for the tests).
void bench_attention(const BenchArgs& args, BenchReport& report);
// Sliding-window attention (W 1024) against full causal attention at T 8192 and 16384, fp32,
// forward + backward time ratio (one rank; args.model "tiny": T 1024, W 128).
void bench_window(const BenchArgs& args, BenchReport& report);
// Step time and memory of ZeRO stages and recompute modes relative to zero 0 / none.
void bench_zero(const BenchArgs& args, BenchReport& report);
// Checkpoint save and load bandwidth against a raw sequential write and read of the same bytes
// to the same directory (args.dir), any number of ranks.
void bench_checkpoint(const BenchArgs& args, BenchReport& report);
// Measures this machine (GEMM rates, memory bandwidth, collectives inside and across nodes) on
// every rank of the launch at once and, with args.out, rank 0 writes it as a machine profile
// (config/machine_profile.h) atomically. Any number of ranks; links need 2 or more.
void bench_calibrate(const BenchArgs& args, BenchReport& report);
// GPT-2 124M in bf16 on one GPU: tokens/s and MFU against a bf16 cuBLASLt GEMM peak.
void bench_gpu(const BenchArgs& args, BenchReport& report);
// The GEMM ceilings of the CPU: a square GEMM through the CPU backend's Gemm with the library
// (and input dtype) forced; the best GFLOP/s of `repeats` runs on the caller's OpenMP threads (a
// ceiling: on a shared machine noise only lowers a run), probes checked against fp64 dot
// products (each wrong probe adds to `wrong`).
enum class GemmCeiling { OpenBlasF32, OneDnnF32, OneDnnBf16 };
std::string_view gemm_ceiling_name(GemmCeiling c);
double measure_gemm_ceiling(GemmCeiling which, int n, int repeats, int& wrong);

}  // namespace meshtrain
