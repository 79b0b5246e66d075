// The `step` suite: how close a full training step gets to the machine's GEMM ceilings, and
// where the rest of its time goes. FLOPs per step follow the PaLM convention (6 x multiplying
// parameters + 12 L C T per token, see GptConfig::flops_per_token). The ceilings are square
// GEMMs of kCeilingSize through the backend's own Gemm on the same threads: OpenBLAS sgemm,
// oneDNN fp32 matmul and oneDNN bf16 matmul (bf16 inputs, fp32 accumulation). The fp32 step is
// judged against the oneDNN fp32 ceiling (the faster fp32 library here), and against OpenBLAS.

#include <algorithm>
#include <cmath>
#include <fstream>
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
  report.header("suite step: " + cpu_model() + ", " + std::to_string(backend.threads()) +
                " threads; " + cpu::Gemm::onednn_version() + ", avx512_bf16 in /proc/cpuinfo: " +
                (cpu_has_flag("avx512_bf16") ? "yes" : "no"));
  // The machine may be shared: each ceiling is the best of its runs before and after the steps,
  // so that noise can only lower the reported ratios.
  Ceilings ceilings;
  measure_ceilings(ceilings.before, ceilings.wrong);

  Config config = bench_deck("step", GptConfig{12, 768, 12, 256, 50257, true});
  config.train.global_batch = 4;
  config.train.micro_batch = 4;
  check_layout(config, 1);
  ProcessGrid grid(MPI_COMM_WORLD, config.grid_shape(), 3600.0);
  Trainer trainer(config, grid, backend);

  const double tokens = 4.0 * 256.0;
  const double flops = config.model.flops_per_token() * tokens;
  std::vector<double> seconds;
  double first_loss = 0;
  KernelProfile profile;
  for (int s = 0; s <= args.steps; ++s) {  // step 0 warms up the allocator and primitive caches
    const StepResult r = trainer.train_step(s);
    if (s == 0) {
      first_loss = r.loss;
      backend.set_profile(&profile);
    } else {
      seconds.push_back(r.seconds);
    }
  }
  backend.set_profile(nullptr);
  measure_ceilings(ceilings.after, ceilings.wrong);

  char line[300];
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

  // At initialisation the logits are near zero, so the loss must be near log(vocab).
  const int wrong = std::abs(first_loss - std::log(50257.0)) < 0.5 ? 0 : 1;
  const double t = median(seconds);
  std::snprintf(line, sizeof line,
                "gpt2-124M: %.1fM parameters, T 256, micro-batch 4, fp32, %.1f GFLOP per step "
                "(PaLM convention), median of %d steps; first loss %.3f (log V = %.3f); ratio to "
                "the oneDNN fp32 ceiling and to OpenBLAS sgemm",
                config.model.parameter_count() / 1e6, flops / 1e9, args.steps, first_loss,
                std::log(50257.0));
  report.header(line);
  report.columns({"tokens", "time_ms", "tokens/s", "GFLOP/s", "ratio", "ratio_openblas"});
  const double rate = flops / t / 1e9;
  report.row("gpt2-124M train step", {tokens, t * 1e3, tokens / t, rate, rate / onednn_f32,
                                      rate / ceilings.best(GemmCeiling::OpenBlasF32)}, wrong);
  double measured = 0;
  for (double s : seconds) measured += s;
  report_breakdown(report, profile, args.steps, measured / args.steps);
}

}  // namespace meshtrain
