// The `step` suite: how close a full training step gets to the machine's GEMM ceilings, and
// where the rest of its time goes. FLOPs per step follow the PaLM convention (6 x multiplying
// parameters + 12 L C T per token, see GptConfig::flops_per_token). The ceilings are square
// GEMMs of kCeilingSize through the backend's own Gemm on the same threads: OpenBLAS sgemm,
// oneDNN fp32 matmul and oneDNN bf16 matmul (bf16 inputs, fp32 accumulation). The fp32 step is
// judged against the oneDNN fp32 ceiling (the faster fp32 library here), and against OpenBLAS;
// the bf16 mixed-precision step against the oneDNN bf16 ceiling.

#include <algorithm>
#include <cmath>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/app/bench_suites.h"
#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/backend/kernel_profile.h"
#include "meshtrain/config/layout_check.h"
#include "meshtrain/parallel/process_grid.h"
#include "meshtrain/train/trainer.h"

namespace meshtrain {

namespace {

constexpr int kCeilingSize = 2048;
constexpr int kCeilingRepeats = 8;

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

struct Ceilings {
  double before[3] = {}, after[3] = {};
  int wrong[3] = {};
  double best(GemmCeiling c) const {
    const int i = static_cast<int>(c);
    return std::max(before[i], after[i]);
  }
};

void measure_ceilings(double (&out)[3], int (&wrong)[3]) {
  for (GemmCeiling c : {GemmCeiling::OpenBlasF32, GemmCeiling::OneDnnF32, GemmCeiling::OneDnnBf16}) {
    const int i = static_cast<int>(c);
    out[i] = measure_gemm_ceiling(c, kCeilingSize, kCeilingRepeats, wrong[i]);
  }
}

// One precision's run of the step: its own backend (and so its own kernel profile), grid and
// trainer.
struct StepRun {
  DType precision;
  std::unique_ptr<CpuBackend> backend;
  std::unique_ptr<ProcessGrid> grid;
  std::unique_ptr<Trainer> trainer;
  KernelProfile profile;
  std::vector<double> seconds;
  double first_loss = 0;
};

}  // namespace

// The step's kernels by time: calls and milliseconds per step, share of the step, GFLOP/s where
// counted; then what no kernel holds (optimizer bookkeeping, allocation, the loss on the host).
void report_breakdown(BenchReport& report, const KernelProfile& profile, int steps,
                      double step_seconds) {
  report.columns({"calls", "ms/step", "share", "GFLOP/s"});
  report.header("where the step's time goes (per-kernel wall time over the measured steps; GEMMs "
                "named by M x N x K, GFLOP/s for GEMMs and attention (causal work counted full, "
                "as PaLM does))");
  for (const KernelProfile::Entry& e : profile.entries()) {
    const double per_step = e.seconds / steps;
    report.row(e.op, {static_cast<double>(e.calls) / steps, per_step * 1e3,
                      per_step / step_seconds, e.flops > 0 ? e.flops / e.seconds / 1e9 : 0.0}, 0);
  }
  const double other = step_seconds - profile.total_seconds() / steps;
  report.row("outside the kernels", {0, other * 1e3, other / step_seconds, 0}, 0);
}

void bench_step(const BenchArgs& args, BenchReport& report) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world != 1) throw std::runtime_error("bench --suite step runs on one rank");
  CpuBackend backend(args.threads);
  const std::string bf16_isa = cpu_bf16_instructions();
  report.header("suite step: " + cpu_model() + ", " + std::to_string(backend.threads()) +
                " threads; " + cpu::Gemm::onednn_version() + ", avx512_bf16 in /proc/cpuinfo: " +
                (cpu_has_flag("avx512_bf16") ? "yes" : "no") + ", bf16 instructions for oneDNN: " +
                (bf16_isa.empty() ? "none (bf16 emulated)" : bf16_isa));
  // The machine may be shared: each ceiling is the best of its runs before and after the steps,
  // so that noise can only lower the reported ratios.
  Ceilings ceilings;
  measure_ceilings(ceilings.before, ceilings.wrong);

  // The same step in fp32 and in bf16 mixed precision, alternating step by step so that both
  // see the same moments of a shared machine.
  Config config = bench_deck("step", GptConfig{12, 768, 12, 256, 50257, true});
  config.train.global_batch = 4;
  config.train.micro_batch = 4;
  check_layout(config, 1);
  std::vector<StepRun> runs(2);
  runs[0].precision = DType::F32;
  runs[1].precision = DType::BF16;
  for (StepRun& r : runs) {
    Config c = config;
    c.train.precision = r.precision;
    r.backend = std::make_unique<CpuBackend>(args.threads);
    r.grid = std::make_unique<ProcessGrid>(MPI_COMM_WORLD, c.grid_shape(), 3600.0);
    r.trainer = std::make_unique<Trainer>(c, *r.grid, *r.backend);
  }
  for (int s = 0; s <= args.steps; ++s) {  // step 0 warms up the allocator and primitive caches
    for (StepRun& r : runs) {
      const StepResult result = r.trainer->train_step(s);
      if (s == 0) {
        r.first_loss = result.loss;
        r.backend->set_profile(&r.profile);
      } else {
        r.seconds.push_back(result.seconds);
      }
    }
  }
  for (StepRun& r : runs) r.backend->set_profile(nullptr);
  measure_ceilings(ceilings.after, ceilings.wrong);

  char line[512];
  std::snprintf(line, sizeof line,
                "ceilings: %dx%dx%d GEMMs through the backend's Gemm, best of %d before and of "
                "%d after the steps; the higher is the ceiling", kCeilingSize, kCeilingSize,
                kCeilingSize, kCeilingRepeats, kCeilingRepeats);
  report.header(line);
  report.columns({"GFLOP/s", "before", "after", "vs_fp32"});
  const double onednn_f32 = ceilings.best(GemmCeiling::OneDnnF32);
  for (GemmCeiling c : {GemmCeiling::OpenBlasF32, GemmCeiling::OneDnnF32, GemmCeiling::OneDnnBf16}) {
    const int i = static_cast<int>(c);
    report.row(std::string(gemm_ceiling_name(c)), {ceilings.best(c), ceilings.before[i],
               ceilings.after[i], ceilings.best(c) / onednn_f32}, ceilings.wrong[i]);
  }

  const double tokens = 4.0 * 256.0;
  const double flops = config.model.flops_per_token() * tokens;
  std::snprintf(line, sizeof line,
                "gpt2-124M: %.1fM parameters, T 256, micro-batch 4, %.1f GFLOP per step (PaLM "
                "convention), median of %d steps, fp32 and bf16 steps alternating; first loss "
                "%.3f (fp32), %.3f (bf16), log V = %.3f; ratio: to the oneDNN ceiling of the "
                "step's precision (target: fp32 0.70, bf16 0.55); best_ratio: the same for the "
                "fastest step (a ceiling is a best-of too); ratio_openblas: to OpenBLAS sgemm; "
                "vs_fp32: speed-up over the fp32 step",
                config.model.parameter_count() / 1e6, flops / 1e9, args.steps, runs[0].first_loss,
                runs[1].first_loss, std::log(50257.0));
  report.header(line);
  report.columns({"tokens", "time_ms", "tokens/s", "GFLOP/s", "ratio", "best_ratio",
                  "ratio_openblas", "vs_fp32"});
  const double fp32_time = median(runs[0].seconds);
  for (const StepRun& r : runs) {
    // At initialisation the logits are near zero, so the loss must be near log(vocab).
    const int wrong = std::abs(r.first_loss - std::log(50257.0)) < 0.5 ? 0 : 1;
    const double t = median(r.seconds);
    const double rate = flops / t / 1e9;
    const double ceiling = ceilings.best(r.precision == DType::BF16 ? GemmCeiling::OneDnnBf16
                                                                    : GemmCeiling::OneDnnF32);
    const double best = *std::min_element(r.seconds.begin(), r.seconds.end());
    report.row("gpt2-124M " + std::string(dtype_name(r.precision)) + " train step",
               {tokens, t * 1e3, tokens / t, rate, rate / ceiling, flops / best / 1e9 / ceiling,
                rate / ceilings.best(GemmCeiling::OpenBlasF32), fp32_time / t},
               wrong);
  }
  for (const StepRun& r : runs) {
    report.header("the " + std::string(dtype_name(r.precision)) + " step:");
    double measured = 0;
    for (double sec : r.seconds) measured += sec;
    report_breakdown(report, r.profile, args.steps, measured / args.steps);
  }
}

}  // namespace meshtrain
