// The `pipeline` suite (mpiexec -n P, one rank per pipeline stage): the measured bubble —
// each rank's idle fraction of the pipeline phase, averaged over ranks — of GPipe, 1F1B, ZB-H1
// and ZB-V for several micro-batch counts, next to the theory: (p - 1) / (m + p - 1) (GPipe
// paper, arXiv 1811.06965), ZB-H1's (p - 1) / (3m + p - 1) and ZB-V's bound (p - 1) / (6m + p - 1)
// (arXiv 2401.10241; schedule_simulator.h theoretical_bubble); zb-v both as planned for equal
// costs and re-planned for the second step's measured costs ("zb-v measured",
// zero_bubble_costs.h), side by side, and zb-h1 and zb-v once more on a uniform clock (every
// action padded to one fixed time, "uniform": see below). The first step is not counted. Stages get equal
// work (a balanced partition of identical blocks, a small vocabulary), so the theory applies.
// With more ranks than cores, oversubscribed cores would turn idle time of one rank into compute
// time of another and distort the bubble: every rank then emulates a slower device (its compute
// padded with sleep, parallel/slowdown.h) so that the ranks fit on the cores.
//
// Identical blocks do not make equal stages: the rank holding the embedding and the head (the
// first and the last stage; under ZB-V's V both are on rank 0) computes more, and the other ranks
// wait for it every step — idle time that counts in the mean bubble though no schedule could
// remove it. Two more columns tell them apart: `critical`, the idle fraction of the rank with the
// most compute (what the schedule makes the slowest rank wait: the step cannot be shorter than
// that rank's compute), and `imbalance`, 1 - mean compute / most compute (the partition's part).

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "meshtrain/app/bench_suites.h"
#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/config/layout_check.h"
#include "meshtrain/parallel/schedule_simulator.h"
#include "meshtrain/parallel/slowdown.h"
#include "meshtrain/train/trainer.h"

namespace meshtrain {

void bench_pipeline(const BenchArgs& args, BenchReport& report) {
  int ranks = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  if (ranks < 2) throw std::runtime_error("bench --suite pipeline needs 2 or more ranks (mpiexec -n 2)");
  CpuBackend backend(1);
  const DeviceEmulation devices = device_emulation();
  // Padded to factor x CPU time: the ranks share the cores (slowdown.h, PaddedCompute).
  set_compute_slowdown(devices.factor, PaddingBasis::CpuTime);
  report.columns({"stages", "microbatches", "step_ms", "bubble", "theory", "ratio", "critical", "imbalance", "overruns"});
  const ModelSpec model = bench_gpt2(args, 8 * ranks / 2, 256, 8, 128, 256);
  report.header("pipeline: " + std::to_string(ranks) + " stages, " + std::to_string(model.layers) +
                " blocks of d_model " + std::to_string(model.d_model) + ", micro-batch 2 x " +
                std::to_string(model.seq_len) + " tokens; "
                "ratio = measured / theory (1 is ideal, above 1 means communication or imbalance)" +
                (devices.factor > 1 ? "; " + std::to_string(devices.ranks_per_node) + " ranks on " +
                                          std::to_string(devices.cores) + " cores: compute emulated " +
                                          std::to_string(static_cast<int>(devices.factor)) + "x slower"
                                    : std::string()));
  // zb-v twice: planned for equal costs (the default), and re-planned after the second step for
  // the measured ones ("zb-v measured"; parallel.schedule_costs).
  // The zero-bubble schedules once more on a uniform clock ("uniform"): after the first step,
  // every action is padded to one fixed time, 1.5 x the longest action any rank ran in it
  // (slowdown.h, set_fixed_compute_time). Their plans assume F = I = W; the emulated actions'
  // costs spread by 10-25% (the head's chunk, the ranks' shared cores), and with no slack in
  // the plan every late link of its F and I chains delays the ranks after it. On the uniform
  // clock what remains above theory is the executor's and the transfers' own. `overruns`:
  // actions that took longer than the fixed time (the clock did not hold; 0 expected).
  // With more ranks than cores the unit is `factor` times longer again. On the clock's ticks
  // every rank starts computing at once, and a rank waiting for a transfer waits for a core
  // first: a transfer that takes a CPU time slice rather than its wire time. A link that slow
  // against the unit is no device's, so the unit grows until the bubble stops falling with it
  // (the transfer times and bubbles per unit: docs/benchmarks.md, "Pipeline schedules:
  // zero-bubble").
  struct Variant {
    ScheduleKind kind;
    bool measured_costs;
    bool uniform = false;
  };
  for (const Variant variant : {Variant{ScheduleKind::GPipe, false}, Variant{ScheduleKind::OneFOneB, false},
                                Variant{ScheduleKind::ZeroBubbleH1, false},
                                Variant{ScheduleKind::ZeroBubbleV, false},
                                Variant{ScheduleKind::ZeroBubbleV, true},
                                Variant{ScheduleKind::ZeroBubbleH1, false, true},
                                Variant{ScheduleKind::ZeroBubbleV, false, true}}) {
    const ScheduleKind kind = variant.kind;
    const int v = kind == ScheduleKind::ZeroBubbleV ? 2 : 1;  // zb-v: two chunks per rank
    for (int m : {2, 4, 8, 16}) {
      Config c = bench_deck("pipeline", model);
      c.train.micro_batch = 2;
      c.train.global_batch = 2 * m;
      c.parallel.pp = ranks;
      c.parallel.schedule = kind;
      c.parallel.virtual_stages = v;
      c.parallel.measured_schedule_costs = variant.measured_costs;
      check_layout(c, ranks);
      ProcessGrid grid(MPI_COMM_WORLD, c.grid_shape(), 600.0);
      Trainer trainer(c, grid, backend);
      std::vector<double> bubble, ms, critical, imbalance;
      int wrong = 0;
      const long overruns_before = fixed_compute_overruns();
      for (int s = 0; s <= args.steps; ++s) {
        const StepResult r = trainer.train_step(s);
        if (!std::isfinite(r.loss)) wrong = 1;
        if (s == 0 && variant.uniform) {
          double longest = r.pipeline_longest_action_seconds;
          MPI_Allreduce(MPI_IN_PLACE, &longest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
          set_fixed_compute_time(1.5 * devices.factor * longest);
        }
        if (s == 0) continue;
        bubble.push_back(r.bubble);
        ms.push_back(r.seconds * 1e3);
        double most = r.pipeline_compute_seconds, sum = r.pipeline_compute_seconds;
        MPI_Allreduce(MPI_IN_PLACE, &most, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        MPI_Allreduce(MPI_IN_PLACE, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        // Ties: any of the busiest ranks' idle fractions (the largest).
        double idle = r.pipeline_compute_seconds == most && r.pipeline_seconds > 0
                          ? 1.0 - r.pipeline_compute_seconds / r.pipeline_seconds
                          : -1.0;
        MPI_Allreduce(MPI_IN_PLACE, &idle, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        critical.push_back(idle);
        imbalance.push_back(most > 0 ? 1.0 - sum / ranks / most : 0.0);
      }
      set_fixed_compute_time(0);
      double overruns = static_cast<double>(fixed_compute_overruns() - overruns_before);
      MPI_Allreduce(MPI_IN_PLACE, &overruns, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
      for (std::vector<double>* v : {&bubble, &ms, &critical, &imbalance}) std::sort(v->begin(), v->end());
      const double theory = theoretical_bubble(kind, ranks, m, v);
      const double measured = bubble[bubble.size() / 2];
      report.row(std::string(schedule_name(kind)) +
                     (kind == ScheduleKind::ZeroBubbleV && variant.measured_costs ? " measured" : "") +
                     (variant.uniform ? " uniform" : "") +
                     " m=" + std::to_string(m),
                 {static_cast<double>(ranks), static_cast<double>(m), ms[ms.size() / 2], measured,
                  theory, measured / theory, critical[critical.size() / 2], imbalance[imbalance.size() / 2],
                  overruns},
                 wrong);
    }
  }
  set_compute_slowdown(1.0);
}

}  // namespace meshtrain
