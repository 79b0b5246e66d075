// The `step` suite: how close a full training step gets to the machine's GEMM ceiling.
// FLOPs per step follow the PaLM convention (6 x multiplying parameters + 12 L C T per token,
// see GptConfig::flops_per_token); the ceiling is OpenBLAS sgemm on 4096^3, same threads.

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "meshtrain/app/bench_suites.h"
#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/config/layout_check.h"
#include "meshtrain/parallel/process_grid.h"
#include "meshtrain/train/trainer.h"

namespace meshtrain {

namespace {

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

}  // namespace

double measure_sgemm_peak(int n, int repeats, int& wrong) {
  std::vector<float> a(static_cast<size_t>(n) * n), b(a.size()), c(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = static_cast<float>(static_cast<int>(i * 7 % 13) - 6) / 8.0f;
    b[i] = static_cast<float>(static_cast<int>(i * 5 % 11) - 5) / 8.0f;
  }
  std::vector<double> rates;
  for (int r = 0; r <= repeats; ++r) {  // the first run warms caches and thread pools
    const auto t0 = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n,
                0.0f, c.data(), n);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) rates.push_back(2.0 * n * static_cast<double>(n) * n / s / 1e9);
  }
  for (int probe = 0; probe < 16; ++probe) {  // the values must be right, not only fast
    const int i = (probe * 977) % n, j = (probe * 389) % n;
    double ref = 0;
    for (int k = 0; k < n; ++k) ref += static_cast<double>(a[static_cast<size_t>(i) * n + k]) * b[static_cast<size_t>(k) * n + j];
    if (std::abs(ref - c[static_cast<size_t>(i) * n + j]) > 1e-3 * (1 + std::abs(ref))) ++wrong;
  }
  return median(rates);
}

void bench_step(const BenchArgs& args, BenchReport& report) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world != 1) throw std::runtime_error("bench --suite step runs on one rank");
  CpuBackend backend(args.threads);
  report.columns({"tokens", "time_ms", "tokens/s", "GFLOP/s", "ratio"});
  report.header("suite step: " + cpu_model() + ", " + std::to_string(backend.threads()) + " threads");
  int gemm_wrong = 0;
  // The machine may be shared: the ceiling is measured before and after the steps, and the
  // higher of the two is used, so that noise can only lower the reported ratio.
  const double peak_before = measure_sgemm_peak(4096, 5, gemm_wrong);
  char line[200];

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
  for (int s = 0; s <= args.steps; ++s) {  // step 0 warms up the allocator cache
    const StepResult r = trainer.train_step(s);
    if (s == 0) first_loss = r.loss;
    else seconds.push_back(r.seconds);
  }
  const double peak_after = measure_sgemm_peak(4096, 5, gemm_wrong);
  const double peak = std::max(peak_before, peak_after);
  std::snprintf(line, sizeof line,
                "ceiling: OpenBLAS sgemm 4096^3, median of 5, before %.1f and after %.1f GFLOP/s: "
                "%.1f", peak_before, peak_after, peak);
  report.header(line);
  report.row("sgemm 4096^3", {0, 0, 0, peak, 1.0}, gemm_wrong);
  // At initialisation the logits are near zero, so the loss must be near log(vocab).
  const int wrong = std::abs(first_loss - std::log(50257.0)) < 0.5 ? 0 : 1;
  const double t = median(seconds);
  std::snprintf(line, sizeof line,
                "gpt2-124M: %.1fM parameters, T 256, micro-batch 4, %.1f GFLOP per step (PaLM "
                "convention), median of %d steps; first loss %.3f (log V = %.3f)",
                config.model.parameter_count() / 1e6, flops / 1e9, args.steps, first_loss,
                std::log(50257.0));
  report.header(line);
  report.row("gpt2-124M train step", {tokens, t * 1e3, tokens / t, flops / t / 1e9, flops / t / 1e9 / peak}, wrong);
}

}  // namespace meshtrain
