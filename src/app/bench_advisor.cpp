// The `advisor` suite (mpiexec -n 8 is the reference; any count with enough divisors): how well
// the time model predicts this machine. It measures a machine profile first (the calibrate
// suite's measurement, same run, same launch) unless --profile gives one, then runs one deck in
// a dozen layouts that exercise every axis and schedule (dp, tp with and without sequence
// parallelism, pp with GPipe, 1F1B and interleaved, ZeRO 1-3, selective and full
// recomputation), each as 3 runs of a fresh trainer whose median step is the measurement. It
// reports predicted against measured per layout, then the Spearman rank correlation, the
// median absolute error, and the layout "auto" picks among every valid layout, run too, against
// the fastest measured. Each row's `ratio` is predicted / measured (1: exact).

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "meshtrain/app/bench_suites.h"
#include "meshtrain/app/calibrate.h"
#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/config/layout_check.h"
#include "meshtrain/train/layout_advisor.h"
#include "meshtrain/train/time_model.h"
#include "meshtrain/train/trainer.h"

namespace meshtrain {

namespace {

struct Candidate {
  std::string name;
  int tp = 1, pp = 1, zero = 0, virtual_stages = 1;
  ScheduleKind schedule = ScheduleKind::OneFOneB;
  Recompute recompute = Recompute::None;
  bool sequence_parallel = false;
  int micro_batch = 2;
};

// Layouts of `ranks` ranks (8 in the reference run) covering every axis and schedule; those
// the world cannot hold (a count without these divisors) are skipped.
std::vector<Candidate> candidates() {
  using S = ScheduleKind;
  using R = Recompute;
  return {
      {"dp", 1, 1, 0, 1, S::OneFOneB, R::None, false, 2},
      {"dp zero1", 1, 1, 1, 1, S::OneFOneB, R::None, false, 2},
      {"dp zero2", 1, 1, 2, 1, S::OneFOneB, R::None, false, 2},
      {"dp zero3", 1, 1, 3, 1, S::OneFOneB, R::None, false, 2},
      {"dp rc full", 1, 1, 0, 1, S::OneFOneB, R::Full, false, 2},
      {"dp mb1", 1, 1, 0, 1, S::OneFOneB, R::None, false, 1},
      {"tp2", 2, 1, 0, 1, S::OneFOneB, R::None, false, 2},
      {"tp2 sp rc sel", 2, 1, 0, 1, S::OneFOneB, R::Selective, true, 2},
      {"tp4", 4, 1, 0, 1, S::OneFOneB, R::None, false, 2},
      {"pp2 1f1b", 1, 2, 0, 1, S::OneFOneB, R::None, false, 1},
      {"pp2 gpipe", 1, 2, 0, 1, S::GPipe, R::None, false, 1},
      {"pp4 1f1b", 1, 4, 0, 1, S::OneFOneB, R::None, false, 1},
      {"pp2 interleaved", 1, 2, 0, 2, S::Interleaved, R::None, false, 1},
      {"tp2 pp2 zero1", 2, 2, 1, 1, S::OneFOneB, R::None, false, 1},
  };
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Spearman's rank correlation (average ranks for ties).
double spearman(const std::vector<double>& a, const std::vector<double>& b) {
  const auto ranks = [](const std::vector<double>& v) {
    std::vector<size_t> order(v.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](size_t i, size_t j) { return v[i] < v[j]; });
    std::vector<double> r(v.size());
    for (size_t i = 0; i < order.size();) {
      size_t j = i;
      while (j + 1 < order.size() && v[order[j + 1]] == v[order[i]]) ++j;
      for (size_t k = i; k <= j; ++k) r[order[k]] = 0.5 * static_cast<double>(i + j);
      i = j + 1;
    }
    return r;
  };
  const std::vector<double> ra = ranks(a), rb = ranks(b);
  const double n = static_cast<double>(a.size());
  const double ma = std::accumulate(ra.begin(), ra.end(), 0.0) / n, mb = std::accumulate(rb.begin(), rb.end(), 0.0) / n;
  double num = 0, da = 0, db = 0;
  for (size_t i = 0; i < ra.size(); ++i) {
    num += (ra[i] - ma) * (rb[i] - mb);
    da += (ra[i] - ma) * (ra[i] - ma);
    db += (rb[i] - mb) * (rb[i] - mb);
  }
  return da > 0 && db > 0 ? num / std::sqrt(da * db) : 0.0;
}

// Median step time (ms) of `runs` fresh trainers of `c`, each `steps` steps after a warm-up
// step; `wrong` counts non-finite losses.
double measure(const Config& c, int threads, int runs, int steps, int& wrong) {
  std::vector<double> run_medians;
  for (int run = 0; run < runs; ++run) {
    CpuBackend backend(threads);
    ProcessGrid grid(MPI_COMM_WORLD, c.grid_shape(), 600.0);
    Trainer trainer(c, grid, backend);
    std::vector<double> ms;
    for (int s = 0; s <= steps; ++s) {
      const StepResult r = trainer.train_step(s);
      if (!std::isfinite(r.loss)) wrong = 1;
      if (s > 0) ms.push_back(r.seconds * 1e3);
    }
    // The slowest rank's median: a step ends when its last rank does.
    double mine = median(ms), slowest = mine;
    MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    run_medians.push_back(slowest);
  }
  return median(run_medians);
}

}  // namespace

void bench_advisor(const BenchArgs& args, BenchReport& report) {
  int ranks = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  const bool tiny = args.model == "tiny";
  const int threads = std::max(1, args.threads);
  MachineProfile profile;
  if (args.profile.empty()) {
    BenchReport quiet = BenchReport::quiet();
    profile = measure_machine_profile(threads, tiny ? 2 : 4, quiet);
    profile.path = "(measured in this run)";
  } else {
    profile = read_machine_profile(args.profile);
  }
  // 8 layers of d_model 256 (tiny: 4 of 128) over 128 tokens; 4 sequences per rank per step.
  Config base = bench_deck("advisor", tiny ? GptConfig{4, 128, 8, 64, 256, true} : GptConfig{8, 256, 8, 128, 512, true});
  base.train.global_batch = 4 * ranks;
  base.run.threads = threads;
  const int runs = tiny ? 1 : 3, steps = tiny ? 2 : args.steps;
  report.header("advisor: " + std::to_string(ranks) + " ranks x " + std::to_string(threads) + " thread(s), GPT " +
                std::to_string(base.model.layers) + " layers d_model " + std::to_string(base.model.d_model) + " T " +
                std::to_string(base.model.seq_len) + ", global batch " + std::to_string(base.train.global_batch) +
                "; profile " + (args.profile.empty() ? std::string("measured in this run") : args.profile) +
                "; measured = median of " + std::to_string(runs) + " runs' median step; ratio = predicted / measured");
  report.columns({"dp", "tp", "pp", "predicted_ms", "measured_ms", "ratio"});

  std::vector<double> predicted, measured;
  for (const Candidate& k : candidates()) {
    Config c = base;
    ParallelOptions& p = c.parallel;
    if (ranks % (k.tp * k.pp) != 0) continue;
    p.dp = ranks / (k.tp * k.pp);
    p.tp = k.tp;
    p.pp = k.pp;
    p.zero = p.dp > 1 ? k.zero : 0;
    p.schedule = k.schedule;
    p.virtual_stages = k.virtual_stages;
    p.recompute = k.recompute;
    p.sequence_parallel = k.sequence_parallel;
    c.train.micro_batch = k.micro_batch;
    try {
      check_layout(c, ranks);
    } catch (const DeckError&) {
      continue;  // a world this layout does not divide
    }
    int wrong = 0;
    const double t = measure(c, threads, runs, steps, wrong);
    const double guess = predict_step_time(c, profile).step_s * 1e3;
    predicted.push_back(guess);
    measured.push_back(t);
    report.row(k.name, {static_cast<double>(p.dp), static_cast<double>(p.tp), static_cast<double>(p.pp), guess, t,
                        guess / t},
               wrong);
  }

  // What "auto" would pick for this deck on this world, run like the others.
  const AdvisorResult advice = advise_layouts(base, ranks, profile, LayoutFreedom{}, 0, threads, 1);
  const RankedLayout& pick = advice.ranked.front();
  int wrong = 0;
  const double pick_ms = measure(pick.config, threads, runs, steps, wrong);
  const ParallelOptions& q = pick.config.parallel;
  report.header("auto picks " + layout_name(pick.config) + " of " + std::to_string(advice.layouts) + " layouts");
  report.row("auto", {static_cast<double>(q.dp), static_cast<double>(q.tp), static_cast<double>(q.pp),
                      pick.time.step_s * 1e3, pick_ms, pick.time.step_s * 1e3 / pick_ms},
             wrong);

  std::vector<double> errors;
  for (size_t i = 0; i < predicted.size(); ++i) errors.push_back(std::fabs(predicted[i] / measured[i] - 1));
  const double fastest = *std::min_element(measured.begin(), measured.end());
  report.columns({"layouts", "value", "target"});
  report.row("spearman", {static_cast<double>(predicted.size()), spearman(predicted, measured), 0.8}, 0);
  report.row("median_abs_error", {static_cast<double>(predicted.size()), median(errors), 0.2}, 0);
  report.row("auto_vs_fastest", {static_cast<double>(predicted.size() + 1), pick_ms / std::min(fastest, pick_ms), 1.1}, 0);
}

}  // namespace meshtrain
