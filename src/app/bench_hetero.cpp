// The `hetero` suite (mpiexec -n 4): one slow rank or stage, and what dividing the work by speed
// (train/work_balance.h) wins back.
//
//   data parallelism: dp 4, rank 3 at half the speed of the others. Even shares against shares
//     from declared speeds, from the start-up probe, and from rebalancing during the run.
//   pipeline parallelism: dp 2 x pp 2, the ranks of stage 1 at half speed. The even partition
//     against partitions from declared speeds and from the probe.
//
// The slowdown is MESHTRAIN_SLOWDOWN's (parallel/slowdown.h): compute padded by sleeping, as a
// slower device would make the host wait. Where the ranks outnumber the node's cores (4 ranks
// on the 2-core development machine) every rank's compute is stretched alike first ("emulated
// devices", factor E): 4 ranks computing at once on 2 cores are bounded by the cores, and no
// division of the work can beat that bound, whereas a cluster's ranks each have a device. The
// slow rank's factor is 2E.
//
// ratio = even step time / balanced step time (the target: dp >= 1.3, pp >= 1.25);
// of_ideal = the ideal step time / the measured one, where the ideal is the same layout with no
// slow rank (measured in this run) stretched by what perfect balance cannot avoid: total work
// over total speed (dp: 4 / 3.5; pp: 2 / 1.5). loss_diff: the largest relative difference of a
// step's loss from the even run's (the trajectory must not change; wrong above 1e-4).

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "meshtrain/app/bench_suites.h"
#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/config/layout_check.h"
#include "meshtrain/parallel/slowdown.h"
#include "meshtrain/train/straggler_report.h"
#include "meshtrain/train/trainer.h"

namespace meshtrain {

namespace {

struct Measured {
  double step_ms = 0;           // median of the measured steps
  std::vector<double> losses;   // every step's
  std::string shares, partition;
};

// Runs `c` for warm-up + `steps` steps with this rank slowed by `factor`; `between` runs after
// every step (rebalancing). The median step time is over the last `steps`.
Measured run_case(Config c, int steps, int warmup, double factor,
                  const std::function<void(Trainer&, const StepResult&)>& between = nullptr) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  check_layout(c, world);
  set_compute_slowdown(factor);
  CpuBackend backend(1);
  ProcessGrid grid(MPI_COMM_WORLD, c.grid_shape(), 600.0);
  Trainer trainer(c, grid, backend);
  Measured m;
  std::vector<double> ms;
  for (int s = 0; s < warmup + steps; ++s) {
    const StepResult r = trainer.train_step(s);
    m.losses.push_back(r.loss);
    if (s >= warmup) ms.push_back(r.seconds * 1e3);
    if (between) between(trainer, r);
  }
  set_compute_slowdown(1.0);
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  m.step_ms = ms[ms.size() / 2];
  m.shares = describe_shares(trainer.work().shares);
  m.partition = describe_partition(trainer.partition());
  return m;
}

int stage_of(const Config& c, int world_rank) {
  return c.grid_shape().coordinates(world_rank)[axis_index(Axis::Pipeline)];
}

double loss_diff(const Measured& a, const Measured& b) {
  double worst = 0;
  for (size_t s = 0; s < std::min(a.losses.size(), b.losses.size()); ++s)
    worst = std::max(worst, std::abs(a.losses[s] - b.losses[s]) / std::abs(b.losses[s]));
  return worst;
}

}  // namespace

void bench_hetero(const BenchArgs& args, BenchReport& report) {
  int ranks = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (ranks != 4) throw std::runtime_error("bench --suite hetero runs on 4 ranks (mpiexec -n 4)");
  // Ranks on this node against its cores: emulate devices where they must share cores.
  const DeviceEmulation devices = device_emulation();
  const int local = devices.ranks_per_node, cores = devices.cores;
  const double emulate = devices.factor;
  // Medians of enough steps on a noisy machine, unless --steps says otherwise.
  const int steps = args.steps_given ? args.steps : 8, warmup = 2;

  report.columns({"slow_factor", "step_ms", "ratio", "of_ideal", "loss_diff"});
  char head[512];
  std::snprintf(head, sizeof head,
                "hetero: 4 ranks, %d per node on %d cores: emulated devices x%.0f, the slow rank(s) "
                "x%.0f; median of %d steps after %d; ratio = even / balanced step time (targets: dp "
                ">= 1.3, pp >= 1.25); of_ideal = ideal / measured (the layout with no slow rank x "
                "total work / total speed; 0 in the reference rows); loss_diff = largest relative loss difference from the "
                "even run (wrong above 1e-4)",
                local, cores, emulate, 2 * emulate, steps, warmup);
  report.header(head);

  // ---- data parallelism: dp 4, rank 3 at half speed ----
  Config dp = bench_deck("hetero", bench_gpt2(args, 4, 128, 4, 128, 256));
  dp.parallel.dp = 4;
  dp.train.micro_batch = 2;
  dp.train.global_batch = 32;  // 16 micro-batches
  const double dp_factor = rank == 3 ? 2 * emulate : emulate;
  const Measured uniform = run_case(dp, steps, warmup, emulate);
  const Measured even = run_case(dp, steps, warmup, dp_factor);
  const double dp_ideal = uniform.step_ms * 4.0 / 3.5;
  report.row("dp4 no slow rank", {emulate, uniform.step_ms, 0, 0, loss_diff(uniform, even)}, 0);
  report.row("dp4 even shares", {2 * emulate, even.step_ms, 1.0, dp_ideal / even.step_ms, 0}, 0);
  auto balanced_row = [&](const std::string& name, const Measured& m, double ideal) {
    const double diff = loss_diff(m, even);
    report.row(name + " [" + m.shares + "]",
               {2 * emulate, m.step_ms, even.step_ms / m.step_ms, ideal / m.step_ms, diff},
               diff > 1e-4 ? 1 : 0);
  };
  Config declared = dp;
  declared.parallel.balance = Balance::Declared;
  declared.parallel.rank_speeds = {1, 1, 1, 0.5};
  balanced_row("dp4 declared speeds", run_case(declared, steps, warmup, dp_factor), dp_ideal);
  Config measured = dp;
  measured.parallel.balance = Balance::Measured;
  balanced_row("dp4 measured (probe)", run_case(measured, steps, warmup, dp_factor), dp_ideal);
  // Rebalancing from even shares, a window every 2 steps as a run logging every 2 steps would;
  // the shares settle in the warm-up, which is longer here.
  Config rebalance = dp;
  rebalance.parallel.rebalance = true;
  std::unique_ptr<StragglerMonitor> monitor;
  const Measured rebalanced = run_case(
      rebalance, steps, 8, dp_factor, [&](Trainer& t, const StepResult& r) {
        if (!monitor) monitor = std::make_unique<StragglerMonitor>(t.grid(), 1.25);
        monitor->add_step(r.compute_seconds, r.seconds);
        if (r.step % 2 == 0 && r.step <= 8) t.rebalance(monitor->close_window(t.grid().world(), r.step));
      });
  monitor.reset();
  balanced_row("dp4 rebalanced", rebalanced, dp_ideal);

  // ---- pipeline parallelism: dp 2 x pp 2, stage 1 at half speed ----
  Config pp = bench_deck("hetero", bench_gpt2(args, 12, 128, 4, 128, 256));
  pp.parallel.dp = 2;
  pp.parallel.pp = 2;
  pp.parallel.schedule = ScheduleKind::OneFOneB;
  pp.train.micro_batch = 1;
  pp.train.global_batch = 16;  // 8 micro-batches per replica
  const int stage = stage_of(pp, rank);
  const double pp_factor = stage == 1 ? 2 * emulate : emulate;
  const Measured pp_uniform = run_case(pp, steps, warmup, emulate);
  const Measured pp_even = run_case(pp, steps, warmup, pp_factor);
  const double pp_ideal = pp_uniform.step_ms * 2.0 / 1.5;
  report.row("pp2 no slow stage " + pp_uniform.partition,
             {emulate, pp_uniform.step_ms, 0, 0, loss_diff(pp_uniform, pp_even)}, 0);
  report.row("pp2 even partition " + pp_even.partition,
             {2 * emulate, pp_even.step_ms, 1.0, pp_ideal / pp_even.step_ms, 0}, 0);
  auto pp_row = [&](const std::string& name, const Measured& m) {
    const double diff = loss_diff(m, pp_even);
    report.row(name + " " + m.partition,
               {2 * emulate, m.step_ms, pp_even.step_ms / m.step_ms, pp_ideal / m.step_ms, diff},
               diff > 1e-4 ? 1 : 0);
  };
  Config pp_declared = pp;
  pp_declared.parallel.balance = Balance::Declared;
  pp_declared.parallel.rank_speeds.assign(4, 1.0);
  for (int r = 0; r < 4; ++r)
    if (stage_of(pp, r) == 1) pp_declared.parallel.rank_speeds[static_cast<size_t>(r)] = 0.5;
  pp_row("pp2 declared speeds", run_case(pp_declared, steps, warmup, pp_factor));
  Config pp_measured = pp;
  pp_measured.parallel.balance = Balance::Measured;
  pp_row("pp2 measured (probe)", run_case(pp_measured, steps, warmup, pp_factor));
}

}  // namespace meshtrain
